//! A purchase between its reservation and its order: a send whose reply is lost, a reply lost to a
//! timeout, a Redis stall, a late consumer against reconcile's give-back, a second delivery. A 503
//! means nothing was sold; a 202 ends in one fate.

use crate::{joined, within, world, World, GRACE};
use axum::http::StatusCode;
use chrono::Utc;
use seckill_shared::domain::status::OrderStatus;
use seckill_shared::infra::pause;
use seckill_shared::protocol::cancel::CancelOutcome;
use seckill_shared::protocol::consume::Decision;
use seckill_shared::store::ledger;
use seckill_shared::store::view;
use std::time::Duration;
use testkit::call;
use testkit::on_every_redis;
use testkit::request;
use testkit::PrivateRedis;
use testkit::RedisKind;

on_every_redis!(
    a_send_that_times_out_after_storing_sells_nothing,
    a_send_that_times_out_after_the_consumer_committed_answers_202,
    reconcile_giving_back_a_late_reservation_beats_the_late_consumer,
    a_second_delivery_cannot_commit_what_the_first_gave_back,
    a_purchase_reply_lost_to_a_timeout_is_given_back_at_once,
);

/// The queue stored the message but the send timed out; the consumer passed every check before
/// the entry gave the reservation back. The caller is told 503: nothing may be sold.
async fn a_send_that_times_out_after_storing_sells_nothing(kind: RedisKind) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let _lost = pause::arm_failure("queue.send.lost_reply", w.id(), 1);
    let entry_paused = pause::arm("entry.after_send_error", w.id());
    let app = w.app.clone();
    let path = format!("/activities/{}/orders", w.id());
    let entry =
        tokio::spawn(
            async move { call(&app, request("POST", &path, Some(("alice", "")), None)).await },
        );
    within("the entry's send", entry_paused.reached()).await?;

    let message = w.messages().await?.pop().expect("the stored message");
    let consumer_paused = pause::arm("consumer.before_write", w.id());
    let consumer = w.consumer();
    let m = message.clone();
    let consumer = tokio::spawn(async move { consumer.handle_message(&m).await });
    within("the consumer's checks", consumer_paused.reached()).await?;

    entry_paused.resume();
    let (status, body) = within("the entry", entry).await??;
    consumer_paused.resume();
    joined("the consumer", consumer).await?;

    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let row = w.order_of(message.attempt.request_id).await?;
    assert!(
        row.as_ref().is_none_or(|o| o.status == OrderStatus::Failed),
        "the caller was told nothing was sold, yet {row:?}"
    );
    w.assert_conserved().await
}

/// The other order of the same race: the consumer committed before the entry learnt that its
/// send timed out. The database holds the order, so the caller gets 202, not a false 503.
async fn a_send_that_times_out_after_the_consumer_committed_answers_202(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let _lost = pause::arm_failure("queue.send.lost_reply", w.id(), 1);
    let entry_paused = pause::arm("entry.after_send_error", w.id());
    let app = w.app.clone();
    let path = format!("/activities/{}/orders", w.id());
    let entry =
        tokio::spawn(
            async move { call(&app, request("POST", &path, Some(("alice", "")), None)).await },
        );
    within("the entry's send", entry_paused.reached()).await?;
    let message = w.messages().await?.pop().expect("the stored message");
    w.consumer().handle_message(&message).await?;
    entry_paused.resume();
    let (status, body) = within("the entry", entry).await??;

    let row = w.order_of(message.attempt.request_id).await?;
    let sold = row
        .as_ref()
        .is_some_and(|o| o.status == OrderStatus::Confirmed);
    let answered = if sold {
        StatusCode::ACCEPTED
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    assert_eq!(status, answered, "{body} with {row:?}");
    assert!(sold, "the consumer ran first: {row:?}");
    w.assert_conserved().await
}

/// Reconcile gives a reservation back after the grace period while its (late) message sits
/// in a consumer that already passed its checks. Only one of the two may win.
async fn reconcile_giving_back_a_late_reservation_beats_the_late_consumer(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let (status, _) = w.buy("alice", 2).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let message = w.messages().await?.pop().expect("the message");

    let paused = pause::arm("consumer.before_write", w.id());
    let consumer = w.consumer();
    let m = message.clone();
    let late = tokio::spawn(async move { consumer.handle_message(&m).await });
    within("the consumer's checks", paused.reached()).await?;
    let report = w.reconcile().run(testkit::after_grace(GRACE)).await?;
    paused.resume();
    let processed = joined("the consumer", late).await?;

    let row = w.order_of(message.attempt.request_id).await?;
    let given_back = report.activity(w.id()).map_or(0, |r| r.compensated);
    assert!(
        (given_back == 1)
            != row
                .as_ref()
                .is_some_and(|o| o.status == OrderStatus::Confirmed),
        "reconcile gave back {given_back} and the consumer made {processed:?} / {row:?}"
    );
    w.assert_conserved().await
}

/// Delivery 2 passed its checks; delivery 1 hit sold-out in the database and gave the units
/// back; a cancel then freed database stock; delivery 2 goes on. It must not commit.
async fn a_second_delivery_cannot_commit_what_the_first_gave_back(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let bob = w.confirmed("bob", 1).await?;
    let (status, _) = w.buy("alice", 1).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let message = w.messages().await?.pop().expect("alice's message");
    // The database has no stock left for alice (as after an admin lower in between).
    testkit::set_db_stock_by_hand(&w.env, w.id(), 0).await;

    let second_paused = pause::arm("consumer.before_write", w.id());
    let consumer = w.consumer();
    let m = message.clone();
    let second = tokio::spawn(async move { consumer.handle_message(&m).await });
    within("delivery 2's checks", second_paused.reached()).await?;

    let first_paused = pause::arm("consumer.after_give_back", w.id());
    let consumer = w.consumer();
    let m = message.clone();
    let first = tokio::spawn(async move { consumer.handle_message(&m).await });
    within("delivery 1's give-back", first_paused.reached()).await?;

    assert_eq!(
        w.cancel(bob.id).await?,
        CancelOutcome::Cancelled { quantity: 1 }
    );
    second_paused.resume();
    joined("delivery 2", second).await?;
    first_paused.resume();
    joined("delivery 1", first).await?;

    let row = w.order_of(message.attempt.request_id).await?;
    assert_eq!(row.map(|o| o.status), Some(OrderStatus::Failed));
    assert_eq!(
        view::stock(&w.env.redis, w.id()).await?,
        Some(10),
        "alice's unit and bob's back"
    );
    // The database's own stock was forced above; reconcile's database check restores it.
    w.reconcile().run(Utc::now()).await?;
    w.assert_conserved().await
}

/// The script ran but its reply did not arrive in time: the caller is told 503, so the
/// reservation must be given back now, through the database's claim, not after the grace.
async fn a_purchase_reply_lost_to_a_timeout_is_given_back_at_once(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let _lost = pause::arm_failure("entry.purchase.reply_lost", w.id(), 1);
    let (status, body) = w.buy("alice", 2).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(10));
    assert!(w.messages().await?.is_empty(), "nothing was sent");
    w.assert_conserved().await?;
    let (status, body) = w.buy("alice", 2).await;
    assert_eq!(
        status,
        StatusCode::ACCEPTED,
        "a retry is a fresh purchase: {body}"
    );
    Ok(())
}

