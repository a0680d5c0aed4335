//! A draw sale whose Redis keys are lost, against real Redis (standalone and cluster),
//! PostgreSQL and the SQS emulator: every entry answered 202 `queued` is kept by the database
//! and put back by the load, the draw's outcome is recorded before its first send and a load
//! after it marks the sale drawn with the recorded winners, and a Redis that lost the draw's
//! writes draws the same winners again. Each ends with exactly the stock in orders and
//! `not_drawn` for every other entrant; none reads `none`.

use axum::http::StatusCode;
use axum::Router;
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::purchase::{Attempt, MessageKind, OrderMessage};
use seckill_shared::domain::settings::ActivityPatch;
use seckill_shared::infra::pause;
use seckill_shared::protocol::draw as drawing;
use seckill_shared::protocol::load;
use seckill_shared::store::draw::{self, Drawn};
use seckill_shared::store::view;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use testkit::on_both_redis;
use testkit::{lose_sale, RedisKind, TestEnv};

use testkit::{buy, close_draw_window, consume_queue, draw_entry_rows, my_status, order_rows};

/// `n` entrants `prefix0..` through the entry's router, each answered 202 `queued`.
async fn entrants(app: &Router, a: &Activity, prefix: &str, n: usize) -> Vec<String> {
    let mut users = Vec::new();
    for i in 0..n {
        let user = format!("{prefix}{i}");
        let (status, body) = buy(app, a, &user, None).await;
        assert_eq!(
            (status, body["status"].as_str()),
            (StatusCode::ACCEPTED, Some("queued")),
            "{body}"
        );
        users.push(user);
    }
    users
}

/// A draw sale of `stock` units whose `n` entrants (`e0..`) entered through the router and
/// were kept by the consumer, its window closed and its draw not run.
async fn closed_window(
    env: &TestEnv,
    app: &Router,
    stock: i64,
    n: usize,
) -> anyhow::Result<(Activity, Vec<String>)> {
    let a = env.draw_sale(stock, 1).await?;
    let users = entrants(app, &a, "e", n).await;
    consume_queue(env).await?;
    close_draw_window(env, a.id).await;
    Ok((a, users))
}

/// Redis loses the sale and the next load (preheat's, reconcile's) loads it from scratch.
async fn lose_and_reload(env: &TestEnv, a: &Activity) {
    lose_sale(&env.redis, a.id).await.unwrap();
    load::load_under_lock(&env.redis, &env.pool, &env.config, a.id)
        .await
        .unwrap();
}

/// The ends every entrant reads once the winners' messages are consumed: each is `confirmed`
/// or `not_drawn`, exactly `stock` confirmed, and the orders in the database are those.
async fn every_entrant_ends_drawn_or_not(
    env: &TestEnv,
    app: &Router,
    a: &Activity,
    users: &[String],
) -> BTreeSet<String> {
    let mut ends = BTreeMap::new();
    for u in users {
        ends.insert(u.clone(), my_status(app, a, u).await);
    }
    consume_queue(env).await.unwrap();
    let mut winners = BTreeSet::new();
    for u in users {
        let end = my_status(app, a, u).await;
        assert!(
            end == "confirmed" || end == "not_drawn",
            "{u} reads {end} (before the sends: {:?})",
            ends[u]
        );
        if end == "confirmed" {
            winners.insert(u.clone());
        }
    }
    assert_eq!(winners.len() as i64, a.total_stock, "{ends:?}");
    let rows = order_rows(env, a.id).await;
    assert!(
        rows.iter().all(|o| o.status == "confirmed"),
        "no order failed: {rows:?}"
    );
    let ordered: BTreeSet<String> = rows.iter().map(|o| o.user_id.clone()).collect();
    assert_eq!(ordered, winners);
    assert_eq!(view::stock(&env.redis, a.id).await.unwrap(), Some(0));
    winners
}

