//! Money owed back is refunded through the provider, exactly once per payment, against
//! localstripe: reconcile claims each payment owed back, refunds it with one idempotency key per
//! payment and records the provider's refund id; concurrent runs refund once; a provider that
//! refuses leaves the error for the operator and, after five attempts, the payment `failed`.

use crate::closing::{age, buyer_pays, started, stripe_at, LOCALSTRIPE};
use crate::{world, World};
use axum::http::StatusCode;
use chrono::{Duration as ChronoDuration, Utc};
use seckill_shared::domain::payment;
use seckill_shared::domain::status::OrderStatus;
use serde_json::Value;
use testkit::{self, call};

/// A payment owed back: the buyer paid at localstripe for an order that was cancelled anyway (a
/// provider that answered its cancel wrongly: the test records the cancel by hand), and the
/// payment's event, arriving after, recorded `refund_due`. Answers the order and its intent.
async fn owed_back(w: &World, user: &str) -> (i64, String) {
    let (app, id, pi) = started(w, user, 1).await;
    buyer_pays(&pi).await.expect("paid at the provider");
    sqlx::query!(
        "update payments set status = 'cancelled' where order_id = $1",
        id
    )
    .execute(&w.env.pool)
    .await
    .unwrap();
    let (pool, redis) = w.env.login(seckill_shared::infra::shape::Function::Entry);
    let order = seckill_shared::domain::order::get(&pool, id)
        .await
        .unwrap()
        .unwrap();
    let cancelled =
        seckill_shared::protocol::cancel::cancel_order(&pool, &redis, &order, Utc::now());
    assert!(matches!(
        cancelled.await.unwrap(),
        seckill_shared::protocol::cancel::CancelOutcome::Cancelled { .. }
    ));
    let p = payment::of_order(&w.env.pool, id).await.unwrap().unwrap();
    let started = serde_json::json!({
        "orderId": id, "paymentId": pi, "currency": p.currency, "amountMinor": p.amount_minor,
    });
    let event = testkit::provider_event(
        &w.secret(),
        &format!("evt_owed_{id}"),
        &started,
        p.amount_minor,
        Utc::now().timestamp(),
    );
    let (status, answer) = call(&app, event).await;
    assert_eq!(
        (status, answer["outcome"].as_str()),
        (StatusCode::OK, Some("refund_due")),
        "{answer}"
    );
    assert_eq!(w.status(id).await, OrderStatus::Cancelled);
    (id, pi)
}

/// The refunds localstripe holds for `pi`.
async fn refunds_at_provider(pi: &str) -> Vec<Value> {
    let list: Value = reqwest::Client::new()
        .get(format!("{LOCALSTRIPE}/v1/refunds?payment_intent={pi}"))
        .basic_auth("sk_test_reader", Some(""))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    list["data"].as_array().cloned().unwrap_or_default()
}

/// What the payments row says of its refund.
async fn refund_row(w: &World, id: i64) -> (Option<String>, Option<String>, i32, Option<String>) {
    let r = sqlx::query!(
        "select refund_state, refund_id, refund_attempts, refund_error from payments
         where order_id = $1",
        id
    )
    .fetch_one(&w.env.pool)
    .await
    .unwrap();
    (
        r.refund_state,
        r.refund_id,
        r.refund_attempts,
        r.refund_error,
    )
}

