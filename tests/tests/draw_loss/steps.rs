//! Redis loses the sale at each step of the draw: inside the window, between the record and the
//! orders, after the orders, in a failover that lost the draw, a draw that is not the recorded
//! one, a lower while the sale is lost, a record of a draw lost meanwhile.

use crate::{
    closed_window, dump_activity, entrants, every_entrant_ends_drawn_or_not, lose_and_reload,
    lowest_tickets, restore_activity, winners_in_pool, write_winners,
};
use seckill_shared::domain::settings::ActivityPatch;
use seckill_shared::domain::status::OrderStatus;
use seckill_shared::infra::pause;
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol::draw as drawing;
use seckill_shared::protocol::load;
use seckill_shared::store::draw::{self, Drawn};
use seckill_shared::store::view;
use std::collections::BTreeSet;
use std::time::Duration;
use testkit::on_every_redis;
use testkit::{close_draw_window, consume_queue, draw_entry_rows, my_status, order_rows};
use testkit::{lose_activity, RedisKind, TestEnv};

on_every_redis!(
    entries_survive_a_loss_inside_the_window,
    a_loss_between_the_record_and_the_orders_keeps_the_recorded_winners,
    a_loss_after_the_orders_loads_each_winner_as_a_buyer,
    a_failover_that_lost_the_draw_draws_the_same_winners,
    a_draw_that_is_not_the_recorded_one_orders_nothing,
    a_record_of_a_draw_lost_meanwhile_writes_nothing,
    a_lower_while_the_sale_is_lost_leaves_the_winners_their_units,
);

/// Redis loses the sale inside the window twice over: entries kept before the loss come back
/// with the load, an entry whose message the consumer reads only after the reload is put
/// back by the consumer, and entries after the reload join them. The draw runs over all of
/// them: exactly the stock wins (the lowest tickets), every other entrant reads `not_drawn`.
async fn entries_survive_a_loss_inside_the_window(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_activity(3, 1).await?;
    let mut users = entrants(&app, &a, "kept", 6).await;
    assert_eq!(consume_queue(&env).await?, 0);
    assert_eq!(draw_entry_rows(&env, a.id).await, 6);
    // Its message is still on the queue when Redis loses the sale.
    users.extend(entrants(&app, &a, "inflight", 1).await);

    lose_and_reload(&env, &a).await;
    let pool = draw::pool(&env.redis, a.id).await?;
    assert_eq!(pool.len(), 6, "the kept entries are back: {pool:?}");
    assert_eq!(
        my_status(&app, &a, "kept0").await,
        "queued",
        "an entrant from before the loss"
    );
    assert_eq!(consume_queue(&env).await?, 0);
    assert_eq!(
        draw::pool(&env.redis, a.id).await?.len(),
        7,
        "the consumer put its entry back"
    );
    users.extend(entrants(&app, &a, "after", 2).await);
    lose_and_reload(&env, &a).await;
    assert_eq!(consume_queue(&env).await?, 0);
    assert_eq!(draw::pool(&env.redis, a.id).await?.len(), 9);
    assert_eq!(draw_entry_rows(&env, a.id).await, 9);

    close_draw_window(&env, a.id).await;
    let expected = lowest_tickets(&env, &a, &users, 3).await;
    let winners = every_entrant_ends_drawn_or_not(&env, &app, &a, &users).await;
    assert_eq!(winners, expected, "the lowest tickets of every entrant won");
    Ok(())
}

/// The draw's outcome is committed, and Redis loses the sale before the drawer marks it or
/// writes any order (paused there). The load finds the outcome: the sale is drawn, the winners
/// are put back with their reservations and their units left out of the stock, the other
/// entrants read `not_drawn`, and no second draw runs. The drawer resumed writes the recorded
/// winners' orders and settles the reservations the load put back.
async fn a_loss_between_the_record_and_the_orders_keeps_the_recorded_winners(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let (a, users) = closed_window(&env, &app, 3, 8).await?;
    let drawn = draw::draw(&env.redis, a.id, Duration::MAX).await?;
    assert!(drawn.is_done(), "{drawn:?}");
    let first: BTreeSet<String> = winners_in_pool(&env, &a).await;

    let paused = pause::arm("draw.record.after_commit", a.id);
    let drawer = testkit::spawn_drawer(&env, a.id);
    assert!(paused.reached_within(Duration::from_secs(10)).await);
    lose_and_reload(&env, &a).await;
    assert_eq!(
        draw::draw(&env.redis, a.id, Duration::MAX).await?,
        Drawn::Before { entrants: 8 },
        "the sale is loaded drawn: no second draw"
    );
    assert_eq!(winners_in_pool(&env, &a).await, first);
    assert_eq!(
        view::stock(&env.redis, a.id).await?,
        Some(0),
        "the winners' units are theirs"
    );
    paused.resume();
    let run = drawer.await??;
    assert_eq!((run.ordered, run.written), (3, true), "{run:?}");
    assert_eq!(
        testkit::snapshot(&env, a.id).await.pending_count(),
        0,
        "the reservations put back are settled"
    );

    let winners = every_entrant_ends_drawn_or_not(&env, &app, &a, &users).await;
    assert_eq!(winners, first);
    Ok(())
}

