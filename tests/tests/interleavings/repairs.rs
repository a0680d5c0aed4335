//! Reconcile's repairs against the actors they race: the stock fix never erases a move it did not
//! see nor undoes an admin's lower, and the orphan check never drops a buyer nor lets one buy
//! twice.

use crate::{joined, within, world};
use chrono::Utc;
use seckill_shared::domain::settings::ActivityPatch;
use seckill_shared::infra::pause;
use seckill_shared::protocol::cancel::CancelOutcome;
use seckill_shared::protocol::consume::Decision;
use seckill_shared::protocol::lock;
use seckill_shared::store::view;
use sqlx::Connection;
use std::time::Duration;
use testkit::invariants::verdict;
use testkit::on_every_redis;
use testkit::RedisKind;

on_every_redis!(
    stock_correction_skips_a_stock_that_moved_and_came_back,
    orphan_cleanup_never_drops_a_user_who_bought_again_meanwhile,
    the_stock_fix_never_undoes_an_admin_lower_whose_lease_ran_out,
    an_orphan_check_never_lets_a_user_buy_twice,
);

/// Reconcile read Redis, then the database; between its reads and its write a purchase and a
/// cancel moved the stock away and back. Comparing the stock value would erase the cancel.
async fn stock_correction_skips_a_stock_that_moved_and_came_back(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let bob = w.confirmed("bob", 1).await?;
    // Drift: Redis one unit above the database, so reconcile wants to correct it.
    w.set_stock(10).await?;

    let read = pause::arm("reconcile.stock.after_snapshot", w.id());
    let write = pause::arm("reconcile.stock.before_fix", w.id());
    let reconcile = w.reconcile();
    let run = tokio::spawn(async move { reconcile.run(Utc::now()).await });
    within("reconcile's Redis read", read.reached()).await?;
    w.confirmed("alice", 1).await?;
    read.resume();
    within("reconcile's database read", write.reached()).await?;
    assert_eq!(
        w.cancel(bob.id).await?,
        CancelOutcome::Cancelled { quantity: 1 }
    );
    write.resume();
    joined("reconcile", run).await?;

    let stock = view::stock(&w.env.redis, w.id()).await?.unwrap_or(-1);
    let remaining = w.db_row().await?.remaining_stock;
    assert!(
        stock == 10 || stock == remaining,
        "redis stock {stock}: neither left alone (10) nor the database's {remaining}"
    );
    // The next quiet run corrects it.
    w.reconcile().run(Utc::now()).await?;
    assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(remaining));
    Ok(())
}

/// Reconcile found alice in the set with no ledger entry; she then cancelled (and left the
/// set), the database check saw no live order, she bought again and the consumer settled.
/// Dropping her now would let her buy a second time.
async fn orphan_cleanup_never_drops_a_user_who_bought_again_meanwhile(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let first = w.confirmed("alice", 1).await?;

    let checking = pause::arm("reconcile.orphans.before_db_check", w.id());
    let dropping = pause::arm("reconcile.orphans.before_drop", w.id());
    let reconcile = w.reconcile();
    let run = tokio::spawn(async move { reconcile.run(Utc::now()).await });
    within("reconcile's scan", checking.reached()).await?;
    assert_eq!(
        w.cancel(first.id).await?,
        CancelOutcome::Cancelled { quantity: 1 }
    );
    checking.resume();
    within("reconcile's database check", dropping.reached()).await?;
    w.confirmed("alice", 1).await?;
    dropping.resume();
    joined("reconcile", run).await?;

    assert!(w.users().await?.contains("alice"));
    let (status, body) = w.buy("alice", 1).await;
    assert_eq!(body["error"], "already_purchased", "{status} {body}");
    w.assert_conserved().await
}

