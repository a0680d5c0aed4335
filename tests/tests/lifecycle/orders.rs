//! The buyer's order: paid once (paying again is idempotent), a paid order not cancellable, a pay
//! after a cancel refused, someone else's order not found, the status from none to paid, and the
//! lookup by the buyer's index.

use crate::world;
use axum::http::StatusCode;
use seckill_shared::domain::order;
use seckill_shared::domain::purchase::{Attempt, MessageKind, OrderMessage};
use seckill_shared::domain::status::{FailureReason, OrderStatus};
use seckill_shared::store::ledger;
use serde_json::Value;
use testkit::on_every_redis;
use testkit::RedisKind;
use testkit::TestEnv;
use uuid::Uuid;

on_every_redis!(
    owner_pays_once_and_paying_again_is_idempotent,
    a_paid_order_cannot_be_cancelled,
    pay_after_cancel_is_refused,
    someone_elses_order_is_not_found_and_stays_untouched,
    my_order_follows_a_purchase_from_none_to_paid,
);

async fn owner_pays_once_and_paying_again_is_idempotent(kind: RedisKind) -> anyhow::Result<()> {
    let w = world(kind, 10).await;
    let id = w.confirmed("alice", 1).await;

    let (status, body) = w.pay(id, "mallory").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let (status, body) = w.pay(987_654_321, "alice").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    assert_eq!(
        w.status(id).await,
        OrderStatus::Confirmed,
        "others cannot pay it"
    );

    // Starting the payment pays nothing: only the provider's event does.
    let (status, started) = w.start_pay(id, "alice").await;
    assert_eq!(status, StatusCode::OK, "{started}");
    assert_eq!(
        (started["status"].as_str(), started["amountMinor"].as_i64()),
        (Some("requires_payment"), Some(w.activity.price_minor))
    );
    let (_, again) = w.start_pay(id, "alice").await;
    assert_eq!(
        again["paymentId"], started["paymentId"],
        "one payment per order"
    );
    assert_eq!(
        w.status(id).await,
        OrderStatus::Confirmed,
        "a buyer's say-so pays nothing"
    );

    let (status, first) = w.pay(id, "alice").await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(
        (first["outcome"].as_str(), first["replayed"].as_bool()),
        (Some("paid"), Some(false))
    );
    let paid_at = order::get(&w.env.pool, id).await?.unwrap().paid_at;
    let (status, second) = w.pay(id, "alice").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        second["outcome"], "already_paid",
        "a second payment event pays nothing more"
    );
    assert_eq!(order::get(&w.env.pool, id).await?.unwrap().paid_at, paid_at);
    let (_, after) = w.start_pay(id, "alice").await;
    assert_eq!(
        (after["status"].as_str(), &after["paymentId"]),
        (Some("succeeded"), &started["paymentId"])
    );
    assert_eq!(w.me("alice").await["status"], "paid");
    Ok(())
}

async fn a_paid_order_cannot_be_cancelled(kind: RedisKind) -> anyhow::Result<()> {
    let w = world(kind, 10).await;
    let id = w.confirmed("alice", 2).await;
    assert_eq!(w.pay(id, "alice").await.0, StatusCode::OK);

    let (status, body) = w.cancel(id, "alice").await;

    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("conflict"))
    );
    assert_eq!(w.status(id).await, OrderStatus::Paid);
    assert_eq!((w.db_stock().await, w.redis().await.stock), (8, Some(8)));
    assert!(
        w.redis().await.ledger.is_empty(),
        "the cancel announcement was dropped"
    );
    Ok(())
}

async fn pay_after_cancel_is_refused(kind: RedisKind) -> anyhow::Result<()> {
    let w = world(kind, 10).await;
    let id = w.confirmed("alice", 1).await;
    assert_eq!(w.cancel(id, "alice").await.0, StatusCode::OK);

    let (status, body) = w.pay(id, "alice").await;

    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("conflict"))
    );
    assert_eq!(w.status(id).await, OrderStatus::Cancelled);
    Ok(())
}

