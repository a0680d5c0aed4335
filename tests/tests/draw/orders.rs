//! After the draw: the drawer writes its winners' orders from the recorded outcome, in
//! chunks, and no winner crosses the queue. A drawer's run that stopped after the steps leaves
//! the record and the orders to the next run, past the grace period too; a second drawer
//! racing the first records nothing twice and writes no order twice; reconcile gives back
//! nothing of a draw whose orders are late; a status read of a huge draw's entrant stays a
//! cheap read; a sale loaded again after its draw draws nobody again.

use crate::enter;
use crate::fairness::tickets;
use axum::http::StatusCode;
use seckill_shared::domain::status::FailureReason;
use seckill_shared::domain::status::OrderStatus;
use seckill_shared::infra::pause;
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol::draw::{self as drawing, ORDER_CHUNK};
use seckill_shared::store::draw;
use seckill_shared::store::draw::Drawn;
use std::time::Duration;
use testkit::invariants;
use testkit::on_every_redis;
use testkit::RedisKind;
use testkit::TestEnv;
use testkit::{
    after_grace, age_reservations, buy, close_draw_window, consume_queue, order_rows, snapshot,
};
use testkit::{counting_pool, draw_entry_rows, my_status, restore_entrants, spawn_drawer};

on_every_redis!(
    a_queued_users_status_read_after_a_draw_of_30_000_winners_costs_no_sql,
    a_sale_reloaded_after_its_draw_draws_nobody_again,
    a_draw_left_unwritten_past_the_grace_period_is_ordered_and_nothing_given_back,
    reconcile_gives_back_nothing_of_a_draw_whose_record_is_late,
    a_second_drawer_between_two_chunks_writes_every_order_once,
    a_recorded_draw_whose_sale_redis_lost_is_ordered_from_the_database,
    a_drawer_dead_after_a_chunk_leaves_every_winner_of_it_a_row,
    winners_never_expire_behind_an_entry_backlog,
);

/// A draw sale of 3 units whose 8 entrants (put in the pool in bulk) are drawn, nothing
/// recorded yet.
async fn drawn_sale(env: &TestEnv) -> anyhow::Result<seckill_shared::domain::activity::Activity> {
    let a = env.draw_activity(3, 1).await?;
    restore_entrants(env, a.id, "e", 8).await;
    close_draw_window(env, a.id).await;
    assert!(draw::draw(&env.redis, a.id, Duration::MAX).await?.is_done());
    Ok(a)
}

/// How many of sale `activity_id`'s orders are `confirmed`.
async fn confirmed(env: &TestEnv, activity_id: i64) -> usize {
    order_rows(env, activity_id)
        .await
        .iter()
        .filter(|o| o.status == OrderStatus::Confirmed)
        .count()
}

/// A drawer's run that stopped after the draw's steps, before its record (its time ran out,
/// or it died): the winners' reservations wait, and the next run, once they are past the
/// grace period, records the draw and writes their orders instead of giving their units back.
/// A purchase meanwhile answers `draw_running` and runs no step. Every winner gets an order,
/// none through the queue; the units balance.
async fn a_draw_left_unwritten_past_the_grace_period_is_ordered_and_nothing_given_back(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_activity(5, 1).await?;
    for i in 0..8 {
        assert_eq!(
            buy(&app, &a, &format!("e{i}"), None).await.0,
            StatusCode::ACCEPTED
        );
    }
    assert_eq!(consume_queue(&env).await?, 0, "entries are no orders");
    assert_eq!(draw_entry_rows(&env, a.id).await, 8, "the entries kept");
    close_draw_window(&env, a.id).await;
    let (status, body) = buy(&app, &a, "late", None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("draw_running")),
        "{body}"
    );
    // The drawer's steps, and its run stops there.
    assert!(
        draw::draw(&env.redis, a.id, Duration::ZERO)
            .await?
            .is_done(),
        "one step draws 8 entrants"
    );
    assert_eq!(snapshot(&env, a.id).await.pending_count(), 5);

    let grace = env.config.reconcile_grace;
    age_reservations(&env, a.id, grace + Duration::from_secs(60)).await;
    let report = env.reconcile().run(chrono::Utc::now()).await?;
    let r = report.activity(a.id).unwrap();
    assert_eq!(
        (r.winners_ordered, r.orders_pending, r.compensated),
        (5, false, 0),
        "{r:?}"
    );
    assert_eq!(consume_queue(&env).await?, 0, "no winner crosses the queue");
    assert_eq!(confirmed(&env, a.id).await, 5);
    assert_eq!(snapshot(&env, a.id).await.pending_count(), 0, "settled");
    invariants::check(&env, a.id).await?;
    Ok(())
}

