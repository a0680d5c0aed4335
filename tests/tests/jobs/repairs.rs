//! Reconcile's repairs of the drift a crash leaves: a stale reservation given back after the grace
//! period only, a reservation whose order exists dropped, an orphan user removed, the Redis stock
//! corrected only when the ledger is quiet, stale cancels finished or dropped, a lost field
//! restored; and the numbers it records.

use crate::{env, GRACE};
use chrono::Utc;
use reconcile::StockCheck;
use seckill_shared::domain::activity;
use seckill_shared::domain::order;
use seckill_shared::domain::status::OrderStatus;
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol;
use seckill_shared::protocol::cancel::CancelOutcome;
use seckill_shared::store;
use seckill_shared::store::cancel::CancelAttempt;
use seckill_shared::store::cancel::CancelBegin;
use seckill_shared::store::ledger;
use seckill_shared::store::purchase;
use seckill_shared::Refusal;
use testkit::on_every_redis;
use testkit::RedisKind;
use testkit::{
    after_grace, commit_order, consume, db_remaining, is_participant, redis_stock, reserve,
    set_db_stock_by_hand, snapshot,
};
use uuid::Uuid;

on_every_redis!(
    stale_reservation_is_given_back_after_the_grace_period_only,
    reservation_whose_order_exists_is_dropped_without_stock_change,
    user_in_the_set_with_nothing_behind_it_is_removed,
    redis_stock_off_by_n_is_corrected_only_when_the_ledger_is_quiet,
    stale_cancel_entries_are_finished_or_dropped_by_what_the_database_says,
    a_field_redis_lost_after_the_order_confirmed_is_restored_by_reconcile,
    activity_stats_row_holds_the_numbers,
);

async fn stale_reservation_is_given_back_after_the_grace_period_only(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = env(kind).await?;
    let a = env.open_activity(10, 5).await?;
    let job = env.reconcile();
    // The script ran; the order message was never sent.
    reserve(&env, a.id, "alice", 2).await;

    let early = job.run(Utc::now()).await?;
    let r = early.activity(a.id).expect("checked");
    assert_eq!((r.compensated, r.pending_qty, r.drift), (0, 2, 0));
    assert_eq!(r.stock_check, StockCheck::LedgerBusy);
    assert_eq!(redis_stock(&env, a.id).await, Some(8));
    assert!(is_participant(&env, a.id, "alice").await);

    let late = job.run(after_grace(GRACE)).await?;
    let r = late.activity(a.id).expect("checked");
    assert_eq!(r.compensated, 1);
    assert_eq!((r.redis_stock, r.pending_qty, r.drift), (Some(10), 0, 0));
    assert_eq!(redis_stock(&env, a.id).await, Some(10));
    assert!(!is_participant(&env, a.id, "alice").await);
    assert!(ledger::entry(&env.redis, a.id, "alice").await?.is_none());

    // Exactly once: another pass gives nothing back again.
    let again = job.run(after_grace(GRACE)).await?;
    assert_eq!(again.activity(a.id).unwrap().repairs, 0);
    assert_eq!(redis_stock(&env, a.id).await, Some(10));
    // And the user may buy again.
    reserve(&env, a.id, "alice", 1).await;
    Ok(())
}

async fn reservation_whose_order_exists_is_dropped_without_stock_change(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = env(kind).await?;
    let a = env.open_activity(10, 5).await?;
    let rid = reserve(&env, a.id, "alice", 3).await.attempt.request_id;
    // The consumer committed and crashed before dropping the ledger entry.
    commit_order(&env, a.id, "alice", rid, 3).await?;

    let report = env.reconcile().run(after_grace(GRACE)).await?;

    let r = report.activity(a.id).expect("checked");
    assert_eq!((r.settled, r.compensated), (1, 0));
    assert_eq!(
        (r.sold, r.db_remaining, r.pending_qty, r.drift),
        (3, 7, 0, 0)
    );
    assert_eq!(redis_stock(&env, a.id).await, Some(7));
    assert!(is_participant(&env, a.id, "alice").await);
    assert!(ledger::entry(&env.redis, a.id, "alice").await?.is_none());
    Ok(())
}

