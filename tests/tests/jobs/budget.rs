//! Reconcile within its run budget on huge sales: each sale takes its share and the next its turn,
//! a draw's sends go on over runs, a chunk settled after its read gives nothing back, the orphan
//! check goes on where the last run stopped.

use crate::env;
use chrono::Utc;
use seckill_shared::store;
use seckill_shared::store::ledger;
use std::time::{Duration, Instant};
use testkit::on_every_redis;
use testkit::RedisKind;
use testkit::TestEnv;
use testkit::{after_grace, consume, db_remaining, is_participant, redis_stock, reserve, snapshot};
use testkit::{age_reservations, close_draw_window, restore_entrants};
use uuid::Uuid;

on_every_redis!(
    a_draw_of_30_000_winners_is_ordered_over_runs_within_their_deadlines_while_another_sale_is_repaired,
    a_sale_with_a_huge_ledger_takes_its_share_and_the_next_sale_its_turn,
    the_orphan_check_of_a_huge_users_goes_on_where_the_last_run_stopped,
    a_chunk_of_a_huge_ledger_settled_after_its_read_gives_nothing_back,
);

/// Reconcile with a run budget of 1 ms: each walk of the first sale does its one chunk, and
/// the sales after it wait for the next run.
fn reconcile_in_a_hurry(env: &TestEnv) -> reconcile::Reconcile {
    env.reconcile_with(|c| c.config.reconcile_budget = Duration::from_millis(1))
}

/// One run of `job` at `at` in an invocation whose deadline is a minute away: the budget (of
/// 1 ms), not the deadline, is what runs out, so the first sale still does its least work.
async fn run_in_a_hurry(
    job: &reconcile::Reconcile,
    at: chrono::DateTime<Utc>,
) -> anyhow::Result<reconcile::ReconcileReport> {
    job.run_by(at, testkit::a_minute_from_now()).await
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
    let big = env.open_activity(STALE as i64, 1).await?;
    let small = env.open_activity(5, 1).await?;
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
    let first = run_in_a_hurry(&job, at).await?;
    let b = first
        .activity(big.id)
        .unwrap_or_else(|| panic!("the big sale came first: {first:?}"));
    assert!(b.out_of_time, "{b:?}");
    assert!(
        (1..STALE).contains(&b.compensated),
        "one HSCAN chunk (about {}), not all: {}",
        ledger::LEDGER_INLINE,
        b.compensated
    );
    assert!(!b.ledger_counted, "too large to count in one step");
    assert_eq!(first.deferred_ids, vec![small.id]);

    let second = run_in_a_hurry(&job, at).await?;
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
        let run = run_in_a_hurry(&job, at).await?;
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
    let a = env.open_activity(1_500, 1).await?;
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
    let a = env.open_activity(10, 5).await?;
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
        let run = run_in_a_hurry(&job, Utc::now()).await?;
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

/// A draw sale with 30,000 winners to draw, record and order (its pool filled in bulk through
/// the consumer's restore script, its window closed, its draw not run), and another sale with
/// a stale reservation before every run. With a run budget of 4 s, no run passes the deadline
/// it was given: the draw's steps, its record and the chunks of orders take the draw sale's
/// share, what is left goes on next run, and the other sale's reservations are given back
/// whenever it is checked. A sale whose turn the run could not reach (on a loaded machine a
/// share's last step ends past it) is checked first by the next run: neither sale waits two
/// runs in a row. Once the draw is done, every run that checks the draw sale writes orders
/// until all are written, and no winner is given back meanwhile.
async fn a_draw_of_30_000_winners_is_ordered_over_runs_within_their_deadlines_while_another_sale_is_repaired(
    kind: RedisKind,
) -> anyhow::Result<()> {
    const WINNERS: usize = 30_000;
    // On a loaded machine the draw's steps, the record and the orders may take several runs'
    // shares (at most MAX_RUNS in all).
    const MAX_RUNS: usize = 20;
    const BUDGET: Duration = Duration::from_secs(4);
    let env = env(kind).await?;
    let drawn = env.draw_activity(WINNERS as i64, 1).await?;
    restore_entrants(&env, drawn.id, "e", WINNERS + 10).await;
    close_draw_window(&env, drawn.id).await;
    let other = env.open_activity(100, 1).await?;

    let grace = env.config.reconcile_grace;
    // The other sale's aged reservations not given back yet, and whether each sale was left
    // for the next run by the last one.
    let mut owed = 0;
    let mut waited = (false, false);
    // Per run that checked the draw sale: took, drawn by then, orders written, still pending.
    let mut runs: Vec<(Duration, bool, usize, bool)> = Vec::new();
    let mut drawn_yet = false;
    for n in 0..MAX_RUNS {
        if runs.last().is_some_and(|r| r.1 && !r.3) {
            break;
        }
        reserve(&env, other.id, &format!("late{n}"), 1).await;
        age_reservations(&env, other.id, grace + Duration::from_secs(60)).await;
        owed += 1;
        let job = env.reconcile_with(|c| c.config.reconcile_budget = BUDGET);
        let started = Instant::now();
        let deadline = started + BUDGET;
        let run = job.run_by(Utc::now(), deadline);
        let report = tokio::time::timeout(BUDGET * 10, run)
            .await
            .map_err(|_| anyhow::anyhow!("run {n} went on 10 times past its deadline"))??;
        let took = started.elapsed();
        assert!(
            crate::within_deadline(took, BUDGET),
            "run {n} took {took:?}: {report:?}"
        );
        assert!(report.errors.is_empty(), "{report:?}");
        let (d, o) = (report.activity(drawn.id), report.activity(other.id));
        for (id, checked, left_before) in [
            (drawn.id, d.is_some(), &mut waited.0),
            (other.id, o.is_some(), &mut waited.1),
        ] {
            if !checked {
                assert!(
                    report.deferred_ids.contains(&id) && !*left_before,
                    "run {n}: sale {id} not checked twice in a row: {report:?}"
                );
            }
            *left_before = !checked;
        }
        if let Some(o) = o {
            assert_eq!(o.compensated, owed, "run {n}: {report:?}");
            owed = 0;
        }
        if let Some(d) = d {
            assert_eq!(d.compensated, 0, "run {n}: {report:?}");
            drawn_yet |= d.drawn;
            runs.push((took, drawn_yet, d.winners_ordered, d.orders_pending));
        }
    }
    let ordered: usize = runs.iter().map(|r| r.2).sum();
    assert_eq!(
        ordered, WINNERS,
        "every winner ordered within {MAX_RUNS} runs: {runs:?}"
    );
    let recorded: i64 =
        sqlx::query_scalar("select winners from draw_outcomes where activity_id = $1")
            .bind(drawn.id)
            .fetch_one(&env.pool)
            .await?;
    assert_eq!(recorded, WINNERS as i64, "recorded once, whole");
    assert_eq!(
        db_remaining(&env, drawn.id).await,
        0,
        "each order took its unit once"
    );
    assert_eq!(
        snapshot(&env, drawn.id).await.ledger_size,
        0,
        "every winner's reservation settled"
    );
    Ok(())
}
