//! A payment racing a cancel or the timeout: a payment after either is owed back and brings no
//! unit back, one landing inside a cancel wins, and a cancel waits for a locked payment.

use crate::{amount, world};
use axum::http::StatusCode;
use chrono::Utc;
use seckill_shared::domain::order;
use seckill_shared::domain::payment;
use seckill_shared::domain::status::OrderStatus;
use seckill_shared::infra::pause;
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol::cancel::{self, CancelOutcome};
use std::time::Duration;
use testkit::snapshot;
use testkit::{self, call, request};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_after_a_cancel_or_the_timeout_is_owed_back_and_brings_no_unit_back(
) -> anyhow::Result<()> {
    let w = world().await;
    let cancelled = w.confirmed("alice", 1).await;
    let (_, started) = w.start_pay(cancelled, "alice").await;
    let path = format!("/orders/{cancelled}/cancel");
    let (status, _) = call(&w.app, request("POST", &path, Some(("alice", "")), None)).await;
    assert_eq!(status, StatusCode::OK);
    let stocks = w.stocks().await;

    let (status, answer) = w
        .deliver(w.event("evt_late", &started, amount(&started)))
        .await;

    assert_eq!(
        (status, answer["outcome"].as_str()),
        (StatusCode::OK, Some("refund_due")),
        "{answer}"
    );
    assert_eq!(w.status(cancelled).await, OrderStatus::Cancelled);
    assert_eq!(w.stocks().await, stocks, "no unit moves");

    // Past the payment timeout the order is being released: its payment is owed back too,
    // and a new start is refused.
    let expired = w.confirmed("bob", 1).await;
    let (_, started) = w.start_pay(expired, "bob").await;
    let timeout = w.env.config.payment_timeout.as_secs_f64();
    sqlx::query!(
        "update orders set created_at = created_at - make_interval(secs => $2) where id = $1",
        expired,
        timeout
    )
    .execute(&w.env.pool)
    .await?;
    let (status, answer) = w
        .deliver(w.event("evt_expired", &started, amount(&started)))
        .await;
    assert_eq!(
        (status, answer["outcome"].as_str()),
        (StatusCode::OK, Some("refund_due")),
        "{answer}"
    );
    assert_eq!(
        w.status(expired).await,
        OrderStatus::Confirmed,
        "the release takes it back, not the event"
    );
    let (status, _) = w.start_pay(expired, "bob").await;
    assert_eq!(status, StatusCode::CONFLICT);

    let due = payment::refunds_due(&w.env.pool, 10).await?;
    let mut owed: Vec<i64> = due.iter().map(|(_, order, _, _)| *order).collect();
    owed.sort();
    assert_eq!(owed, vec![cancelled, expired]);
    Ok(())
}

/// A cancel (the owner's, or the payment timeout's) announced in Redis, paused before its
/// database step, while the payment's event arrives and pays: the cancel then finds the order
/// paid, gives nothing back and withdraws its announcement.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_landing_inside_a_cancel_wins_and_the_cancel_gives_nothing_back(
) -> anyhow::Result<()> {
    let w = world().await;
    let id = w.confirmed("alice", 2).await;
    let (_, started) = w.start_pay(id, "alice").await;
    let stocks = w.stocks().await;
    let order = order::get(&w.env.pool, id).await?.unwrap();

    let paused = pause::arm("cancel.after_begin", w.activity.id);
    let ((pool, redis), o) = (w.env.login(Function::Entry), order.clone());
    let canceller =
        tokio::spawn(async move { cancel::cancel_order(&pool, &redis, &o, Utc::now()).await });
    tokio::time::timeout(Duration::from_secs(30), paused.reached()).await?;
    let (status, answer) = w
        .deliver(w.event("evt_inside", &started, amount(&started)))
        .await;
    assert_eq!(
        (status, answer["outcome"].as_str()),
        (StatusCode::OK, Some("paid")),
        "{answer}"
    );
    paused.resume();
    let outcome = canceller.await??;

    assert!(
        matches!(outcome, CancelOutcome::NotCancellable(OrderStatus::Paid)),
        "{outcome:?}"
    );
    assert_eq!(w.status(id).await, OrderStatus::Paid);
    assert_eq!(w.stocks().await, stocks, "no unit came back");
    let snap = snapshot(&w.env, w.activity.id).await;
    assert!(
        snap.ledger.is_empty(),
        "the cancel's announcement is withdrawn: {snap:?}"
    );
    assert_eq!(snap.participants, 1, "alice keeps her quota");
    Ok(())
}