async fn user_in_the_set_with_nothing_behind_it_is_removed(kind: RedisKind) -> anyhow::Result<()> {
    let env = env(kind).await?;
    let a = env.open_activity(10, 5).await?;
    let rid = reserve(&env, a.id, "buyer", 1).await.attempt.request_id;
    consume(&env, a.id, "buyer", rid, 1).await?;
    reserve(&env, a.id, "pending", 1).await;
    let k = env.redis.keys(a.id);
    let _: i64 = env
        .redis
        .cmd(
            redis::cmd("HSET")
                .arg(&k.users)
                .arg("ghost")
                .arg(Uuid::new_v4().to_string()),
        )
        .await?;

    let report = env.reconcile().run(Utc::now()).await?;

    assert_eq!(report.activity(a.id).unwrap().users_dropped, 1);
    assert!(!is_participant(&env, a.id, "ghost").await);
    assert!(is_participant(&env, a.id, "buyer").await, "holds an order");
    assert!(
        is_participant(&env, a.id, "pending").await,
        "holds a reservation"
    );
    assert_eq!(report.activity(a.id).unwrap().participants, 2);
    Ok(())
}

async fn redis_stock_off_by_n_is_corrected_only_when_the_ledger_is_quiet(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = env(kind).await?;
    let a = env.open_activity(10, 5).await?;
    let rid = reserve(&env, a.id, "alice", 2).await.attempt.request_id;
    consume(&env, a.id, "alice", rid, 2).await?;
    let job = env.reconcile();
    let k = env.redis.keys(a.id);
    let set_stock = |n: i64| {
        let (conn, key) = (env.redis.clone(), k.meta.clone());
        async move {
            conn.cmd::<i64>(redis::cmd("HSET").arg(key).arg("stock").arg(n))
                .await
        }
    };

    // Too low by 3 (units leaked), ledger quiet.
    set_stock(5).await?;
    let r = job.run(Utc::now()).await?;
    assert_eq!(
        r.activity(a.id).unwrap().stock_check,
        StockCheck::Corrected {
            from: Some(5),
            to: 8
        }
    );
    assert_eq!(redis_stock(&env, a.id).await, Some(8));

    // Too high by 4 (would oversell in Redis), ledger quiet.
    set_stock(12).await?;
    job.run(Utc::now()).await?;
    assert_eq!(redis_stock(&env, a.id).await, Some(8));

    // Off while a reservation is in flight: left alone, since Redis legitimately differs.
    set_stock(6).await?;
    reserve(&env, a.id, "bob", 1).await;
    let r = job.run(Utc::now()).await?;
    assert_eq!(
        r.activity(a.id).unwrap().stock_check,
        StockCheck::LedgerBusy
    );
    assert_eq!(r.activity(a.id).unwrap().drift, -2);
    assert_eq!(redis_stock(&env, a.id).await, Some(5));

    // Once the reservation is gone (given back after the grace period), it is corrected.
    let r = job.run(after_grace(GRACE)).await?;
    let r = r.activity(a.id).unwrap();
    assert_eq!(r.compensated, 1);
    assert_eq!(
        r.stock_check,
        StockCheck::Corrected {
            from: Some(6),
            to: 8
        }
    );
    assert_eq!((r.redis_stock, r.drift), (Some(8), 0));

    // A lost stock field with the rest of the meta still there is restored, and the meta
    // keeps the sale's expiry.
    let _: i64 = env
        .redis
        .cmd(redis::cmd("HDEL").arg(&k.meta).arg("stock"))
        .await?;
    job.run(Utc::now()).await?;
    assert_eq!(redis_stock(&env, a.id).await, Some(8));
    let at: i64 = env
        .redis
        .cmd(redis::cmd("PEXPIRETIME").arg(&k.meta))
        .await?;
    assert_eq!(at, a.expire_at(env.config.expiry_buffer).timestamp_millis());

    // The database drifted from its own orders: fixed first, then Redis follows.
    set_db_stock_by_hand(&env, a.id, 9).await;
    let r = job.run(Utc::now()).await?;
    assert_eq!(r.activity(a.id).unwrap().db_stock_fixed_from, Some(9));
    assert_eq!(db_remaining(&env, a.id).await, 8);
    assert_eq!(redis_stock(&env, a.id).await, Some(8));
    Ok(())
}

