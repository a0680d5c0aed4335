//! A payment racing a cancel or the timeout: a payment after a cancel is owed back and brings no
//! unit back, one made in time pays however late its event, one landing inside a cancel wins, a
//! cancel waits for a locked payment, and a payment opened inside a cancel keeps the order.

use crate::{amount, world};
use axum::http::StatusCode;
use chrono::Utc;
use seckill_shared::domain::order;
use seckill_shared::domain::payment;
use seckill_shared::domain::status::{OrderStatus, PaymentStatus};
use seckill_shared::infra::pause;
use seckill_shared::infra::payments::LocalProvider;
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol::cancel::{self, CancelOutcome, Canceller};
use seckill_shared::protocol::pay;
use std::time::Duration;
use testkit::snapshot;
use testkit::{self, call, request};

/// A payment event after its order's cancel (the local provider completed a payment the cancel
/// had closed) is owed back and brings no unit back; one made in time whose event arrives past
/// the payment timeout, before the release, pays the order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_after_a_cancel_is_owed_back_and_a_late_event_of_one_in_time_pays(
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

    // Paid on time, its event late: past the payment timeout, the order not released yet,
    // the event pays it (the release would have closed the payment at the provider first). A
    // new start is refused.
    let late = w.confirmed("bob", 1).await;
    let (_, started) = w.start_pay(late, "bob").await;
    let timeout = w.env.config.payment_timeout.as_secs_f64();
    sqlx::query!(
        "update orders set created_at = created_at - make_interval(secs => $2) where id = $1",
        late,
        timeout
    )
    .execute(&w.env.pool)
    .await?;
    let (status, _) = w.start_pay(late, "bob").await;
    assert_eq!(status, StatusCode::CONFLICT, "no start past the timeout");
    let stocks = w.stocks().await;
    let (status, answer) = w
        .deliver(w.event("evt_late_arrival", &started, amount(&started)))
        .await;
    assert_eq!(
        (status, answer["outcome"].as_str()),
        (StatusCode::OK, Some("paid")),
        "{answer}"
    );
    assert_eq!(w.status(late).await, OrderStatus::Paid);
    assert_eq!(w.stocks().await, stocks, "no unit moves");

    let due = payment::refunds_due(&w.env.pool, 10).await?;
    let owed: Vec<i64> = due.iter().map(|(_, order, _, _)| *order).collect();
    assert_eq!(owed, vec![cancelled]);
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

/// A cancel closes the order's payment (none yet) and pauses after announcing itself; its owner
/// presses Pay meanwhile and a payment opens. The cancel's database step refuses while a
/// payment is open: nothing changes, the announcement is withdrawn, and the next cancel closes
/// the payment first and cancels. (Checked before the lock, a cancel would release the unit of
/// an order whose payment the buyer can still complete.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_opened_inside_a_cancel_keeps_the_order_until_it_is_closed() -> anyhow::Result<()>
{
    let w = world().await;
    let id = w.confirmed("alice", 1).await;
    let stocks = w.stocks().await;
    let order = order::get(&w.env.pool, id).await?.unwrap();
    let paused = pause::arm("cancel.after_begin", w.activity.id);
    let ((pool, redis), o) = (w.env.login(Function::Entry), order.clone());
    let canceller = tokio::spawn(async move {
        let local = LocalProvider;
        let by = Canceller::Owner;
        pay::cancel_unpaid(&pool, &redis, Some(&local), &o, Utc::now(), by).await
    });
    tokio::time::timeout(Duration::from_secs(30), paused.reached()).await?;
    let (status, started) = w.start_pay(id, "alice").await;
    assert_eq!(status, StatusCode::OK, "{started}");
    paused.resume();

    assert_eq!(canceller.await??, CancelOutcome::Busy);
    assert_eq!(w.status(id).await, OrderStatus::Confirmed);
    assert_eq!(w.stocks().await, stocks, "no unit came back");
    let snap = snapshot(&w.env, w.activity.id).await;
    assert!(snap.ledger.is_empty(), "announcement withdrawn: {snap:?}");

    let (pool, redis) = w.env.login(Function::Entry);
    let by = Canceller::Owner;
    let again = pay::cancel_unpaid(&pool, &redis, Some(&LocalProvider), &order, Utc::now(), by);
    assert_eq!(again.await?, CancelOutcome::Cancelled { quantity: 1 });
    let p = payment::of_order(&w.env.pool, id).await?.unwrap();
    assert_eq!(p.status, PaymentStatus::Cancelled);
    let (status, _) = w.start_pay(id, "alice").await;
    assert_eq!(status, StatusCode::CONFLICT);
    Ok(())
}