/// The event holds the order's row lock, paused before it decides, while a cancel runs: the
/// cancel's database step waits for the lock, then finds the order paid.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_racing_a_locked_payment_waits_and_gives_nothing_back() -> anyhow::Result<()> {
    let w = world().await;
    let id = w.confirmed("alice", 1).await;
    let (_, started) = w.start_pay(id, "alice").await;
    let stocks = w.stocks().await;
    let order = order::get(&w.env.pool, id).await?.unwrap();

    let paused = pause::arm("pay.settle_locked", w.activity.id);
    let event = w.event("evt_locked", &started, amount(&started));
    let app = w.app.clone();
    let webhook = tokio::spawn(async move { call(&app, event).await });
    tokio::time::timeout(Duration::from_secs(30), paused.reached()).await?;
    let (pool, redis) = w.env.login(Function::Entry);
    let canceller =
        tokio::spawn(async move { cancel::cancel_order(&pool, &redis, &order, Utc::now()).await });
    wait_for_a_lock_wait(&w.env.pool).await?;
    paused.resume();
    let (status, answer) = webhook.await?;
    let outcome = canceller.await??;

    assert_eq!(
        (status, answer["outcome"].as_str()),
        (StatusCode::OK, Some("paid")),
        "{answer}"
    );
    assert!(
        matches!(outcome, CancelOutcome::NotCancellable(_)),
        "{outcome:?}"
    );
    assert_eq!(w.status(id).await, OrderStatus::Paid);
    assert_eq!(w.stocks().await, stocks);
    assert!(snapshot(&w.env, w.activity.id).await.ledger.is_empty());
    Ok(())
}

/// Until a session of this database waits for a row lock (the cancel's update behind the
/// paused event's lock).
async fn wait_for_a_lock_wait(pool: &sqlx::PgPool) -> anyhow::Result<()> {
    for _ in 0..300 {
        let waiting: i64 = sqlx::query_scalar!(
            r#"select count(*) as "n!" from pg_stat_activity
               where datname = current_database() and wait_event_type = 'Lock'"#
        )
        .fetch_one(pool)
        .await?;
        if waiting > 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    anyhow::bail!("no session waited for the order's lock")
}

/// A payment whose event waits for the order's row while a cancel's transaction holds it, and
/// finds it cancelled once that commits: `refund_due` at once, not an error the provider has to
/// retry (the order is read after the lock is held, not from before the wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_waiting_on_a_cancels_lock_reads_the_cancel_and_is_owed_back(
) -> anyhow::Result<()> {
    let w = world().await;
    let id = w.confirmed("alice", 1).await;
    let (_, started) = w.start_pay(id, "alice").await;
    // A cancel's transaction, by hand: the row updated, its lock held, not yet committed.
    let mut cancel = w.env.pool.begin().await?;
    sqlx::query("update orders set status = 'cancelled', cancelled_at = now() where id = $1")
        .bind(id)
        .execute(&mut *cancel)
        .await?;

    let app = w.app.clone();
    let event = w.event("evt_behind_a_cancel", &started, amount(&started));
    let webhook = tokio::spawn(async move { call(&app, event).await });
    wait_for_a_lock_wait(&w.env.pool).await?;
    cancel.commit().await?;
    let (status, answer) = webhook.await?;

    assert_eq!(
        (status, answer["outcome"].as_str()),
        (StatusCode::OK, Some("refund_due")),
        "{answer}"
    );
    assert_eq!(w.status(id).await, OrderStatus::Cancelled);
    Ok(())
}