async fn stale_cancel_entries_are_finished_or_dropped_by_what_the_database_says(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = env(kind).await?;
    let a = env.open_activity(10, 5).await?;
    let now_ms = Utc::now().timestamp_millis();
    // alice's cancel committed in the database, then the process died before cancel_finish.
    let rid = reserve(&env, a.id, "alice", 2).await.attempt.request_id;
    let alice_order = consume(&env, a.id, "alice", rid, 2).await?;
    let alice_cancel = Uuid::now_v7();
    let attempt = CancelAttempt {
        activity_id: a.id,
        user_id: "alice",
        order_id: alice_order,
        request_id: rid,
        quantity: 2,
        cancel_id: alice_cancel,
        buckets: 1,
    };
    let (begun, _) = store::cancel::begin(&env.redis, &attempt, now_ms).await?;
    assert_eq!(begun, CancelBegin::Recorded);
    let committed =
        protocol::cancel::commit_cancel(&env.pool, alice_order, alice_cancel, None, Utc::now())
            .await?;
    assert_eq!(committed, protocol::cancel::Committed::Cancelled(2));
    // bob's cancel was announced but its transaction never committed.
    let rid = reserve(&env, a.id, "bob", 1).await.attempt.request_id;
    let bob_order = consume(&env, a.id, "bob", rid, 1).await?;
    let attempt = CancelAttempt {
        activity_id: a.id,
        user_id: "bob",
        order_id: bob_order,
        request_id: rid,
        quantity: 1,
        cancel_id: Uuid::now_v7(),
        buckets: 1,
    };
    store::cancel::begin(&env.redis, &attempt, now_ms).await?;
    assert_eq!(redis_stock(&env, a.id).await, Some(7));

    let report = env.reconcile().run(after_grace(GRACE)).await?;

    let r = report.activity(a.id).unwrap();
    assert_eq!((r.cancels_finished, r.settled), (1, 1));
    assert_eq!(redis_stock(&env, a.id).await, Some(9));
    assert!(!is_participant(&env, a.id, "alice").await, "quota back");
    assert!(
        is_participant(&env, a.id, "bob").await,
        "still holds the order"
    );
    assert_eq!(
        (r.sold, r.db_remaining, r.pending_qty, r.drift),
        (1, 9, 0, 0)
    );
    let bob = order::get(&env.pool, bob_order).await?.unwrap();
    assert_eq!(bob.status, OrderStatus::Confirmed);
    Ok(())
}

/// Redis lost the buyer's field after her order was confirmed (a failover that dropped the
/// last writes) while the sale stayed loaded; a paid buyer's field too. Reconcile puts both
/// back from the live orders, so neither can buy a second time; her cancel then completes and
/// the units are back once.
async fn a_field_redis_lost_after_the_order_confirmed_is_restored_by_reconcile(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = env(kind).await?;
    let a = env.open_activity(10, 5).await?;
    let rid = reserve(&env, a.id, "alice", 2).await.attempt.request_id;
    let order_id = consume(&env, a.id, "alice", rid, 2).await?;
    let paid_rid = reserve(&env, a.id, "bob", 1).await.attempt.request_id;
    let paid = consume(&env, a.id, "bob", paid_rid, 1).await?;
    testkit::pay(&env, paid, env.config.payment_timeout)
        .await?
        .map_err(anyhow::Error::msg)?;
    for user in ["alice", "bob"] {
        assert!(testkit::lose_field(&env.redis, a.id, user).await?);
    }

    let report = env.reconcile().run(Utc::now()).await?;

    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(
        testkit::field(&env.redis, a.id, "alice").await?,
        Some(rid.to_string())
    );
    assert_eq!(
        testkit::field(&env.redis, a.id, "bob").await?,
        Some(paid_rid.to_string())
    );
    assert!(
        snapshot(&env, a.id).await.ledger.is_empty(),
        "the restore's marks are gone"
    );
    for user in ["alice", "bob"] {
        let again = testkit::purchase(
            &env.redis,
            a.id,
            user,
            1,
            Uuid::new_v4(),
            purchase::far_deadline(),
        )
        .await?;
        assert!(
            matches!(again, Err(Refusal::AlreadyPurchased)),
            "{user}: {again:?}"
        );
    }
    let order = order::get(&env.pool, order_id).await?.unwrap();
    let outcome = protocol::cancel::cancel_order(
        &env.login(Function::Entry).0,
        &env.login(Function::Entry).1,
        &order,
        Utc::now(),
    )
    .await?;
    assert_eq!(outcome, CancelOutcome::Cancelled { quantity: 2 });
    assert_eq!(db_remaining(&env, a.id).await, 9);
    assert_eq!(redis_stock(&env, a.id).await, Some(9));
    assert!(!is_participant(&env, a.id, "alice").await);
    reserve(&env, a.id, "alice", 1).await;
    Ok(())
}