/// A draw of 30,000 winners, done and not recorded (its pool filled in bulk through the
/// consumer's restore script). A queued entrant the draw passed over, and a winner, ask for
/// their status: each answer comes from Redis alone, promptly, with no connection taken from
/// the database: a request records no draw and writes no order.
async fn a_queued_users_status_read_after_a_draw_of_30_000_winners_costs_no_sql(
    kind: RedisKind,
) -> anyhow::Result<()> {
    const WINNERS: usize = 30_000;
    let env = TestEnv::new(kind).await?;
    let a = env.draw_activity(WINNERS as i64, 1).await?;
    restore_entrants(&env, a.id, "e", WINNERS + 10).await;
    close_draw_window(&env, a.id).await;
    assert!(draw::draw(&env.redis, a.id, Duration::MAX).await?.is_done());
    let pool = draw::pool(&env.redis, a.id).await?;
    let loser = pool.iter().find(|(_, e)| !e.won).map(|(u, _)| u.clone());
    let winner = pool.iter().find(|(_, e)| e.won).map(|(u, _)| u.clone());
    let (loser, winner) = (loser.expect("a loser"), winner.expect("a winner"));
    let (counted, taken) = counting_pool(&env);
    let app = env.entry_router_with(|c| c.pool = counted);

    let started = std::time::Instant::now();
    assert_eq!(my_status(&app, &a, &loser).await, "not_drawn");
    assert_eq!(my_status(&app, &a, &winner).await, "pending");
    let took = started.elapsed();
    assert_eq!(
        taken.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "no database work"
    );
    assert!(took < Duration::from_secs(1), "two reads took {took:?}");
    let outcomes: i64 =
        sqlx::query_scalar("select count(*) from draw_outcomes where activity_id = $1")
            .bind(a.id)
            .fetch_one(&env.pool)
            .await?;
    assert_eq!(outcomes, 0, "nothing recorded");
    assert!(order_rows(&env, a.id).await.is_empty(), "no order written");
    Ok(())
}

/// Reconcile's drawer paused between the record's commit and its mark in Redis, while a
/// second reconcile runs past the grace period of the draw: the second records nothing twice
/// (it finds the same outcome), writes the winners' orders, and gives back nothing. The first
/// then goes on and writes none again. Every winner is confirmed once.
async fn reconcile_gives_back_nothing_of_a_draw_whose_record_is_late(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_activity(4, 1).await?;
    for i in 0..6 {
        assert_eq!(
            buy(&app, &a, &format!("e{i}"), None).await.0,
            StatusCode::ACCEPTED
        );
    }
    close_draw_window(&env, a.id).await;
    let paused = pause::arm("draw.record.after_commit", a.id);
    let first = {
        let job = env.reconcile();
        tokio::spawn(async move { job.run(chrono::Utc::now()).await })
    };
    assert!(
        paused.reached_within(Duration::from_secs(10)).await,
        "the drawer recorded the draw"
    );
    assert_eq!(snapshot(&env, a.id).await.pending_count(), 4);

    let report = env
        .reconcile()
        .run(after_grace(env.config.reconcile_grace))
        .await?;
    let r = report.activity(a.id).unwrap();
    assert_eq!(
        (r.compensated, r.winners_ordered, r.orders_pending),
        (0, 4, false),
        "{r:?}"
    );

    paused.resume();
    let first = first.await??;
    assert_eq!(first.activity(a.id).unwrap().winners_ordered, 0);
    let rows = order_rows(&env, a.id).await;
    assert_eq!(rows.len(), 4, "{rows:?}");
    assert_eq!(confirmed(&env, a.id).await, 4);
    let winners: i64 =
        sqlx::query_scalar("select count(*) from draw_winners where activity_id = $1")
            .bind(a.id)
            .fetch_one(&env.pool)
            .await?;
    assert_eq!(winners, 4, "recorded once");
    invariants::check(&env, a.id).await?;
    Ok(())
}