/// The winners' orders are written, and Redis loses the sale: the load finds every recorded
/// winner with an order, puts none back as a reservation and takes no unit for them; they are
/// buyers of the sale like any other (they cannot buy again), and the drawer's next run writes
/// nothing more.
async fn a_loss_after_the_orders_loads_each_winner_as_a_buyer(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let (a, users) = closed_window(&env, &app, 3, 8).await?;
    // A status read runs no step; the drawer's run draws, records and writes the orders.
    assert_eq!(my_status(&app, &a, "e0").await, "queued");
    write_winners(&env, &a).await;
    let first = winners_in_pool(&env, &a).await;
    assert_eq!(first.len(), 3);

    lose_and_reload(&env, &a).await;
    assert_eq!(testkit::snapshot(&env, a.id).await.pending_count(), 0);
    assert_eq!(view::stock(&env.redis, a.id).await?, Some(0));
    let winner = first.iter().next().unwrap();
    let (status, body) = testkit::buy(&app, &a, winner, None).await;
    assert_eq!(status, axum::http::StatusCode::CONFLICT, "{body}");
    let run = env.reconcile().run(chrono::Utc::now()).await?;
    assert_eq!(run.activity(a.id).unwrap().winners_ordered, 0);
    let rows = order_rows(&env, a.id).await;
    assert_eq!(rows.len(), 3, "{rows:?}");
    let ordered: BTreeSet<String> = rows.into_iter().map(|o| o.user_id).collect();
    assert_eq!(ordered, first);
    assert!(users.iter().all(|u| !u.is_empty()));
    Ok(())
}

/// A failover to a replica that lost the draw's writes: the sale's keys go back to what they
/// held before the draw (a dump taken then), after the draw was recorded and its winners'
/// orders written. The draw runs again over the same pool and, the tickets being the same,
/// picks the same winners; the record finds them its own, and no order is written twice. No
/// second, different draw.
async fn a_failover_that_lost_the_draw_draws_the_same_winners(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let (a, users) = closed_window(&env, &app, 3, 8).await?;
    let before = dump_activity(&env, &a).await;

    assert_eq!(my_status(&app, &a, "e0").await, "queued");
    write_winners(&env, &a).await;
    let first = winners_in_pool(&env, &a).await;
    assert_eq!(consume_queue(&env).await?, 0, "no winner crosses the queue");

    restore_activity(&env, &before).await;
    assert!(
        winners_in_pool(&env, &a).await.is_empty(),
        "the draw's writes are lost"
    );
    let winners = every_entrant_ends_drawn_or_not(&env, &app, &a, &users).await;
    assert_eq!(winners, first, "the same winners");
    let recorded: i64 =
        sqlx::query_scalar("select count(*) from draw_winners where activity_id = $1")
            .bind(a.id)
            .fetch_one(&env.pool)
            .await?;
    assert_eq!(recorded, 3);
    assert_eq!(
        order_rows(&env, a.id).await.len(),
        3,
        "each winner ordered once"
    );
    Ok(())
}