/// Admin A lowers the stock 10 -> 5: fence + row lock, `adjust.lua` (Redis 5), then the row
/// update and COMMIT. Between the adjust and the commit A's lease runs out (A paused, or its
/// renewals lost while the COMMIT is already on the wire), and reconcile's stock fix takes the
/// free lock. Were it to read the remaining stock unfenced (10, A's lower not committed) and
/// A's COMMIT to land after, Redis would offer 10 units for the database's 5. The fix reads in
/// the transaction that records its token: it waits on A's row and reads the lower.
async fn the_stock_fix_never_undoes_an_admin_lower_whose_lease_ran_out(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let id = w.id();

    // Hold A between adjust.lua and its commit.
    sqlx::query(
        "create function hold_total_stock_update() returns trigger language plpgsql as $$
         begin perform pg_advisory_xact_lock(4242); return new; end $$",
    )
    .execute(&w.env.pool)
    .await?;
    sqlx::query(
        "create trigger hold_total_stock_update before update of total_stock on activities for each row
         when (old.total_stock is distinct from new.total_stock) execute function hold_total_stock_update()",
    )
    .execute(&w.env.pool)
    .await?;
    let mut holder = sqlx::PgConnection::connect(w.env.config.database_url.expose()).await?;
    sqlx::query("select pg_advisory_lock(4242)")
        .execute(&mut holder)
        .await?;

    // Reconcile gets past its database check, then waits before its stock step.
    let fixing = pause::arm("reconcile.stock.before_lock", id);
    let reconcile = w.reconcile();
    let run = tokio::spawn(async move { reconcile.run(Utc::now()).await });
    within("reconcile's stock step", fixing.reached()).await?;

    let mut guard = lock::acquire(
        &w.env.redis,
        &w.env.pool,
        id,
        w.env.config.lock_ttl,
        w.env.config.lock_wait,
    )
    .await?;
    guard.stop_watchdog();
    let state = w.admin();
    let lower = tokio::spawn(async move {
        let patch = ActivityPatch {
            total_stock: Some(5),
            ..ActivityPatch::default()
        };
        let out = admin::update_with_guard(&state, &guard, &patch).await;
        drop(guard);
        out
    });
    within("A's adjust", async {
        while view::stock(&w.env.redis, id).await.ok().flatten() != Some(5) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await?;
    // A's lease runs out.
    let lock_key = w.env.redis.keys(id).lock;
    let _: i64 = w.env.redis.cmd(redis::cmd("DEL").arg(&lock_key)).await?;

    // Reconcile's stock step, from its cheap look on, while A holds the row: its fenced read
    // waits for A's transaction, and reads what A committed.
    fixing.resume();
    tokio::time::sleep(Duration::from_millis(300)).await;

    // A's commit goes through.
    sqlx::query("select pg_advisory_unlock(4242)")
        .execute(&mut holder)
        .await?;
    let updated = joined("A's lower", lower).await;
    let report = joined("reconcile", run).await?;

    let mut broken = Vec::new();
    let row = w.db_row().await?;
    let stock = view::stock(&w.env.redis, id).await?;
    if stock != Some(row.remaining_stock) {
        broken.push(format!(
            "redis {stock:?} vs database {} after {:?} (A answered {updated:?})",
            row.remaining_stock,
            report.activity(id).map(|r| r.stock_check)
        ));
    }
    broken.extend(w.violations().await?);
    verdict(broken)
}

/// Reconcile's orphan check marks the users it found with no ledger entry, reads the database,
/// then drops those with no live order while the mark is still its own. The purchase reads
/// only `users`: while the check looks, alice (an order) and ghost (a field with nothing behind
/// it) are refused; alice cancels before the database read (which then finds no order of
/// hers) and buys again before the drop: her reservation must keep her field, or she could
/// buy a second time. Ghost is dropped and then buys exactly once.
async fn an_orphan_check_never_lets_a_user_buy_twice(kind: RedisKind) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let first = w.confirmed("alice", 1).await?;
    w.orphan("ghost").await?;

    let checking = pause::arm("reconcile.orphans.before_db_check", w.id());
    let dropping = pause::arm("reconcile.orphans.before_drop", w.id());
    let reconcile = w.reconcile();
    let run = tokio::spawn(async move { reconcile.run(Utc::now()).await });
    within("reconcile's marks", checking.reached()).await?;
    for user in ["alice", "ghost"] {
        let (status, body) = w.buy(user, 1).await;
        assert_eq!(
            body["error"], "already_purchased",
            "{user} marked: {status} {body}"
        );
    }
    assert_eq!(
        w.cancel(first.id).await?,
        CancelOutcome::Cancelled { quantity: 1 }
    );
    checking.resume();
    within("reconcile's database check", dropping.reached()).await?;
    let again = w.pending("alice", 1).await?;
    let (status, body) = w.buy("ghost", 1).await;
    assert_eq!(body["error"], "already_purchased", "ghost: {status} {body}");
    dropping.resume();
    joined("reconcile", run).await?;

    let users = w.users().await?;
    assert!(
        users.contains("alice") && !users.contains("ghost"),
        "{users:?}"
    );
    let (status, body) = w.buy("alice", 1).await;
    assert_eq!(body["error"], "already_purchased", "alice: {status} {body}");
    let done = w.consumer().handle_message(&again).await?;
    assert_eq!(done.decision, Decision::Committed, "{done:?}");
    w.confirmed("ghost", 1).await?;
    let (status, body) = w.buy("ghost", 1).await;
    assert_eq!(body["error"], "already_purchased", "ghost: {status} {body}");
    w.assert_conserved().await
}