/// A draw whose winners take three chunks of orders. The first drawer stops after its first
/// chunk's commit, before its settle (its reservations still in the ledger); a second drawer,
/// past the grace period, writes the other chunks from the record's cursor, marks the orders
/// written, and settles the first chunk's reservations by their rows, giving back nothing. The
/// first then settles and finds nothing left. Every winner has exactly one order and the
/// units balance.
async fn a_second_drawer_between_two_chunks_writes_every_order_once(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let winners = 2 * ORDER_CHUNK + ORDER_CHUNK / 2;
    let env = TestEnv::new(kind).await?;
    let a = env.draw_activity(winners as i64, 1).await?;
    restore_entrants(&env, a.id, "e", winners + 20).await;
    close_draw_window(&env, a.id).await;
    let paused = pause::arm("draw.orders.after_commit", a.id);
    let first = {
        let job = env.reconcile();
        tokio::spawn(async move { job.run(chrono::Utc::now()).await })
    };
    assert!(
        paused.reached_within(Duration::from_secs(30)).await,
        "the first chunk committed"
    );
    assert_eq!(order_rows(&env, a.id).await.len(), ORDER_CHUNK);

    let report = env
        .reconcile()
        .run(after_grace(env.config.reconcile_grace))
        .await?;
    let r = report.activity(a.id).unwrap();
    assert_eq!(
        (r.compensated, r.winners_ordered, r.orders_pending),
        (0, winners - ORDER_CHUNK, false),
        "{r:?}"
    );
    assert_eq!(snapshot(&env, a.id).await.pending_count(), 0, "all settled");

    paused.resume();
    let first = first.await??;
    assert_eq!(first.activity(a.id).unwrap().winners_ordered, ORDER_CHUNK);
    assert_eq!(order_rows(&env, a.id).await.len(), winners);
    assert_eq!(confirmed(&env, a.id).await, winners);
    invariants::check(&env, a.id).await?;
    Ok(())
}

/// A drawn sale whose meta Redis lost is reloaded from the database with its draw's state
/// gone too (pool, tickets, winners): the draw cannot run a second time over the old entries,
/// and no loser told `not_drawn` becomes a winner.
async fn a_sale_reloaded_after_its_draw_draws_nobody_again(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.draw_activity(2, 1).await?;
    for i in 0..10 {
        enter(&env, a.id, &format!("e{i}")).await;
    }
    close_draw_window(&env, a.id).await;
    assert!(draw::draw(&env.redis, a.id, Duration::MAX).await?.is_done());
    let losers: Vec<String> = draw::pool(&env.redis, a.id)
        .await?
        .into_iter()
        .filter(|(_, e)| !e.won)
        .map(|(u, _)| u)
        .collect();
    assert_eq!(losers.len(), 8);

    testkit::lose_activity(&env.redis, a.id).await?;
    let (pool, redis) = env.login(Function::Preheat);
    seckill_shared::protocol::load::load_under_lock(
        &redis,
        &pool,
        &env.config,
        a.id,
        testkit::a_minute_from_now(),
    )
    .await?;
    assert!(draw::pool(&env.redis, a.id).await?.is_empty());
    assert!(tickets(&env, a.id).await.is_empty());
    close_draw_window(&env, a.id).await;
    // Loaded after a loss: the drawer ends the wait for queued entries (none here) first.
    let again = draw::draw_with(&env.redis, a.id, Duration::MAX, true).await?;
    assert_eq!(
        again,
        Drawn::Now {
            winners: 0,
            units: 0,
            entrants: 0
        }
    );
    for loser in &losers {
        assert!(draw::pool_entry(&env.redis, a.id, loser)
            .await?
            .is_none_or(|e| !e.won));
    }
    Ok(())
}