/// Redis stalls (SIGSTOP) while buyers click; each gets a fast 503. Their scripts sit in
/// Redis's input buffer and run when it resumes: they must not leave reservations behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_stall_leaves_no_phantom_reservation() -> anyhow::Result<()> {
    let private = PrivateRedis::start().await;
    let env = private
        .env(Duration::from_millis(300), Duration::from_secs(1))
        .await;
    let activity = env.open_activity(100, 1).await?;
    let w = World::new(env, activity);
    // A refused purchase loads the script, as the first clicks of a sale do.
    let (_, body) = w.buy("warm-up", 2).await;
    assert_eq!(body["error"], "quantity_exceeds_limit");

    private.signal("-STOP");
    let clicks = futures::future::join_all((0..40).map(|i| {
        let w = &w;
        async move { w.buy(&format!("u{i}"), 1).await.0 }
    }))
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    private.signal("-CONT");
    tokio::time::sleep(Duration::from_millis(500)).await;

    assert!(
        clicks.iter().all(|s| *s == StatusCode::SERVICE_UNAVAILABLE),
        "{clicks:?}"
    );
    let snap = ledger::snapshot(&w.env.redis, w.id()).await?;
    assert_eq!(snap.stock, Some(100), "{snap:?}");
    assert!(
        snap.ledger.is_empty(),
        "phantom reservations: {:?}",
        snap.ledger
    );
    assert_eq!(snap.participants, 0);

    // Told to retry, they can: once the breaker closes, a retry is accepted.
    let mut accepted = false;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if w.buy("u0", 1).await.0 == StatusCode::ACCEPTED {
            accepted = true;
            break;
        }
    }
    assert!(accepted, "u0 was told to retry and must be able to");
    Ok(())
}

/// The send times out after storing; the consumer commits; the entry's give-back finds the
/// live row (`Claim::Decided`) and `giveback::apply` drops the ledger entry with `settle.lua`.
/// That Redis call may fail (Redis slow or away for a moment: the same trouble that made the
/// send time out); the answer must still follow the row: 202, never 503 with an order behind
/// it. Standalone only: Redis is paused with SIGSTOP.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_send_error_after_the_consumer_committed_never_answers_503() -> anyhow::Result<()> {
    let private = PrivateRedis::start().await;
    let mut env = private
        .env(Duration::from_millis(300), Duration::from_secs(1))
        .await;
    env.config.reconcile_grace = GRACE;
    let activity = env.open_activity(10, 5).await?;
    let w = World::new(env, activity);

    let _lost = pause::arm_failure("queue.send.lost_reply", w.id(), 1);
    let entry_paused = pause::arm("entry.after_send_error", w.id());
    let app = w.app.clone();
    let path = format!("/activities/{}/orders", w.id());
    let entry =
        tokio::spawn(
            async move { call(&app, request("POST", &path, Some(("alice", "")), None)).await },
        );
    within("the entry's send", entry_paused.reached()).await?;
    let message = w.messages().await?.pop().expect("the stored message");
    let done = w.consumer().handle_message(&message).await?;
    assert_eq!(done.decision, Decision::Committed);

    // Redis stops answering for a moment, just as the entry applies the row it found.
    private.signal("-STOP");
    entry_paused.resume();
    let answer = within("the entry", entry).await;
    private.signal("-CONT");
    let (status, body) = answer??;

    let row = w.order_of(message.attempt.request_id).await?;
    let sold = row
        .as_ref()
        .is_some_and(|o| o.status == OrderStatus::Confirmed);
    assert!(sold, "the consumer committed: {row:?}");
    assert_ne!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "alice was told 503 ({body}) yet holds confirmed order {row:?}"
    );
    Ok(())
}