/// Two reconcile runs at once (as the dev server's schedule and an operator's invoke might):
/// the payment owed back is refunded once, for its whole amount, and recorded with the
/// provider's refund id; the event that owed it is marked refunded. A later run asks nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_owed_back_is_refunded_once_under_concurrent_runs() -> anyhow::Result<()> {
    let w = world().await;
    let (id, pi) = owed_back(&w, "alice").await;
    let run = || async {
        let job = w
            .env
            .reconcile_with(|c| stripe_at(&mut c.config, LOCALSTRIPE));
        let mut report = reconcile::ReconcileReport::default();
        job.refund_owed(Utc::now(), &mut report).await;
        report
    };

    let (a, b) = tokio::join!(run(), run());

    assert!(a.errors.is_empty() && b.errors.is_empty(), "{a:?} {b:?}");
    assert_eq!(a.refunded + b.refunded, 1);
    let at_provider = refunds_at_provider(&pi).await;
    assert_eq!(at_provider.len(), 1, "{at_provider:?}");
    let p = payment::of_order(&w.env.pool, id).await?.unwrap();
    assert_eq!(at_provider[0]["amount"].as_i64(), Some(p.amount_minor));
    let (state, refund_id, attempts, _) = refund_row(&w, id).await;
    assert_eq!(state.as_deref(), Some("refunded"));
    assert_eq!(refund_id.as_deref(), at_provider[0]["id"].as_str());
    assert_eq!(attempts, 1);
    assert!(payment::refunds_due(&w.env.pool, 10).await?.is_empty());

    let mut later = reconcile::ReconcileReport::default();
    let job = w
        .env
        .reconcile_with(|c| stripe_at(&mut c.config, LOCALSTRIPE));
    job.refund_owed(Utc::now() + ChronoDuration::minutes(5), &mut later)
        .await;
    assert_eq!(later.refunded, 0);
    assert_eq!(refunds_at_provider(&pi).await.len(), 1);
    Ok(())
}

/// The provider out of reach: each run's attempt is counted and its error kept, the next
/// attempt waits out the claim's lease, and the fifth refused attempt leaves the payment
/// `failed` for the operator; nothing is refunded twice once the provider answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_refunds_are_retried_then_left_failed_for_the_operator() -> anyhow::Result<()> {
    let w = world().await;
    let (id, pi) = owed_back(&w, "alice").await;
    let dead = w
        .env
        .reconcile_with(|c| stripe_at(&mut c.config, "http://127.0.0.1:1"));
    let mut at = Utc::now();
    let mut report = reconcile::ReconcileReport::default();
    dead.refund_owed(at, &mut report).await;
    assert_eq!(report.errors.len(), 1, "{report:?}");
    let (state, _, attempts, error) = refund_row(&w, id).await;
    assert_eq!((state.as_deref(), attempts), (Some("refunding"), 1));
    assert!(error.is_some_and(|e| e.contains("unreachable")));

    // Within the lease, no run asks again.
    let mut report = reconcile::ReconcileReport::default();
    dead.refund_owed(at + ChronoDuration::seconds(30), &mut report)
        .await;
    assert_eq!(refund_row(&w, id).await.2, 1);
    for _ in 0..4 {
        at += ChronoDuration::seconds(61);
        let mut report = reconcile::ReconcileReport::default();
        dead.refund_owed(at, &mut report).await;
    }
    let (state, _, attempts, _) = refund_row(&w, id).await;
    assert_eq!((state.as_deref(), attempts), (Some("failed"), 5));

    let live = w
        .env
        .reconcile_with(|c| stripe_at(&mut c.config, LOCALSTRIPE));
    let mut report = reconcile::ReconcileReport::default();
    live.refund_owed(at + ChronoDuration::minutes(5), &mut report)
        .await;
    assert_eq!(report.refunded, 0, "a failed refund waits for the operator");
    assert!(refunds_at_provider(&pi).await.is_empty());
    Ok(())
}

/// A payment the buyer made for an order still held (its event not here yet) is neither
/// released nor refunded by reconcile: only payments owed back are refunded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_for_a_held_order_is_not_refunded() -> anyhow::Result<()> {
    let w = world().await;
    let (_, id, pi) = started(&w, "alice", 1).await;
    buyer_pays(&pi).await.expect("paid");
    age(&w, id).await;
    let job = w
        .env
        .reconcile_with(|c| stripe_at(&mut c.config, LOCALSTRIPE));
    let mut report = reconcile::ReconcileReport::default();
    job.release_unpaid(Utc::now() + ChronoDuration::seconds(1), &mut report)
        .await;
    job.refund_owed(Utc::now(), &mut report).await;
    assert_eq!(w.status(id).await, OrderStatus::Confirmed);
    assert_eq!(report.refunded, 0);
    assert!(refunds_at_provider(&pi).await.is_empty());
    Ok(())
}