/// The `n` entrants with the lowest tickets: who a draw over all of `users` picks (one unit
/// each, nobody holding an order before).
async fn lowest_tickets(
    env: &TestEnv,
    a: &Activity,
    users: &[String],
    n: usize,
) -> BTreeSet<String> {
    let k = env.redis.keys(a.id);
    let mut scored = Vec::new();
    for u in users {
        let score: Option<f64> = env
            .redis
            .cmd(redis::cmd("ZSCORE").arg(&k.tickets).arg(u))
            .await
            .unwrap();
        scored.push((score.expect("every entrant has a ticket") as i64, u.clone()));
    }
    scored.sort();
    scored.into_iter().take(n).map(|(_, u)| u).collect()
}

/// Redis loses the sale inside the window twice over: entries kept before the loss come back
/// with the load, an entry whose message the consumer reads only after the reload is put
/// back by the consumer, and entries after the reload join them. The draw runs over all of
/// them: exactly the stock wins (the lowest tickets), every other entrant reads `not_drawn`.
async fn entries_survive_a_loss_inside_the_window(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_sale(3, 1).await?;
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

/// The draw's outcome is committed, and Redis loses the sale before the drainer marks it or
/// sends anything (paused there). The load finds the outcome: the sale is drawn, the winners
/// are put back with their reservations and their units left out of the stock, the other
/// entrants read `not_drawn`, and no second draw runs. The drainer resumed sends the winners
/// the load put back; each gets its order.
async fn a_loss_between_the_record_and_the_sends_keeps_the_recorded_winners(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let (a, users) = closed_window(&env, &app, 3, 8).await?;
    let drawn = draw::draw(&env.redis, a.id, Duration::MAX).await?;
    assert!(drawn.is_done(), "{drawn:?}");
    let first: BTreeSet<String> = winners_in_pool(&env, &a).await;

    let paused = pause::arm("draw.record.after_commit", a.id);
    let drainer = {
        let (redis, db, queue) = (env.redis.clone(), env.pool.clone(), env.queue.clone());
        let id = a.id;
        tokio::spawn(async move { drawing::drain(&redis, &db, &queue, id, usize::MAX).await })
    };
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
    let drained = drainer.await??;
    assert_eq!(drained.sent, 3, "{drained:?}");

    let winners = every_entrant_ends_drawn_or_not(&env, &app, &a, &users).await;
    assert_eq!(winners, first);
    Ok(())
}

/// The winners are sent, and Redis loses the sale before the consumer reads them: the load
/// puts the winners back (none has an order yet) and sends them again. The first messages and
/// the second are one order each, none fails: a winner's order commits under any load epoch,
/// and the stock loaded left its units out.
async fn a_loss_after_the_sends_orders_each_winner_once(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let (a, users) = closed_window(&env, &app, 3, 8).await?;
    // A status read runs the draw, records it and sends the winners.
    assert!(["pending", "not_drawn"].contains(&my_status(&app, &a, "e0").await.as_str()));
    let first = winners_in_pool(&env, &a).await;
    assert_eq!(first.len(), 3);
    assert_eq!(draw::unsent(&env.redis, a.id).await?, 0, "all sent");

    lose_and_reload(&env, &a).await;
    assert_eq!(winners_in_pool(&env, &a).await, first);
    assert_eq!(draw::unsent(&env.redis, a.id).await?, 3, "sent again");
    let winners = every_entrant_ends_drawn_or_not(&env, &app, &a, &users).await;
    assert_eq!(winners, first);
    Ok(())
}

/// A failover to a replica that lost the draw's writes: the sale's keys go back to what they
/// held before the draw (a dump taken then), after the draw was recorded and its winners sent.
/// The draw runs again over the same pool and, the tickets being the same, picks the same
/// winners; the record finds them its own, and the second sends are the same orders. No
/// second, different draw.
async fn a_failover_that_lost_the_draw_draws_the_same_winners(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let (a, users) = closed_window(&env, &app, 3, 8).await?;
    let before = dump_sale(&env, &a).await;

    assert!(["pending", "not_drawn"].contains(&my_status(&app, &a, "e0").await.as_str()));
    let first = winners_in_pool(&env, &a).await;
    assert_eq!(consume_queue(&env).await?, 3);

    restore_sale(&env, &before).await;
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
    Ok(())
}

/// Redis holds a draw whose winners are not the recorded ones (a pool changed under a draw run
/// again): the record refuses it and nothing of it is sent. Reconcile then loads the sale from
/// scratch, which puts the recorded outcome back, and sends the recorded winners: they, and
/// only they, get the orders.
async fn a_draw_that_is_not_the_recorded_one_sends_nothing(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let (a, _) = closed_window(&env, &app, 2, 5).await?;
    let before = dump_sale(&env, &a).await;
    assert!(draw::draw(&env.redis, a.id, Duration::MAX).await?.is_done());
    assert!(drawing::record(&env.redis, &env.pool, a.id)
        .await?
        .is_some());
    let first = winners_in_pool(&env, &a).await;

    restore_sale(&env, &before).await;
    // One of the recorded winners is out of the pool this time.
    let gone = first.iter().next().unwrap().clone();
    let k = env.redis.keys(a.id);
    let _: i64 = env
        .redis
        .cmd(redis::cmd("HDEL").arg(&k.pool).arg(&gone))
        .await?;
    assert!(draw::draw(&env.redis, a.id, Duration::MAX).await?.is_done());
    let err = drawing::drain(&env.redis, &env.pool, &env.queue, a.id, usize::MAX)
        .await
        .expect_err("a draw that is not the recorded one");
    assert!(
        matches!(err, drawing::DrawError::Diverged { unrecorded: 1 }),
        "{err}"
    );
    assert_eq!(consume_queue(&env).await?, 0, "nothing sent");

    let report = env.reconcile().run(chrono::Utc::now()).await?;
    let r = report.activity(a.id).unwrap();
    assert!(r.draw_reloaded, "{r:?}");
    assert_eq!(winners_in_pool(&env, &a).await, first);
    // The reloaded sale's winners go out with the next drainer (reconcile's next run).
    env.reconcile().run(chrono::Utc::now()).await?;
    assert_eq!(consume_queue(&env).await?, 2);
    let ordered: BTreeSet<String> = order_rows(&env, a.id)
        .await
        .into_iter()
        .filter(|o| o.status == "confirmed")
        .map(|o| o.user_id)
        .collect();
    assert_eq!(ordered, first);
    Ok(())
}

/// The draw is recorded, and Redis loses the sale before any winner is sent. An admin lower
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
    lose_sale(&env.redis, a.id).await?;

    let refused = admin::update_activity(&admin, a.id, &total(2)).await;
    assert!(refused.is_err(), "the winners' units are not for sale");
    admin::update_activity(&admin, a.id, &total(3)).await?;

    load::load_under_lock(&env.redis, &env.pool, &env.config, a.id).await?;
    assert_eq!(view::stock(&env.redis, a.id).await?, Some(0));
    let a = seckill_shared::domain::activity::get(&env.pool, a.id)
        .await?
        .unwrap();
    let winners = every_entrant_ends_drawn_or_not(&env, &app, &a, &users).await;
    assert_eq!(winners, first);
    Ok(())
}

