//! The scheduled jobs against the real services: preheat loads idempotently, reconcile repairs
//! every drift a crash can leave and breaks nothing while purchases run.
//!
//! Each scenario runs on standalone Redis and on the cluster (`<name>::standalone`,
//! `<name>::cluster`). Time-dependent steps pass a `now` in the future instead of sleeping.

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use reconcile::StockCheck;
use seckill_shared::domain::activity;
use seckill_shared::domain::activity::Activity;
use seckill_shared::protocol;
use seckill_shared::store;
use seckill_shared::store::ledger;
use seckill_shared::store::purchase;

use seckill_shared::domain::order;
use seckill_shared::protocol::cancel::CancelOutcome;
use seckill_shared::store::cancel::CancelAttempt;
use seckill_shared::store::cancel::CancelBegin;
use seckill_shared::store::purchase::Reservation;
use seckill_shared::Refusal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use testkit::on_both_redis;
use testkit::RedisKind;
use testkit::TestEnv;
use uuid::Uuid;

use testkit::{
    after_grace, commit_order, consume, db_remaining, is_participant, redis_stock, reserve,
    set_db_stock, snapshot,
};

on_both_redis!(
    preheat_twice_leaves_a_loaded_sale_unchanged,
    preheat_concurrent_with_purchases_never_resets_stock,
    preheat_reloads_a_running_sale_missing_from_redis,
    stale_reservation_is_given_back_after_the_grace_period_only,
    reservation_whose_order_exists_is_dropped_without_stock_change,
    user_in_the_set_with_nothing_behind_it_is_removed,
    a_sale_with_a_huge_ledger_takes_its_share_and_the_next_sale_its_turn,
    the_orphan_check_of_a_huge_users_goes_on_where_the_last_run_stopped,
    a_chunk_of_a_huge_ledger_settled_after_its_read_gives_nothing_back,
    redis_stock_off_by_n_is_corrected_only_when_the_ledger_is_quiet,
    stale_cancel_entries_are_finished_or_dropped_by_what_the_database_says,
    unpaid_order_past_the_payment_timeout_is_released,
    the_payment_timeout_releases_every_sale_while_one_cannot_release_its_orders,
    a_field_redis_lost_after_the_order_confirmed_is_restored_by_reconcile,
    reconcile_during_a_load_of_purchases_breaks_no_invariant,
    activity_stats_row_holds_the_numbers,
);

const GRACE: Duration = Duration::from_secs(5);
const PAYMENT_TIMEOUT: Duration = Duration::from_secs(3600);

async fn env(kind: RedisKind) -> anyhow::Result<TestEnv> {
    let mut env = TestEnv::new(kind).await?;
    env.config.reconcile_grace = GRACE;
    env.config.payment_timeout = PAYMENT_TIMEOUT;
    Ok(env)
}

/// An activity in the database only (not preheated).
async fn insert_activity(
    env: &TestEnv,
    stock: i64,
    start_at: DateTime<Utc>,
    end_at: DateTime<Utc>,
) -> anyhow::Result<Activity> {
    Ok(activity::insert(
        &env.pool,
        &testkit::sale()
            .title("job test")
            .stock(stock)
            .limit(5)
            .window(start_at, end_at)
            .build()
            .settings()?,
    )
    .await?)
}

// ---------------------------------------------------------------------------------------------
// preheat

async fn preheat_twice_leaves_a_loaded_sale_unchanged(kind: RedisKind) -> anyhow::Result<()> {
    let env = env(kind).await?;
    let now = Utc::now();
    let a = insert_activity(
        &env,
        20,
        now - ChronoDuration::minutes(1),
        now + ChronoDuration::hours(1),
    )
    .await?;
    let job = env.preheat();

    let first = job.run(Utc::now()).await?;
    assert_eq!(first.loaded_ids, vec![a.id]);
    reserve(&env, a.id, "alice", 3).await;

    let second = job.run(Utc::now()).await?;
    assert_eq!(second.loaded, 0);
    assert_eq!(second.already_loaded_ids, vec![a.id]);
    assert!(second.errors.is_empty());
    // The database still says 20 (no consumer ran): a reset would have put 20 back.
    assert_eq!(redis_stock(&env, a.id).await, Some(17));
    assert!(is_participant(&env, a.id, "alice").await);
    Ok(())
}

