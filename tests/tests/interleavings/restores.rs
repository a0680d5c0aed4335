//! A lost field in `users` restored from the buyer's live order, paused at each of its steps while
//! a cancel of the order, the buyer's new purchase or a reload of the sale runs.

use crate::{joined, within, world};
use anyhow::Context as _;
use chrono::Utc;
use seckill_shared::domain::order;
use seckill_shared::domain::status::FailureReason;
use seckill_shared::infra::pause;
use seckill_shared::protocol::cancel::CancelOutcome;
use seckill_shared::protocol::consume::Decision;
use seckill_shared::store::view;
use testkit::on_every_redis;
use testkit::RedisKind;

on_every_redis!(
    restoring_a_lost_field_never_races_a_cancel_of_the_order,
    restoring_a_lost_field_never_races_the_buyers_new_purchase,
    restoring_a_lost_field_never_races_a_reload_of_the_sale,
);

/// Where reconcile's restore of a lost field stops in [`restore_race`]: after its read of the
/// live orders, before its mark; and after the database's read that follows the mark, before
/// it writes the field.
const RESTORE_POINTS: &[&str] = &[
    "reconcile.fields.before_mark",
    "reconcile.fields.before_restore",
];

/// What runs while reconcile's restore of alice's lost field is paused.
#[derive(Clone, Copy, Debug)]
enum Rival {
    /// Alice cancels the order whose field Redis lost.
    Cancel,
    /// Alice buys again (Redis no longer refuses her) and the consumer decides the purchase.
    Purchase,
    /// Redis loses the sale and preheat loads it again (a new load epoch).
    Reload,
}

/// Alice's confirmed order's field is lost; reconcile's restore stops at `point`, `rival` runs
/// to the end, the restore goes on. Never two live orders for one user, every unit in one
/// place (none given back twice, Redis never above what the database has), and afterwards a
/// cancel of whatever alice holds completes and gives its units back once.
async fn restore_race(kind: RedisKind, point: &'static str, rival: Rival) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let bought = w.confirmed("alice", 2).await?;
    anyhow::ensure!(testkit::lose_field(&w.env.redis, w.id(), "alice").await?);

    let paused = pause::arm(point, w.id());
    let reconcile = w.reconcile();
    let run = tokio::spawn(async move { reconcile.run(Utc::now()).await });
    within("reconcile's restore", paused.reached()).await?;
    match rival {
        Rival::Cancel => assert_eq!(
            w.cancel(bought.id).await?,
            CancelOutcome::Cancelled { quantity: 2 }
        ),
        Rival::Purchase => {
            let again = w.pending("alice", 1).await?;
            let done = w.consumer().handle_message(&again).await?;
            assert_eq!(
                done.decision,
                Decision::Failed(FailureReason::AlreadyPurchased),
                "{done:?}"
            );
        }
        Rival::Reload => {
            w.unload().await?;
            w.preheat().run(Utc::now()).await?;
        }
    }
    paused.resume();
    let report = joined("reconcile", run).await?;
    assert!(report.errors.is_empty(), "{report:?}");

    let tally = order::tally(&w.env.pool, w.id()).await?;
    assert_eq!(tally.users_with_two_live, 0, "{tally:?}");
    w.assert_conserved().await?;
    if let Rival::Cancel = rival {
        assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(10));
        assert!(
            !w.users().await?.contains("alice"),
            "{:?}",
            w.users().await?
        );
    } else {
        assert_eq!(tally.live, 1, "{tally:?}");
        assert_eq!(
            w.cancel(bought.id).await?,
            CancelOutcome::Cancelled { quantity: 2 }
        );
        assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(10));
    }
    assert_eq!(w.db_row().await?.remaining_stock, 10);
    // Alice holds nothing now and may buy, once.
    w.pending("alice", 1).await?;
    let (status, body) = w.buy("alice", 1).await;
    assert_eq!(body["error"], "already_purchased", "{status} {body}");
    w.assert_conserved().await
}

/// Reconcile restores alice's lost field while she cancels the order: the cancel restores the
/// field itself and completes; reconcile's write finds its mark gone (the cancel replaced it)
/// or, marking after the cancel, reads no live order. No field comes back for a cancelled
/// order, and the units come back once.
async fn restoring_a_lost_field_never_races_a_cancel_of_the_order(
    kind: RedisKind,
) -> anyhow::Result<()> {
    for point in RESTORE_POINTS {
        restore_race(kind, point, Rival::Cancel)
            .await
            .with_context(|| format!("paused at {point}"))?;
    }
    Ok(())
}

/// Reconcile restores alice's lost field while she buys again: Redis accepts her (it lost the
/// field that refused her), the database refuses a second live order, and the purchase's
/// reservation replaced reconcile's mark, so the restore writes nothing over it.
async fn restoring_a_lost_field_never_races_the_buyers_new_purchase(
    kind: RedisKind,
) -> anyhow::Result<()> {
    for point in RESTORE_POINTS {
        restore_race(kind, point, Rival::Purchase)
            .await
            .with_context(|| format!("paused at {point}"))?;
    }
    Ok(())
}

/// Reconcile restores alice's lost field while Redis loses the sale and it is loaded again
/// with `users` rebuilt from the live orders: the load empties the ledger (the mark goes), so
/// the restore writes nothing into the reloaded sale.
async fn restoring_a_lost_field_never_races_a_reload_of_the_sale(
    kind: RedisKind,
) -> anyhow::Result<()> {
    for point in RESTORE_POINTS {
        restore_race(kind, point, Rival::Reload)
            .await
            .with_context(|| format!("paused at {point}"))?;
    }
    Ok(())
}