/// A drainer reads the draw and pauses before it records it; meanwhile Redis loses the sale
/// and the load (a new load epoch) finds no outcome. Resumed, the record of the draw that is
/// gone writes nothing and sends nothing; the draw runs again over the kept entries and its
/// outcome, the same winners, is the one recorded and sent.
async fn a_record_of_a_draw_lost_meanwhile_writes_nothing(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let (a, users) = closed_window(&env, &app, 3, 8).await?;
    assert!(draw::draw(&env.redis, a.id, Duration::MAX).await?.is_done());
    let first = winners_in_pool(&env, &a).await;

    let paused = pause::arm("draw.record.before_commit", a.id);
    let drainer = {
        let (redis, db, queue) = (env.redis.clone(), env.pool.clone(), env.queue.clone());
        let id = a.id;
        tokio::spawn(async move { drawing::drain(&redis, &db, &queue, id, usize::MAX).await })
    };
    assert!(paused.reached_within(Duration::from_secs(10)).await);
    lose_and_reload(&env, &a).await;
    paused.resume();
    let drained = drainer.await??;
    assert_eq!(drained.sent, 0, "{drained:?}");
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

/// A load's rebuild stops between two chunks (out of its time, or the loader died): the draw
/// waits, and reconcile's next run finishes the rebuild before it runs the draw.
async fn reconcile_finishes_a_rebuild_a_load_left(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.draw_sale(5, 1).await?;
    let n = drawing::REBUILD_CHUNK + 50;
    let users = keep_entries(&env, &a, n).await;
    let cut = pause::arm_failure("draw.rebuild.between_chunks", a.id, 1);
    lose_and_reload(&env, &a).await;
    assert_eq!(cut.hits(), 1);
    assert_eq!(
        draw::pool(&env.redis, a.id).await?.len(),
        drawing::REBUILD_CHUNK
    );
    close_draw_window(&env, a.id).await;
    assert!(matches!(
        draw::draw(&env.redis, a.id, Duration::MAX).await?,
        Drawn::Restoring { .. }
    ));

    let report = env.reconcile().run(chrono::Utc::now()).await?;
    let r = report.activity(a.id).unwrap();
    assert_eq!(r.pool_rebuilt, 50, "{r:?}");
    assert!(r.drawn, "the draw ran after the rebuild: {r:?}");
    assert_eq!(draw::pool(&env.redis, a.id).await?.len(), n);
    assert_eq!(
        winners_in_pool(&env, &a).await,
        lowest_tickets(&env, &a, &users, 5).await
    );
    Ok(())
}

/// A user whose kept entry is not put back yet (the rebuild paused before her chunk) enters
/// again and is queued with a new request. Both are kept; only the newer goes back at the next
/// load from scratch, and it is the one in the pool.
async fn a_user_who_entered_again_during_a_rebuild_goes_back_once(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = Arc::new(TestEnv::new(kind).await?);
    let app = env.entry_router();
    let a = env.draw_sale(5, 1).await?;
    let users = keep_entries(&env, &a, drawing::REBUILD_CHUNK + 50).await;
    let late = users.last().unwrap().clone();
    let paused = pause::arm("draw.rebuild.between_chunks", a.id);
    let loading = {
        let (env, a) = (env.clone(), a.clone());
        tokio::spawn(async move { lose_and_reload(&env, &a).await })
    };
    assert!(paused.reached_within(Duration::from_secs(10)).await);
    let (status, body) = buy(&app, &a, &late, None).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::ACCEPTED, Some("queued")),
        "{body}"
    );
    let again: uuid::Uuid = body["requestId"].as_str().unwrap().parse()?;
    consume_queue(&env).await?;
    paused.resume();
    loading.await?;
    let entry = draw::pool_entry(&env.redis, a.id, &late).await?.unwrap();
    assert_eq!(entry.request_id, again);

    lose_and_reload(&env, &a).await;
    let entry = draw::pool_entry(&env.redis, a.id, &late).await?.unwrap();
    assert_eq!(
        entry.request_id, again,
        "her newer entry is the one put back"
    );
    let kept = seckill_shared::domain::draw::entries_after(&env.pool, a.id, 0, 10_000).await?;
    assert_eq!(
        kept.iter()
            .filter(|e| e.live && e.entry.user_id == late)
            .count(),
        1,
        "one live entry per user goes back"
    );
    Ok(())
}