async fn preheat_concurrent_with_purchases_never_resets_stock(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = Arc::new(env(kind).await?);
    let now = Utc::now();
    let a = insert_activity(
        &env,
        300,
        now - ChronoDuration::minutes(1),
        now + ChronoDuration::hours(1),
    )
    .await?;
    let job = Arc::new(env.preheat());
    job.run(Utc::now()).await?;

    let done = Arc::new(AtomicBool::new(false));
    let preheaters: Vec<_> = (0..2)
        .map(|_| {
            let (job, done) = (job.clone(), done.clone());
            tokio::spawn(async move {
                let mut runs = 0;
                while !done.load(Ordering::SeqCst) || runs == 0 {
                    let report = job.run(Utc::now()).await?;
                    assert_eq!(report.loaded, 0, "a loaded sale was loaded again");
                    runs += 1;
                }
                anyhow::Ok(runs)
            })
        })
        .collect();
    let buyers: Vec<_> = (0..200)
        .map(|i| {
            let env = env.clone();
            tokio::spawn(async move {
                let d = testkit::purchase(
                    &env.redis,
                    a.id,
                    &format!("u{i}"),
                    1,
                    Uuid::new_v4(),
                    purchase::far_deadline(),
                )
                .await?;
                anyhow::Ok(d.is_ok())
            })
        })
        .collect();
    let mut accepted = 0;
    for b in buyers {
        accepted += i64::from(b.await??);
    }
    done.store(true, Ordering::SeqCst);
    let mut runs = 0;
    for p in preheaters {
        runs += p.await??;
    }

    assert!(runs >= 2, "preheat ran {runs} times");
    assert_eq!(accepted, 200);
    assert_eq!(redis_stock(&env, a.id).await, Some(300 - accepted));
    Ok(())
}