/// Redis holds a draw whose winners are not the recorded ones (a pool changed under a draw run
/// again): the record refuses it and no order is written from it. Reconcile then loads the
/// sale from scratch, which puts the recorded outcome back, and writes the recorded winners'
/// orders: they, and only they, get the orders.
async fn a_draw_that_is_not_the_recorded_one_orders_nothing(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let (a, _) = closed_window(&env, &app, 2, 5).await?;
    let before = dump_activity(&env, &a).await;
    assert!(draw::draw(&env.redis, a.id, Duration::MAX).await?.is_done());
    assert!(drawing::record(&env.redis, &env.pool, a.id)
        .await?
        .is_some());
    let first = winners_in_pool(&env, &a).await;

    restore_activity(&env, &before).await;
    // One of the recorded winners is out of the pool this time.
    let gone = first.iter().next().unwrap().clone();
    let k = env.redis.keys(a.id);
    let _: i64 = env
        .redis
        .cmd(redis::cmd("HDEL").arg(&k.pool).arg(&gone))
        .await?;
    assert!(draw::draw(&env.redis, a.id, Duration::MAX).await?.is_done());
    let err = drawing::record(&env.redis, &env.pool, a.id)
        .await
        .expect_err("a draw that is not the recorded one");
    assert!(
        matches!(err, drawing::DrawError::Diverged { unrecorded: 1 }),
        "{err}"
    );
    assert!(order_rows(&env, a.id).await.is_empty(), "nothing ordered");

    let report = env.reconcile().run(chrono::Utc::now()).await?;
    let r = report.activity(a.id).unwrap();
    assert!(r.draw_reloaded, "{r:?}");
    assert_eq!(r.winners_ordered, 0, "{r:?}");
    assert_eq!(winners_in_pool(&env, &a).await, first);
    // The reloaded sale's winners are ordered by the next drawer (reconcile's next run).
    let next = env.reconcile().run(chrono::Utc::now()).await?;
    assert_eq!(next.activity(a.id).unwrap().winners_ordered, 2);
    assert_eq!(consume_queue(&env).await?, 0);
    let ordered: BTreeSet<String> = order_rows(&env, a.id)
        .await
        .into_iter()
        .filter(|o| o.status == OrderStatus::Confirmed)
        .map(|o| o.user_id)
        .collect();
    assert_eq!(ordered, first);
    Ok(())
}

/// The draw is recorded, and Redis loses the sale before any winner's order is written. An admin lower
/// while the sale is not loaded may not take the units the record holds: the database's
/// remaining stock still counts them, but they are the winners'. A lower within what is left is
/// applied; the sale loaded again sells the winners their units, and its stock is never below
/// zero.
async fn a_lower_while_the_sale_is_lost_leaves_the_winners_their_units(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let (a, users) = closed_window(&env, &app, 3, 8).await?;
    assert!(draw::draw(&env.redis, a.id, Duration::MAX).await?.is_done());
    assert!(drawing::record(&env.redis, &env.pool, a.id)
        .await?
        .is_some());
    let first = winners_in_pool(&env, &a).await;
    assert_eq!(first.len(), 3);
    // One unit more than the winners took: a lower may take that one.
    let admin = env.admin_state();
    let total = |n| ActivityPatch {
        total_stock: Some(n),
        ..ActivityPatch::default()
    };
    admin::update_activity(&admin, a.id, &total(4)).await?;
    lose_activity(&env.redis, a.id).await?;

    let refused = admin::update_activity(&admin, a.id, &total(2)).await;
    assert!(refused.is_err(), "the winners' units are not for sale");
    admin::update_activity(&admin, a.id, &total(3)).await?;

    let (pool, redis) = env.login(Function::Preheat);
    load::load_under_lock(
        &redis,
        &pool,
        &env.config,
        a.id,
        testkit::a_minute_from_now(),
    )
    .await?;
    assert_eq!(view::stock(&env.redis, a.id).await?, Some(0));
    let a = seckill_shared::domain::activity::get(&env.pool, a.id)
        .await?
        .unwrap();
    let winners = every_entrant_ends_drawn_or_not(&env, &app, &a, &users).await;
    assert_eq!(winners, first);
    Ok(())
}

/// A drawer reads the draw and pauses before it records it; meanwhile Redis loses the sale
/// and the load (a new load epoch) finds no outcome. Resumed, the record of the draw that is
/// gone writes nothing, no outcome and no order; the draw runs again over the kept entries and
/// its outcome, the same winners, is the one recorded and ordered.
async fn a_record_of_a_draw_lost_meanwhile_writes_nothing(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let (a, users) = closed_window(&env, &app, 3, 8).await?;
    assert!(draw::draw(&env.redis, a.id, Duration::MAX).await?.is_done());
    let first = winners_in_pool(&env, &a).await;

    let paused = pause::arm("draw.record.before_commit", a.id);
    let drawer = testkit::spawn_drawer(&env, a.id);
    assert!(paused.reached_within(Duration::from_secs(10)).await);
    lose_and_reload(&env, &a).await;
    paused.resume();
    let run = drawer.await??;
    assert_eq!(run.ordered, 0, "{run:?}");
    assert!(order_rows(&env, a.id).await.is_empty());
    let outcomes: i64 =
        sqlx::query_scalar("select count(*) from draw_outcomes where activity_id = $1")
            .bind(a.id)
            .fetch_one(&env.pool)
            .await?;
    assert_eq!(outcomes, 0, "the draw that is gone is not recorded");

    close_draw_window(&env, a.id).await;
    let winners = every_entrant_ends_drawn_or_not(&env, &app, &a, &users).await;
    assert_eq!(winners, first, "the same tickets, the same winners");
    Ok(())
}