/// `n` entries kept in the database as the consumer writes them, without the crowd's HTTP:
/// users `u0..`.
async fn keep_entries(env: &TestEnv, a: &Activity, n: usize) -> Vec<String> {
    let users: Vec<String> = (0..n).map(|i| format!("u{i}")).collect();
    sqlx::query(
        "insert into draw_entries (activity_id, user_id, request_id, quantity)
         select $1, u, gen_random_uuid(), 1 from unnest($2::text[]) as u",
    )
    .bind(a.id)
    .bind(&users)
    .execute(&env.pool)
    .await
    .unwrap();
    users
}

/// An entry whose send fails is claimed and taken out of the pool before its 503; its message,
/// stored after all (a send that timed out), is read by the consumer and kept nowhere, and the
/// pool's tombstone keeps the consumer from putting it back. The user enters again and is
/// queued, with the same ticket.
async fn an_entry_answered_503_is_never_put_back(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_sale(3, 1).await?;
    let failed = pause::arm_failure("entry.enter.send", a.id, 1);
    let (status, body) = buy(&app, &a, "alice", None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(failed.hits(), 1);
    assert_eq!(draw::pool_entry(&env.redis, a.id, "alice").await?, None);
    let claimed = order_rows(&env, a.id).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(
        (
            claimed[0].status.as_str(),
            claimed[0].failure_reason.as_deref()
        ),
        ("failed", Some("unavailable"))
    );

    // The message the failed send stored after all.
    let stored = OrderMessage {
        attempt: Attempt {
            request_id: claimed[0].request_id,
            activity_id: a.id,
            user_id: "alice".into(),
            quantity: 1,
            buckets: 1,
        },
        reserved_at_ms: 0,
        load_epoch: None,
        kind: MessageKind::Entry,
    };
    env.consumer().handle_message(&stored).await?;
    assert_eq!(
        draw_entry_rows(&env, a.id).await,
        0,
        "a claimed entry is not kept"
    );
    assert_eq!(draw::pool_entry(&env.redis, a.id, "alice").await?, None);

    let (status, body) = buy(&app, &a, "alice", None).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::ACCEPTED, Some("queued")),
        "{body}"
    );
    assert_eq!(consume_queue(&env).await?, 0);
    assert_eq!(draw_entry_rows(&env, a.id).await, 1);
    Ok(())
}