async fn preheat_reloads_a_running_sale_missing_from_redis(kind: RedisKind) -> anyhow::Result<()> {
    let env = env(kind).await?;
    let now = Utc::now();
    let running = env.open_sale(10, 1).await?;
    let soon = insert_activity(
        &env,
        5,
        now + ChronoDuration::minutes(10),
        now + ChronoDuration::hours(1),
    )
    .await?;
    let later = insert_activity(
        &env,
        5,
        now + ChronoDuration::hours(5),
        now + ChronoDuration::hours(6),
    )
    .await?;
    // The cache lost the running sale (failover, flush, eviction).
    let k = env.redis.keys(running.id);
    let _: i64 = env.redis.cmd(redis::cmd("DEL").arg(&k.meta)).await?;

    let report = env.preheat().run(Utc::now()).await?;

    assert_eq!(report.loaded_ids, vec![running.id, soon.id]);
    assert!(!report.already_loaded_ids.contains(&later.id));
    assert_eq!(redis_stock(&env, running.id).await, Some(10));
    assert_eq!(redis_stock(&env, soon.id).await, Some(5));
    assert_eq!(redis_stock(&env, later.id).await, None);
    // Every loaded key expires exactly at the sale's end plus the buffer.
    for a in [&running, &soon] {
        let k = env.redis.keys(a.id);
        let expected = a.expire_at(env.config.expiry_buffer).timestamp_millis();
        for key in [&k.meta, &k.users, &k.ledger] {
            let at: i64 = env.redis.cmd(redis::cmd("PEXPIRETIME").arg(key)).await?;
            assert_eq!(at, expected, "{key}");
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// reconcile: one injected drift at a time

async fn stale_reservation_is_given_back_after_the_grace_period_only(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = env(kind).await?;
    let a = env.open_sale(10, 5).await?;
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
    let a = env.open_sale(10, 5).await?;
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
    let a = env.open_sale(10, 5).await?;
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

/// Reconcile with a run budget of 1 ms: each walk of the first sale does its one chunk, and
/// the sales after it wait for the next run.
fn reconcile_in_a_hurry(env: &TestEnv) -> reconcile::Reconcile {
    env.reconcile_with(|c| c.config.reconcile_budget = Duration::from_millis(1))
}

/// A sale whose ledger holds 2,500 stale reservations (more than one snapshot step reads, so
/// the ledger is read in chunks) and, after it, a sale with one. With a run budget of 1 ms,
/// the first sale's repairs stop after a chunk and the second waits; the next run checks the
/// second first (it was never checked), and later runs finish the first. Every unit comes
/// back once.
async fn a_sale_with_a_huge_ledger_takes_its_share_and_the_next_sale_its_turn(
    kind: RedisKind,
) -> anyhow::Result<()> {
    const STALE: usize = 2_500;
    let env = env(kind).await?;
    let big = env.open_sale(STALE as i64, 1).await?;
    let small = env.open_sale(5, 1).await?;
    for i in 0..STALE {
        reserve(&env, big.id, &format!("u{i:05}"), 1).await;
    }
    reserve(&env, small.id, "alone", 1).await;
    let snap = snapshot(&env, big.id).await;
    assert_eq!(
        (snap.ledger_size, snap.ledger.len()),
        (STALE as i64, STALE),
        "read in chunks, each entry once"
    );

    let job = reconcile_in_a_hurry(&env);
    let at = after_grace(env.config.reconcile_grace);
    let first = job.run(at).await?;
    let b = first.activity(big.id).expect("the big sale came first");
    assert!(b.out_of_time, "{b:?}");
    assert!(
        (1..STALE).contains(&b.compensated),
        "one HSCAN chunk (about {}), not all: {}",
        ledger::LEDGER_INLINE,
        b.compensated
    );
    assert!(!b.ledger_counted, "too large to count in one step");
    assert_eq!(first.deferred_ids, vec![small.id]);

    let second = job.run(at).await?;
    assert_eq!(
        second.activities.first().map(|r| r.activity_id),
        Some(small.id),
        "the sale left out goes first"
    );
    assert_eq!(second.activity(small.id).unwrap().compensated, 1);

    let mut compensated = b.compensated + second.activity(big.id).map_or(0, |r| r.compensated);
    for _ in 0..20 {
        if compensated == STALE {
            break;
        }
        let run = job.run(at).await?;
        compensated += run.activity(big.id).map_or(0, |r| r.compensated);
    }
    assert_eq!(compensated, STALE);
    assert_eq!(snapshot(&env, big.id).await.ledger_size, 0);
    assert_eq!(
        store::view::stock(&env.redis, big.id).await?,
        Some(STALE as i64)
    );
    assert_eq!(store::view::stock(&env.redis, small.id).await?, Some(5));
    Ok(())
}

/// A ledger too large for the snapshot's one step (1,200 reservations, past the grace period
/// with no order yet): reconcile reads a chunk of it and stops before repairing it; meanwhile
/// the consumer commits every order and settles its entry. Resumed, the chunk's entries are
/// decided by their rows: nothing is given back, and Redis and the database agree.
async fn a_chunk_of_a_huge_ledger_settled_after_its_read_gives_nothing_back(
    kind: RedisKind,
) -> anyhow::Result<()> {
    const BUYERS: usize = 1_200;
    let env = env(kind).await?;
    let a = env.open_sale(1_500, 1).await?;
    let mut reserved = Vec::new();
    for i in 0..BUYERS {
        let user = format!("u{i:05}");
        let rid = reserve(&env, a.id, &user, 1).await.attempt.request_id;
        reserved.push((user, rid));
    }
    let paused = seckill_shared::infra::pause::arm("reconcile.ledger.after_chunk", a.id);
    let run = {
        let job = env.reconcile();
        let at = after_grace(env.config.reconcile_grace);
        tokio::spawn(async move { job.run(at).await })
    };
    assert!(paused.reached_within(Duration::from_secs(20)).await);
    for (user, rid) in &reserved {
        consume(&env, a.id, user, *rid, 1).await?;
    }
    paused.resume();
    let report = run.await??;
    let r = report.activity(a.id).expect("checked");
    assert_eq!(r.compensated, 0, "{r:?}");
    assert_eq!(redis_stock(&env, a.id).await, Some(300));
    assert_eq!(db_remaining(&env, a.id).await, 300);
    assert_eq!(snapshot(&env, a.id).await.ledger_size, 0);
    Ok(())
}

/// 2,500 users in `users` with nothing behind them. With a run budget of 1 ms the orphan check
/// walks `users` a chunk per run and goes on from its cursor the next run: no run drops
/// them all, and together the runs drop each once, keeping the buyer with an order.
async fn the_orphan_check_of_a_huge_users_goes_on_where_the_last_run_stopped(
    kind: RedisKind,
) -> anyhow::Result<()> {
    const GHOSTS: usize = 2_500;
    let env = env(kind).await?;
    let a = env.open_sale(10, 5).await?;
    let rid = reserve(&env, a.id, "buyer", 1).await.attempt.request_id;
    consume(&env, a.id, "buyer", rid, 1).await?;
    let k = env.redis.keys(a.id);
    let mut hset = redis::cmd("HSET");
    hset.arg(&k.users);
    for i in 0..GHOSTS {
        hset.arg(format!("ghost{i:05}"))
            .arg(Uuid::new_v4().to_string());
    }
    let _: i64 = env.redis.cmd(&hset).await?;

    let job = reconcile_in_a_hurry(&env);
    let mut dropped = Vec::new();
    for _ in 0..20 {
        let run = job.run(Utc::now()).await?;
        let r = run.activity(a.id).expect("checked");
        dropped.push(r.users_dropped);
        if r.participants == 1 {
            break;
        }
    }
    assert!(dropped.len() > 1, "one run did all: {dropped:?}");
    assert_eq!(dropped.iter().sum::<usize>(), GHOSTS, "{dropped:?}");
    assert!(is_participant(&env, a.id, "buyer").await, "holds an order");
    Ok(())
}

async fn redis_stock_off_by_n_is_corrected_only_when_the_ledger_is_quiet(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = env(kind).await?;
    let a = env.open_sale(10, 5).await?;
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
    set_db_stock(&env, a.id, 9).await;
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
    let a = env.open_sale(10, 5).await?;
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
    assert_eq!(bob.status, "confirmed");
    Ok(())
}

async fn unpaid_order_past_the_payment_timeout_is_released(kind: RedisKind) -> anyhow::Result<()> {
    let env = env(kind).await?;
    let a = env.open_sale(10, 5).await?;
    let rid = reserve(&env, a.id, "alice", 2).await.attempt.request_id;
    let order_id = consume(&env, a.id, "alice", rid, 2).await?;
    let paid_rid = reserve(&env, a.id, "bob", 1).await.attempt.request_id;
    let paid = consume(&env, a.id, "bob", paid_rid, 1).await?;
    testkit::pay(&env.pool, paid, env.config.payment_timeout)
        .await?
        .map_err(anyhow::Error::msg)?;
    let job = env.reconcile();

    let before = job.run(Utc::now()).await?;
    assert_eq!(before.released_unpaid, 0);

    let past_timeout = Utc::now()
        + ChronoDuration::from_std(PAYMENT_TIMEOUT).unwrap()
        + ChronoDuration::seconds(1);
    let report = job.run(past_timeout).await?;

    assert_eq!(report.released_unpaid, 1);
    assert_eq!(report.activity(a.id).unwrap().released_unpaid, 1);
    assert_eq!(
        order::get(&env.pool, order_id).await?.unwrap().status,
        "cancelled"
    );
    assert_eq!(order::get(&env.pool, paid).await?.unwrap().status, "paid");
    assert_eq!(db_remaining(&env, a.id).await, 9);
    assert_eq!(redis_stock(&env, a.id).await, Some(9));
    assert!(!is_participant(&env, a.id, "alice").await);
    let r = report.activity(a.id).unwrap();
    assert_eq!((r.sold, r.pending_qty, r.drift), (1, 0, 0));
    // The user may buy again.
    reserve(&env, a.id, "alice", 1).await;
    Ok(())
}

/// Sale A runs but Redis lost it, so none of its unpaid orders can be released until it is
/// loaded again (a cancel answers `busy`); there are more of them than one run releases, and
/// they are older than sale B's. The payment timeout still releases B's order within a lap,
/// and leaves A's as they are.
async fn the_payment_timeout_releases_every_sale_while_one_cannot_release_its_orders(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let mut env = env(kind).await?;
    env.config.release_batch = 3;
    // Well before the sales' end (in an hour): a cancel of an ended sale changes the database
    // alone, and sale A must stay one that runs.
    env.config.payment_timeout = Duration::from_secs(60);
    let a = env.open_sale(10, 5).await?;
    let b = env.open_sale(10, 5).await?;
    let mut stuck = Vec::new();
    for i in 0..4 {
        let user = format!("a{i}");
        let rid = reserve(&env, a.id, &user, 1).await.attempt.request_id;
        stuck.push(consume(&env, a.id, &user, rid, 1).await?);
    }
    let rid = reserve(&env, b.id, "bob", 1).await.attempt.request_id;
    let bobs = consume(&env, b.id, "bob", rid, 1).await?;
    testkit::lose_sale(&env.redis, a.id).await?;
    let job = env.reconcile();
    let past_timeout = Utc::now() + ChronoDuration::seconds(61);

    let status = |id: i64| {
        let pool = env.pool.clone();
        async move { order::get(&pool, id).await.map(|o| o.unwrap().status) }
    };
    let mut runs = 0;
    while status(bobs).await? == "confirmed" && runs < 4 {
        let mut report = reconcile::ReconcileReport::default();
        job.release_unpaid(past_timeout, &mut report).await;
        assert!(report.errors.is_empty(), "{report:?}");
        runs += 1;
    }

    assert_eq!(
        status(bobs).await?,
        "cancelled",
        "sale B's unpaid order is still confirmed after {runs} runs"
    );
    assert_eq!(db_remaining(&env, b.id).await, 10);
    assert_eq!(redis_stock(&env, b.id).await, Some(10));
    for id in stuck {
        assert_eq!(status(id).await?, "confirmed", "sale A is not loaded");
    }
    assert_eq!(db_remaining(&env, a.id).await, 6);
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
    let a = env.open_sale(10, 5).await?;
    let rid = reserve(&env, a.id, "alice", 2).await.attempt.request_id;
    let order_id = consume(&env, a.id, "alice", rid, 2).await?;
    let paid_rid = reserve(&env, a.id, "bob", 1).await.attempt.request_id;
    let paid = consume(&env, a.id, "bob", paid_rid, 1).await?;
    testkit::pay(&env.pool, paid, env.config.payment_timeout)
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
    let outcome = protocol::cancel::cancel_order(&env.pool, &env.redis, &order, Utc::now()).await?;
    assert_eq!(outcome, CancelOutcome::Cancelled { quantity: 2 });
    assert_eq!(db_remaining(&env, a.id).await, 9);
    assert_eq!(redis_stock(&env, a.id).await, Some(9));
    assert!(!is_participant(&env, a.id, "alice").await);
    reserve(&env, a.id, "alice", 1).await;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// reconcile under load

/// Takes one unit from Redis stock if there is one: a leak (a unit lost to a crash), injected
/// while purchases run, for reconcile to find. Never drives the stock below zero by itself.
const LEAK: &str = "if tonumber(redis.call('HGET', KEYS[1], 'stock') or '0') > 0 then \
                    return redis.call('HINCRBY', KEYS[1], 'stock', -1) end return -1";

async fn reconcile_during_a_load_of_purchases_breaks_no_invariant(
    kind: RedisKind,
) -> anyhow::Result<()> {
    const STOCK: i64 = 300;
    const WAVES: usize = 8;
    const WAVE: usize = 50;
    let env = Arc::new(env(kind).await?);
    let a = env.open_sale(STOCK, 2).await?;
    let id = a.id;
    let buying = Arc::new(AtomicBool::new(true));
    let done = Arc::new(AtomicBool::new(false));

    // Two reconcilers at once, against each other and the purchases.
    let reconcilers: Vec<_> = (0..2)
        .map(|_| {
            let (job, done) = (env.reconcile(), done.clone());
            tokio::spawn(async move {
                let mut checks = Vec::new();
                while !done.load(Ordering::SeqCst) {
                    let report = job.run(Utc::now()).await?;
                    anyhow::ensure!(report.errors.is_empty(), "{:?}", report.errors);
                    checks.push(report.activity(id).expect("checked").stock_check);
                }
                anyhow::Ok(checks)
            })
        })
        .collect();
    // Redis stock sampled throughout: never below zero.
    let monitor = {
        let (env, done) = (env.clone(), done.clone());
        tokio::spawn(async move {
            let mut samples = 0;
            while !done.load(Ordering::SeqCst) {
                let snap = ledger::snapshot(&env.redis, id).await?;
                let stock = snap.stock.expect("loaded");
                anyhow::ensure!(stock >= 0, "redis stock {stock} < 0");
                samples += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            anyhow::Ok(samples)
        })
    };
    // Units leak from Redis while the sale runs; reconcile puts them back from the database.
    // Putting back too many would show up as the database refusing an accepted reservation.
    let leaker = {
        let (env, buying) = (env.clone(), buying.clone());
        let meta_key = env.redis.keys(id).meta;
        tokio::spawn(async move {
            let leak = redis::Script::new(LEAK);
            let mut leaked = 0;
            while buying.load(Ordering::SeqCst) {
                let left: i64 = env
                    .redis
                    .script(leak.prepare_invoke().key(&meta_key))
                    .await?;
                leaked += i64::from(left >= 0);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            anyhow::Ok(leaked)
        })
    };
    // The consumer: each accepted reservation becomes an order (SQL transaction, then settle),
    // a little later, as if delivered through the queue. `Ok(false)`: the database refused it.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Uuid, i64)>();
    let consumer = {
        let env = env.clone();
        tokio::spawn(async move {
            let mut orders = Vec::new();
            while let Some((user, rid, qty)) = rx.recv().await {
                let env = env.clone();
                orders.push(tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(rand::random_range(0..30))).await;
                    match commit_order(&env, id, &user, rid, qty).await {
                        Ok(_) => {
                            ledger::settle(&env.redis, id, &user, &rid.to_string()).await?;
                            anyhow::Ok(true)
                        }
                        Err(e) if e.to_string() == "DB sold out" => Ok(false),
                        Err(e) => Err(e),
                    }
                }));
            }
            let mut refused = 0;
            for o in orders {
                refused += i64::from(!o.await??);
            }
            anyhow::Ok(refused)
        })
    };
    // Waves of buyers with pauses between them, so the ledger goes quiet now and then and
    // reconcile's stock correction races the next wave.
    let mut reserved = 0;
    for wave in 0..WAVES {
        let buyers: Vec<_> = (0..WAVE)
            .map(|i| {
                let (env, tx) = (env.clone(), tx.clone());
                tokio::spawn(async move {
                    let n = wave * WAVE + i;
                    let (user, qty, rid) = (format!("u{n}"), 1 + (n % 2) as i64, Uuid::new_v4());
                    match testkit::purchase(
                        &env.redis,
                        id,
                        &user,
                        qty,
                        rid,
                        purchase::far_deadline(),
                    )
                    .await?
                    {
                        Ok(Reservation { stock_left, .. }) => {
                            anyhow::ensure!(stock_left >= 0);
                            tx.send((user, rid, qty))?;
                            Ok(qty)
                        }
                        Err(Refusal::SoldOut { .. }) => Ok(0),
                        other => anyhow::bail!("unexpected {other:?}"),
                    }
                })
            })
            .collect();
        for b in buyers {
            reserved += b.await??;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    buying.store(false, Ordering::SeqCst);
    drop(tx);
    let refused = consumer.await??;
    let leaked = leaker.await??;
    // A few more passes over the settled state, then stop.
    tokio::time::sleep(Duration::from_millis(300)).await;
    done.store(true, Ordering::SeqCst);
    let mut checks = Vec::new();
    for r in reconcilers {
        checks.extend(r.await??);
    }
    let samples = monitor.await??;
    let corrected = checks
        .iter()
        .filter(|c| matches!(c, StockCheck::Corrected { .. }))
        .count();

    assert!(
        samples > 10 && leaked > 0,
        "{samples} samples, {leaked} leaked"
    );
    assert!(corrected > 0, "no correction ran: {checks:?}");
    assert_eq!(refused, 0, "Redis sold units the database did not have");
    let snap = ledger::snapshot(&env.redis, id).await?;
    let stock = snap.stock.expect("loaded");
    let sold = order::sold_quantity(&env.pool, id).await?;
    assert_eq!(sold, reserved);
    assert!(sold <= STOCK);
    assert!(snap.ledger.is_empty());
    // One last pass puts back whatever leaked last; then every unit is accounted for.
    let report = env.reconcile().run(Utc::now()).await?;
    let r = report.activity(id).unwrap();
    assert!(r.redis_stock >= Some(stock));
    assert_eq!((r.pending_qty, r.drift), (0, 0));
    assert_eq!(r.redis_stock, Some(STOCK - sold));
    assert_eq!(db_remaining(&env, id).await, STOCK - sold);
    Ok(())
}

async fn activity_stats_row_holds_the_numbers(kind: RedisKind) -> anyhow::Result<()> {
    let env = env(kind).await?;
    let a = env.open_sale(10, 5).await?;
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