async fn activity_stats_row_holds_the_numbers(kind: RedisKind) -> anyhow::Result<()> {
    let env = env(kind).await?;
    let a = env.open_activity(10, 5).await?;
    let rid = reserve(&env, a.id, "alice", 1).await.attempt.request_id;
    consume(&env, a.id, "alice", rid, 1).await?;
    let rid = reserve(&env, a.id, "bob", 2).await.attempt.request_id;
    consume(&env, a.id, "bob", rid, 2).await?;
    reserve(&env, a.id, "carol", 1).await;
    let k = env.redis.keys(a.id);
    let _: i64 = env
        .redis
        .cmd(
            redis::cmd("HSET")
                .arg(&k.users)
                .arg("ghost")
                .arg(Uuid::new_v4().to_string()),
        )
        .await?;

    env.reconcile().run(Utc::now()).await?;

    let s = activity::stats(&env.pool, a.id)
        .await?
        .expect("a stats row");
    let row = (
        s.participants,
        s.sold,
        s.db_remaining,
        s.redis_stock,
        s.pending_qty,
        s.drift,
        s.repairs,
    );
    // participants after the ghost was removed; drift = 6 + 1 + 3 - 10.
    assert_eq!(row, (3, 3, 7, Some(6), 1, 0, 1));
    Ok(())
}

/// The database's count holds the sale's row as every stock write does: while it is held
/// (here by hand, as reconcile's role, between its lock and its sum), an order's insert goes
/// through (its foreign key's key-share lock is not held off: before, `for update` queued it,
/// and a stream of such inserts could starve the count) and only the order's stock update
/// waits; the count sums what was committed before, and the order commits after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_count_holds_off_stock_writes_and_not_order_inserts() -> anyhow::Result<()> {
    use seckill_shared::domain::purchase::Attempt;
    use std::time::Duration;
    let env = env(RedisKind::Standalone).await?;
    let a = env.open_activity(10, 2).await?;
    commit_order(&env, a.id, "before", Uuid::new_v4(), 1).await?;

    let (reconcile_db, _) = env.login(Function::Reconcile);
    let mut count = reconcile_db.begin().await?;
    let (total, remaining) = activity::lock_stock(&mut count, a.id).await?;
    assert_eq!((total, remaining), (10, 9));

    let (consumer_db, _) = env.login(Function::Consumer);
    let mut order_tx = consumer_db.begin().await?;
    let attempt = Attempt {
        request_id: Uuid::new_v4(),
        activity_id: a.id,
        user_id: "during".into(),
        quantity: 2,
        buckets: 1,
    };
    let insert = order::insert_confirmed(&mut order_tx, &attempt);
    tokio::time::timeout(Duration::from_secs(2), insert)
        .await
        .expect("the order's insert is not held off by the count")?;
    let taking = tokio::spawn(async move {
        let taken = activity::take_stock(&mut order_tx, a.id, 2, None).await?;
        order_tx.commit().await?;
        anyhow::Ok(taken)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !taking.is_finished(),
        "the stock update waits for the count"
    );

    let sold = order::sold_quantity(&mut *count, a.id).await?;
    assert_eq!(total - sold, remaining, "the count is whole");
    count.commit().await?;
    assert_eq!(taking.await??, Some(7));
    assert_eq!(db_remaining(&env, a.id).await, 7);
    Ok(())
}