/// The draw is recorded, no order is written yet, and Redis loses the sale (it ended meanwhile,
/// so nobody loads it again): the drawer writes the recorded winners' orders from the
/// database alone, their units taken from the database's stock once.
async fn a_recorded_draw_whose_sale_redis_lost_is_ordered_from_the_database(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = drawn_sale(&env).await?;
    assert!(drawing::record(&env.redis, &env.pool, a.id)
        .await?
        .is_some());
    testkit::lose_activity(&env.redis, a.id).await?;

    let run = spawn_drawer(&env, a.id).await??;
    assert_eq!((run.drawn, run.ordered), (Drawn::NotLoaded, 3), "{run:?}");
    assert_eq!(confirmed(&env, a.id).await, 3);
    assert_eq!(testkit::db_remaining(&env, a.id).await, 0);
    let again = spawn_drawer(&env, a.id).await??;
    assert_eq!(again.ordered, 0, "written once: {again:?}");
    Ok(())
}

/// One winner's user holds another live order of the sale (written behind Redis's back), and
/// the drawer dies right after the chunk's commit: the chunk claimed that winner
/// `failed / already_purchased` in its own transaction, so every winner it passed has its row;
/// reconcile then gives that reservation's units back, once, and settles the others.
async fn a_drawer_dead_after_a_chunk_leaves_every_winner_of_it_a_row(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = drawn_sale(&env).await?;
    let winner = draw::pool(&env.redis, a.id)
        .await?
        .into_iter()
        .find(|(_, e)| e.won)
        .map(|(u, _)| u)
        .expect("a winner");
    sqlx::query(
        "insert into orders (request_id, activity_id, user_id, quantity, status,
                             unit_price_minor, currency)
         select gen_random_uuid(), id, $2, 1, 'confirmed', price_minor, currency
         from activities where id = $1",
    )
    .bind(a.id)
    .bind(&winner)
    .execute(&env.pool)
    .await?;

    let paused = pause::arm("draw.orders.after_commit", a.id);
    let drawer = spawn_drawer(&env, a.id);
    assert!(paused.reached_within(Duration::from_secs(10)).await);
    drawer.abort();
    let _ = drawer.await;
    paused.resume();

    let rows = order_rows(&env, a.id).await;
    let claimed: Vec<_> = rows
        .iter()
        .filter(|o| o.failure_reason == Some(FailureReason::AlreadyPurchased))
        .collect();
    assert_eq!(claimed.len(), 1, "{rows:?}");
    assert_eq!(claimed[0].user_id, winner);
    assert_eq!(
        rows.len(),
        4,
        "3 winners' rows and the other order: {rows:?}"
    );

    let report = env
        .reconcile()
        .run(after_grace(env.config.reconcile_grace))
        .await?;
    let r = report.activity(a.id).unwrap();
    assert_eq!(r.compensated, 1, "the claimed winner's units, once: {r:?}");
    assert_eq!(snapshot(&env, a.id).await.pending_count(), 0);
    Ok(())
}

/// Twenty entrants whose entry messages all wait on the queue (no consumer has read one), a
/// grace period of 1 ms, and the window closed: the drawer's run writes the five winners'
/// orders straight from the record, none waits behind an entry and none is given back as
/// expired; the entries read afterwards are kept (the losers') and change no order.
async fn winners_never_expire_behind_an_entry_backlog(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_activity(5, 1).await?;
    for i in 0..20 {
        assert_eq!(
            buy(&app, &a, &format!("e{i}"), None).await.0,
            StatusCode::ACCEPTED
        );
    }
    close_draw_window(&env, a.id).await;
    let report = env
        .reconcile_with(|c| c.config.reconcile_grace = Duration::from_millis(1))
        .run(chrono::Utc::now())
        .await?;
    let r = report.activity(a.id).unwrap();
    assert_eq!(
        (r.winners_ordered, r.compensated, r.orders_pending),
        (5, 0, false),
        "{r:?}"
    );
    assert_eq!(
        draw_entry_rows(&env, a.id).await,
        0,
        "the backlog is all there"
    );
    assert_eq!(confirmed(&env, a.id).await, 5);
    assert_eq!(consume_queue(&env).await?, 0);
    // A winner's entry has its order row: only the fifteen others are kept.
    assert_eq!(draw_entry_rows(&env, a.id).await, 15);
    let rows = order_rows(&env, a.id).await;
    assert!(
        rows.iter().all(|o| o.status == OrderStatus::Confirmed),
        "{rows:?}"
    );
    invariants::check(&env, a.id).await?;
    Ok(())
}