async fn someone_elses_order_is_not_found_and_stays_untouched(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await;
    let id = w.confirmed("alice", 2).await;

    let (status, body) = w.cancel(id, "mallory").await;

    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    assert_eq!(w.status(id).await, OrderStatus::Confirmed);
    assert_eq!((w.db_stock().await, w.redis().await.stock), (8, Some(8)));
    let (status, _) = w.cancel(987_654_321, "alice").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    Ok(())
}

async fn my_order_follows_a_purchase_from_none_to_paid(kind: RedisKind) -> anyhow::Result<()> {
    let w = world(kind, 10).await;
    assert_eq!(w.me("alice").await, serde_json::json!({"status": "none"}));

    let request_id = w.reserve("alice", 2).await;
    let me = w.me("alice").await;
    assert_eq!(me["status"], "pending");
    assert_eq!(me["requestId"], request_id.to_string());

    let id = w.commit("alice", 2, request_id).await;
    ledger::settle(
        &w.env.redis,
        w.activity.id,
        "alice",
        &request_id.to_string(),
    )
    .await?;
    // The reservation was made as another container makes it: this container's first "none"
    // may be answered from its memory for a second (docs/invariants.md, the status read).
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let me = w.me("alice").await;
    assert_eq!(
        (
            me["status"].as_str(),
            me["orderId"].as_i64(),
            me["quantity"].as_i64()
        ),
        (Some("confirmed"), Some(id), Some(2))
    );
    assert!(me.get("reason").is_none());

    assert_eq!(w.pay(id, "alice").await.0, StatusCode::OK);
    assert_eq!(w.me("alice").await["status"], "paid");

    // A request the database refused shows as failed, with its reason.
    let refused = OrderMessage {
        attempt: Attempt {
            request_id: Uuid::new_v4(),
            activity_id: w.activity.id,
            user_id: "bob".into(),
            quantity: 1,
            buckets: 1,
        },
        reserved_at_ms: 0,
        load_epoch: None,
        kind: MessageKind::Order,
    };
    assert!(order::insert_failed(&w.env.pool, &refused.attempt, FailureReason::SoldOut).await?);
    let me = w.me("bob").await;
    assert_eq!(
        (me["status"].as_str(), me["reason"].as_str()),
        (Some("failed"), Some("sold_out"))
    );
    Ok(())
}

/// The production statement of `order::latest_for_user`, as the compiler checked it: read from
/// the offline query data in `.sqlx/`, so the plan below is the plan of the shipped query.
fn latest_for_user_statement() -> anyhow::Result<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.sqlx");
    for entry in std::fs::read_dir(&dir)? {
        let data: Value = serde_json::from_str(&std::fs::read_to_string(entry?.path())?)?;
        let query = data["query"].as_str().unwrap_or_default();
        if query.contains("from orders where activity_id = $1 and user_id = $2")
            && query.contains("order by order_is_live(status) desc")
        {
            return Ok(query.to_string());
        }
    }
    anyhow::bail!(
        "order::latest_for_user's statement is not in {}",
        dir.display()
    )
}

#[tokio::test]
async fn a_buyers_order_lookup_reads_the_buyer_index_not_every_order_of_the_sale(
) -> anyhow::Result<()> {
    // Arrange: a sale with many orders of other buyers (failed requests of a sold-out crowd).
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let a = env.open_activity(10, 1).await?;
    sqlx::query(
        "insert into orders (request_id, activity_id, user_id, quantity, status, failure_reason)
         select gen_random_uuid(), $1, 'crowd-' || g, 1, 'failed', 'sold_out'
         from generate_series(1, 20000) g",
    )
    .bind(a.id)
    .execute(&env.pool)
    .await?;
    sqlx::query("analyze orders").execute(&env.pool).await?;

    // Act: the planner's plan for the buyer's lookup.
    let explain = format!("explain (format json) {}", latest_for_user_statement()?);
    let (plan,): (Value,) = sqlx::query_as(sqlx::AssertSqlSafe(explain))
        .bind(a.id)
        .bind("crowd-77")
        .fetch_one(&env.pool)
        .await?;

    // Assert: it goes through the (activity, buyer) index, not the sale's orders.
    let plan = plan.to_string();
    assert!(plan.contains("orders_by_buyer"), "{plan}");
    assert!(!plan.contains("Seq Scan"), "{plan}");
    Ok(())
}