/// The consumer keeps an entry and pauses before it makes sure of its pool entry; meanwhile
/// Redis loses the sale and the load puts the kept entry back. Resumed, the consumer adds
/// nothing twice: one pool entry, one ticket.
async fn an_entry_kept_during_a_reload_is_in_the_pool_once(kind: RedisKind) -> anyhow::Result<()> {
    let env = Arc::new(TestEnv::new(kind).await?);
    let app = env.entry_router();
    let a = env.draw_sale(3, 1).await?;
    entrants(&app, &a, "e", 1).await;
    let paused = pause::arm("consumer.entry.after_commit", a.id);
    let consuming = {
        let env = env.clone();
        tokio::spawn(async move { consume_queue(&env).await })
    };
    assert!(paused.reached_within(Duration::from_secs(10)).await);
    lose_and_reload(&env, &a).await;
    let pool = draw::pool(&env.redis, a.id).await?;
    assert_eq!(pool.len(), 1, "{pool:?}");
    let rank = pool[0].1.rank;
    paused.resume();
    consuming.await??;
    let pool = draw::pool(&env.redis, a.id).await?;
    assert_eq!(pool.len(), 1, "{pool:?}");
    assert_eq!(pool[0].1.rank, rank, "not made again");
    Ok(())
}

/// A rebuild of many entries paused between two chunks: the draw waits for it (a purchase
/// after the window answers `draw_running`, an entrant from before the loss reads `queued`);
/// resumed, the rebuild finishes and the draw runs over every entry. The purchase's 503
/// clean-up meanwhile takes an old request of a user of the second chunk out of the pool (she
/// was answered 503 once, then entered again): its tombstone does not keep her entry out.
async fn the_draw_waits_for_a_rebuild_between_its_chunks(kind: RedisKind) -> anyhow::Result<()> {
    let env = Arc::new(TestEnv::new(kind).await?);
    let app = env.entry_router();
    let a = env.draw_sale(5, 1).await?;
    let n = drawing::REBUILD_CHUNK + 50;
    let users = keep_entries(&env, &a, n).await;
    let answered_503 = users.last().unwrap().clone();
    sqlx::query(
        "insert into orders (request_id, activity_id, user_id, quantity, status, failure_reason)
         values (gen_random_uuid(), $1, $2, 1, 'failed', 'unavailable')",
    )
    .bind(a.id)
    .bind(&answered_503)
    .execute(&env.pool)
    .await?;

    let paused = pause::arm("draw.rebuild.between_chunks", a.id);
    let loading = {
        let env = env.clone();
        let a = a.clone();
        tokio::spawn(async move { lose_and_reload(&env, &a).await })
    };
    assert!(paused.reached_within(Duration::from_secs(10)).await);
    close_draw_window(&env, a.id).await;
    let (status, body) = buy(&app, &a, "late", None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("draw_running")),
        "{body}"
    );
    assert_eq!(my_status(&app, &a, "u0").await, "queued");
    let k = env.redis.keys(a.id);
    let held: Option<String> = env
        .redis
        .cmd(redis::cmd("HGET").arg(&k.pool).arg(&answered_503))
        .await?;
    assert!(
        held.as_deref().is_some_and(|v| v.ends_with("|x")),
        "not yet put back, her old request's tombstone in its place: {held:?}"
    );
    assert!(matches!(
        draw::draw(&env.redis, a.id, Duration::MAX).await?,
        Drawn::Restoring { .. }
    ));
    paused.resume();
    loading.await?;
    close_draw_window(&env, a.id).await;
    assert_eq!(draw::pool(&env.redis, a.id).await?.len(), n);
    assert!(draw::pool_entry(&env.redis, a.id, &answered_503)
        .await?
        .is_some());
    let expected = lowest_tickets(&env, &a, &users, 5).await;
    assert!(draw::draw(&env.redis, a.id, Duration::MAX).await?.is_done());
    assert_eq!(winners_in_pool(&env, &a).await, expected);
    Ok(())
}

