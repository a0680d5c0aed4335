//! A cancel stopped between its steps (a second canceller, a crashed one, a slow one) while
//! another actor runs to the end: the units go back to Redis exactly once, and the buyer's field
//! follows her live order.

use crate::{joined, within, world, GRACE};
use axum::http::StatusCode;
use seckill_shared::infra::pause;
use seckill_shared::protocol::cancel::CancelOutcome;
use seckill_shared::store::view;
use testkit::invariants::verdict;
use testkit::on_every_redis;
use testkit::RedisKind;

on_every_redis!(
    a_late_second_cancel_gives_the_units_back_once,
    a_stale_cancel_resumed_after_another_finished_leaves_the_buyer_free_to_buy,
    a_cancel_never_takes_over_a_crashed_cancellers_entry,
    a_slow_cancel_is_aborted_before_reconcile_drops_its_entry,
);

/// Canceller B read the order as confirmed; canceller A then ran all three steps, the user
/// bought again, and only then B announces its cancel. B must not give the units back again
/// nor take the user out of the set while they hold the newer order.
async fn a_late_second_cancel_gives_the_units_back_once(kind: RedisKind) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let first = w.confirmed("alice", 2).await?;

    let paused = pause::arm("cancel.before_begin", w.id());
    // B read the order as confirmed, before A's cancel.
    let b = w.spawn_cancel(&first);
    within("canceller B reaching its pause", paused.reached()).await?;

    assert_eq!(
        w.cancel(first.id).await?,
        CancelOutcome::Cancelled { quantity: 2 }
    );
    let second = w.confirmed("alice", 1).await?;
    paused.resume();
    let late = joined("canceller B", b).await?;

    assert_eq!(late, CancelOutcome::AlreadyCancelled);
    assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(9));
    assert!(
        w.users().await?.contains("alice"),
        "alice holds {}",
        second.id
    );
    w.assert_conserved().await
}

/// Canceller B read the order as confirmed and stops before announcing its cancel; canceller A
/// runs all three steps. When B goes on, Redis holds nothing for the order: B answers as a
/// repeated cancel and writes nothing, so the user A gave the quota back to is not put back in
/// `users` (where they would be refused as already_purchased) and can buy again.
async fn a_stale_cancel_resumed_after_another_finished_leaves_the_buyer_free_to_buy(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let bought = w.confirmed("alice", 2).await?;

    let paused = pause::arm("cancel.before_begin", w.id());
    let b = w.spawn_cancel(&bought);
    within("canceller B reaching its pause", paused.reached()).await?;
    assert_eq!(
        w.cancel(bought.id).await?,
        CancelOutcome::Cancelled { quantity: 2 }
    );
    paused.resume();
    let late = joined("canceller B", b).await?;

    assert_eq!(late, CancelOutcome::AlreadyCancelled);
    assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(10));
    assert!(
        !w.users().await?.contains("alice"),
        "the late cancel put alice back in users"
    );
    let (status, body) = w.buy("alice", 1).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    w.assert_conserved().await
}

/// A canceller crashed after announcing its cancel. A second cancel of the same order must not
/// adopt that entry: reconcile, seeing it stale, drops it while the second one would still be
/// on its way, and the second one's units would then never reach Redis.
async fn a_cancel_never_takes_over_a_crashed_cancellers_entry(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let bought = w.confirmed("alice", 1).await?;

    // Canceller A announces, then dies before its database step.
    let crash = pause::arm("cancel.after_begin", w.id());
    let a = w.spawn_cancel(&bought);
    within("canceller A announcing", crash.reached()).await?;
    a.abort();
    let _ = a.await;
    drop(crash);

    // Canceller B stops after its own announcement; reconcile then runs past the grace.
    let paused = pause::arm("cancel.after_begin", w.id());
    let b = w.spawn_cancel(&bought);
    within("canceller B announcing", paused.reached()).await?;
    w.reconcile().run(testkit::after_grace(GRACE)).await?;
    paused.resume();
    let outcome = within("canceller B", b).await?;
    w.assert_conserved().await?;

    // Whatever B answered, a cancel now completes and gives the unit back exactly once.
    if matches!(outcome, Ok(Ok(CancelOutcome::Busy))) {
        assert_eq!(
            w.cancel(bought.id).await?,
            CancelOutcome::Cancelled { quantity: 1 }
        );
    }
    assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(10));
    w.assert_conserved().await
}

/// Canceller A announced `c|A` and is on its way to the database (slow: a stalled connection,
/// a wait on the hot activity row, a paused process) when reconcile, past the grace period,
/// finds the row not cancelled. Were it to drop `c|A` as "never committed", A's commit would
/// give the unit to the database but never to Redis, and alice would stay in the set holding
/// nothing. Reconcile aborts A in the database first: A's commit is refused, and a retried
/// cancel goes through both.
async fn a_slow_cancel_is_aborted_before_reconcile_drops_its_entry(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let bought = w.confirmed("alice", 1).await?;

    let paused = pause::arm("cancel.after_begin", w.id());
    let a = w.spawn_cancel(&bought);
    within("canceller A announcing", paused.reached()).await?;
    let report = w.reconcile().run(testkit::after_grace(GRACE)).await?;
    let r = report.activity(w.id()).expect("reconciled");
    assert_eq!(
        r.settled, 1,
        "reconcile dropped A's entry as never committed"
    );
    paused.resume();
    // Reconcile aborted A before dropping its entry: A's commit is refused, nothing changed.
    let late = joined("canceller A", a).await?;
    let mut broken = w.violations().await?;
    if late != CancelOutcome::Busy {
        broken.push(format!("the aborted attempt answered {late:?}"));
    }
    // Retried, the cancel goes through and alice may buy again.
    let retried = w.cancel(bought.id).await?;
    if retried != (CancelOutcome::Cancelled { quantity: 1 }) {
        broken.push(format!("the retried cancel answered {retried:?}"));
    }
    broken.extend(w.violations().await?);
    let (status, body) = w.buy("alice", 1).await;
    if status != StatusCode::ACCEPTED {
        broken.push(format!(
            "alice cancelled her only order and is refused: {status} {body}"
        ));
    }
    broken.extend(w.drift_under_traffic().await?);
    verdict(broken)
}
