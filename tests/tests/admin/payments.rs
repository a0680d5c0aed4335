//! `GET /admin/ops`'s payments section, through the admin's router on its own database role:
//! the counts of refunds and disputes, and the payments a human has to look at (refunds
//! failed, disputes, refunds owed for long), newest change first; a refund owed for a moment is
//! reconcile's, not listed. The payments are moved to each state by the statements reconcile
//! and the webhook run, on the owner's pool, at the times the test gives them.

use crate::{setup, ADMIN};
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use seckill_shared::domain::payment;
use serde_json::Value;
use testkit::{call, consume, request, reserve, RedisKind, TestEnv};

const PRICE: i64 = 1999;

/// A confirmed order of `user` in sale `activity_id` with its payment started at the local
/// provider. Answers the order id.
async fn paid_order(env: &TestEnv, activity_id: i64, user: &str) -> i64 {
    let rid = reserve(env, activity_id, user, 1).await.attempt.request_id;
    let id = consume(env, activity_id, user, rid, 1).await.unwrap();
    let payment_id = format!("pi_ops_{id}");
    let opened = payment::open(&env.pool, id, "local", &payment_id, PRICE, "usd").await;
    assert!(opened.unwrap().is_some(), "order {id} takes a payment");
    id
}

/// Marks the order's payment owed back at `at`.
async fn owed(env: &TestEnv, id: i64, at: DateTime<Utc>) {
    let mut conn = env.pool.acquire().await.unwrap();
    payment::mark_refund_due(&mut conn, id, at).await.unwrap();
}

/// Reconcile's claim of the one payment owed back at `at`, refused with `error`; `failed` when
/// this was the last of `max_attempts`.
async fn refused(env: &TestEnv, id: i64, at: DateTime<Utc>, error: &str, max_attempts: i32) {
    let lease = ChronoDuration::seconds(60);
    let claims = payment::claim_refunds(&env.pool, "local", at, lease, 10)
        .await
        .unwrap();
    assert_eq!(claims.iter().map(|c| c.order_id).collect::<Vec<_>>(), [id]);
    payment::refund_refused(&env.pool, id, error, max_attempts)
        .await
        .unwrap();
}

/// The order ids of the flagged payments, in the answer's order.
fn flagged_ids(ops: &Value) -> Vec<i64> {
    ops["payments"]["flagged"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["orderId"].as_i64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_sees_failed_refunds_disputes_and_refunds_owed_for_long() -> anyhow::Result<()>
{
    let (env, state) = setup(RedisKind::Standalone, 2000, 500).await;
    let app = admin::router(state);
    let sale = env.open_activity(10, 1).await?.id;
    let now = Utc::now();
    let ago = |minutes: i64| now - ChronoDuration::minutes(minutes);
    let mut orders = Vec::new();
    for user in ["f", "s", "l", "n", "r", "o", "d", "p"] {
        orders.push(paid_order(&env, sale, user).await);
    }
    let [failed, stuck, owed_long, owed_now, refunded, old_refund, disputed, plain]: [i64; 8] =
        orders.try_into().unwrap();
    // Refused once with one attempt allowed: failed for good.
    owed(&env, failed, ago(20)).await;
    refused(&env, failed, ago(15), "card_declined", 1).await;
    // Claimed two hours ago, refused, and no run since.
    owed(&env, stuck, ago(180)).await;
    refused(&env, stuck, ago(120), "no answer", 5).await;
    owed(&env, owed_long, ago(60)).await;
    owed(&env, owed_now, now).await;
    // Refunded within the day, then disputed; and a refund of two days ago.
    owed(&env, refunded, ago(120)).await;
    let mut conn = env.pool.acquire().await?;
    payment::mark_refunded(&mut conn, refunded, Some("re_today"), ago(50)).await?;
    payment::mark_disputed(&mut conn, refunded, ago(45)).await?;
    owed(&env, old_refund, ago(3 * 24 * 60)).await;
    payment::mark_refunded(&mut conn, old_refund, Some("re_old"), ago(2 * 24 * 60)).await?;
    payment::mark_disputed(&mut conn, disputed, ago(30)).await?;
    drop(conn);

    let (status, ops) = call(&app, request("GET", "/admin/ops", Some(ADMIN), None)).await;

    assert_eq!(status, 200, "{ops}");
    let counts = &ops["payments"]["counts"];
    assert_eq!(
        [
            &counts["refundsDue"],
            &counts["refundsRefunding"],
            &counts["refundsFailed"],
            &counts["refundedRecently"],
            &counts["disputed"],
        ],
        [2, 1, 1, 1, 2],
        "{counts}"
    );
    let oldest: DateTime<Utc> = serde_json::from_value(counts["oldestOwedAt"].clone())?;
    assert!((oldest - ago(120)).num_milliseconds().abs() < 1, "{counts}");
    // Newest change first; the refund owed for a moment, the old refund and the plain payment
    // are not there.
    assert_eq!(
        flagged_ids(&ops),
        [failed, disputed, refunded, owed_long, stuck],
        "{ops}"
    );
    assert!(![owed_now, old_refund, plain]
        .iter()
        .any(|id| flagged_ids(&ops).contains(id)));
    let rows = ops["payments"]["flagged"].as_array().unwrap();
    assert_eq!(rows[0]["activityId"], sale);
    assert_eq!(rows[0]["providerPaymentId"], format!("pi_ops_{failed}"));
    assert_eq!(rows[0]["amountMinor"], PRICE);
    assert_eq!(rows[0]["currency"], "usd");
    assert_eq!(rows[0]["refundState"], "failed");
    assert_eq!(rows[0]["refundAttempts"], 1);
    assert_eq!(rows[0]["refundError"], "card_declined");
    assert_eq!(rows[1]["refundState"], Value::Null);
    assert!(rows[1]["disputedAt"].is_string(), "{}", rows[1]);
    assert_eq!(rows[2]["refundState"], "refunded");
    assert_eq!(rows[2]["refundId"], "re_today");
    assert_eq!(rows[4]["refundState"], "refunding");
    assert_eq!(rows[4]["refundError"], "no answer");
    assert_eq!(
        ops["payments"]["owedForSecs"],
        admin::ops::OWED_FOR.as_secs()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_payment_to_look_at_the_section_is_empty() -> anyhow::Result<()> {
    let (env, state) = setup(RedisKind::Standalone, 2000, 500).await;
    let app = admin::router(state);
    let sale = env.open_activity(10, 1).await?.id;
    paid_order(&env, sale, "alice").await;

    let (status, ops) = call(&app, request("GET", "/admin/ops", Some(ADMIN), None)).await;

    assert_eq!(status, 200, "{ops}");
    assert_eq!(flagged_ids(&ops), Vec::<i64>::new());
    let counts = &ops["payments"]["counts"];
    assert_eq!(counts["refundsDue"], 0, "{counts}");
    assert_eq!(counts["disputed"], 0, "{counts}");
    assert_eq!(counts["oldestOwedAt"], Value::Null, "{counts}");
    Ok(())
}