/// The users the pool holds as winners.
async fn winners_in_pool(env: &TestEnv, a: &Activity) -> BTreeSet<String> {
    draw::pool(&env.redis, a.id)
        .await
        .unwrap()
        .into_iter()
        .filter(|(_, e)| e.won)
        .map(|(u, _)| u)
        .collect()
}

/// The sale's keys as they are now (`DUMP`), to go back to.
async fn dump_sale(env: &TestEnv, a: &Activity) -> Vec<(String, Option<Vec<u8>>)> {
    let k = env.redis.keys(a.id);
    let mut out = Vec::new();
    for key in [&k.meta, &k.users, &k.ledger, &k.pool, &k.outbox, &k.tickets] {
        let dump: Option<Vec<u8>> = env.redis.cmd(redis::cmd("DUMP").arg(key)).await.unwrap();
        out.push((key.to_string(), dump));
    }
    out
}

/// Puts the sale's keys back to a [`dump_sale`], as a replica promoted without the writes
/// since would hold them.
async fn restore_sale(env: &TestEnv, dump: &[(String, Option<Vec<u8>>)]) {
    for (key, value) in dump {
        match value {
            Some(v) => {
                let _: () = env
                    .redis
                    .cmd(redis::cmd("RESTORE").arg(key).arg(0).arg(v).arg("REPLACE"))
                    .await
                    .unwrap();
            }
            None => {
                let _: i64 = env.redis.cmd(redis::cmd("DEL").arg(key)).await.unwrap();
            }
        }
    }
}

on_both_redis!(
    entries_survive_a_loss_inside_the_window,
    a_loss_between_the_record_and_the_sends_keeps_the_recorded_winners,
    a_loss_after_the_sends_orders_each_winner_once,
    a_failover_that_lost_the_draw_draws_the_same_winners,
    a_draw_that_is_not_the_recorded_one_sends_nothing,
    an_entry_answered_503_is_never_put_back,
    an_entry_kept_during_a_reload_is_in_the_pool_once,
    the_draw_waits_for_a_rebuild_between_its_chunks,
    a_record_of_a_draw_lost_meanwhile_writes_nothing,
    reconcile_finishes_a_rebuild_a_load_left,
    a_user_who_entered_again_during_a_rebuild_goes_back_once,
    a_lower_while_the_sale_is_lost_leaves_the_winners_their_units,
);
