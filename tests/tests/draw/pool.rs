//! The pool: one entry per user, a loser's `not_drawn`, no request running the draw (the
//! drawer, reconcile, does), a full pool, no entry once the draw started, and a draw in bounded steps
//! others run between; what the pool leaves is sold first come, first served.

use crate::fairness::tickets;
use crate::{draw_started, enter};
use axum::http::StatusCode;
use seckill_shared::infra::pause;
use seckill_shared::protocol::purchase::Outcome;
use seckill_shared::store::draw;
use seckill_shared::store::draw::Drawn;
use seckill_shared::store::view;
use std::collections::HashSet;
use std::time::Duration;
use testkit::call;
use testkit::invariants;
use testkit::on_every_redis;
use testkit::request;
use testkit::RedisKind;
use testkit::TestEnv;
use testkit::{
    buy, call_with_headers, close_draw_window, consume_queue, draw_entry_rows, my_status, snapshot,
};
use uuid::Uuid;

on_every_redis!(
    the_draw_runs_in_bounded_steps_that_others_run_between,
    a_status_read_across_the_draw_answers_what_the_draw_decided,
    a_full_pool_refuses_the_next_entrant_and_changes_nothing,
    no_entry_after_the_first_draw_step_whatever_the_clock,
    the_pool_takes_one_entry_per_user_and_what_it_leaves_is_sold_first_come,
    losers_read_not_drawn_and_a_purchase_before_the_drawer_ran_reserves_nothing,
);

/// The pool: one entry per user (a second attempt is `already_purchased`, the same request
/// run twice is `queued` again), a wrong quantity refused as ever, no stock taken. After
/// the window: a queued user asking for their status reads `queued` and runs no step, a
/// purchase answers `draw_running`; the drawer (reconcile's run) draws and sends the winners;
/// with fewer entrants than units every entrant wins and the rest is sold first come, first
/// served; the draw run again changes nothing.
async fn the_pool_takes_one_entry_per_user_and_what_it_leaves_is_sold_first_come(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_activity(10, 2).await?;

    let (status, body) = buy(&app, &a, "alice", Some(r#"{"quantity": 2}"#)).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::ACCEPTED, Some("queued")),
        "{body}"
    );
    let (status, body) = buy(&app, &a, "alice", None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("already_purchased"))
    );
    let (status, body) = buy(&app, &a, "bob", Some(r#"{"quantity": 3}"#)).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("quantity_exceeds_limit"))
    );
    assert_eq!(buy(&app, &a, "carol", None).await.0, StatusCode::ACCEPTED);
    assert_eq!(my_status(&app, &a, "alice").await, "queued");
    assert_eq!(my_status(&app, &a, "bob").await, "none");
    assert_eq!(draw::pool(&env.redis, a.id).await?.len(), 2);
    assert_eq!(
        view::stock(&env.redis, a.id).await?,
        Some(10),
        "the pool takes no stock"
    );
    assert_eq!(
        consume_queue(&env).await?,
        0,
        "no order message before the draw (the entries' are kept)"
    );
    assert_eq!(
        draw_entry_rows(&env, a.id).await,
        2,
        "each entry is kept once"
    );

    close_draw_window(&env, a.id).await;
    // Before the drawer runs: a status read is `queued` and a purchase waits; neither draws.
    let before = snapshot(&env, a.id).await;
    assert_eq!(my_status(&app, &a, "alice").await, "queued");
    let (status, body) = buy(&app, &a, "bob", None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("draw_running")),
        "{body}"
    );
    assert_eq!(snapshot(&env, a.id).await, before, "no request ran a step");
    assert!(!draw_started(&env, a.id).await?);
    let drawn = env.reconcile().run(chrono::Utc::now()).await?;
    assert_eq!(drawn.activity(a.id).unwrap().winners_ordered, 2);
    assert_eq!(view::stock(&env.redis, a.id).await?, Some(7));
    assert_eq!(consume_queue(&env).await?, 0, "no winner crosses the queue");
    assert_eq!(my_status(&app, &a, "alice").await, "confirmed");
    assert_eq!(my_status(&app, &a, "carol").await, "confirmed");

    // The 7 left go first come, first served; an entrant cannot buy again.
    let (status, body) = buy(&app, &a, "alice", None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("already_purchased"))
    );
    let (status, body) = buy(&app, &a, "bob", Some(r#"{"quantity": 2}"#)).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::ACCEPTED, Some("pending")),
        "{body}"
    );
    assert_eq!(consume_queue(&env).await?, 1);
    assert_eq!(view::stock(&env.redis, a.id).await?, Some(5));

    let before = snapshot(&env, a.id).await;
    assert_eq!(
        draw::draw(&env.redis, a.id, Duration::MAX).await?,
        Drawn::Before { entrants: 2 }
    );
    assert_eq!(snapshot(&env, a.id).await, before);
    invariants::check(&env, a.id).await?;
    Ok(())
}

/// More entrants than units: the losers read `not_drawn`, final (their purchase after the
/// draw is refused), the winners get their orders once the drawer's run sent them. A purchase
/// after the window and before the drawer ran answers `draw_running` and reserves nothing;
/// after the draw it is served first come, first served.
async fn losers_read_not_drawn_and_a_purchase_before_the_drawer_ran_reserves_nothing(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_activity(3, 1).await?;
    let users: Vec<String> = (0..8).map(|i| format!("entrant-{i}")).collect();
    for u in &users {
        assert_eq!(buy(&app, &a, u, None).await.0, StatusCode::ACCEPTED);
    }
    close_draw_window(&env, a.id).await;
    let (status, body) = buy(&app, &a, "late", None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("draw_running")),
        "{body}"
    );
    assert_eq!(view::stock(&env.redis, a.id).await?, Some(3));
    assert!(!draw_started(&env, a.id).await?);
    env.reconcile().run(chrono::Utc::now()).await?;
    assert_eq!(consume_queue(&env).await?, 0, "the drawer wrote the orders");
    let mut statuses = Vec::new();
    for u in &users {
        statuses.push(my_status(&app, &a, u).await);
    }
    assert_eq!(
        statuses.iter().filter(|s| *s == "confirmed").count(),
        3,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| *s == "not_drawn").count(),
        5,
        "{statuses:?}"
    );
    let loser = &users[statuses.iter().position(|s| s == "not_drawn").unwrap()];
    let (status, body) = buy(&app, &a, loser, None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("already_purchased"))
    );
    let (status, body) = buy(&app, &a, "late", None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("sold_out")),
        "{body}"
    );
    invariants::check(&env, a.id).await?;
    Ok(())
}

/// A queued user asking for their status reads their entry `q`, and pauses; the drawer runs
/// the draw meanwhile and the user wins. The answer is the winner's `pending`, never
/// `not_drawn`, which is final.
async fn a_status_read_across_the_draw_answers_what_the_draw_decided(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_activity(5, 1).await?;
    assert_eq!(buy(&app, &a, "alice", None).await.0, StatusCode::ACCEPTED);
    close_draw_window(&env, a.id).await;
    let paused = pause::arm("entry.my_order.after_pool_read", a.id);
    let asking = {
        let (app, a) = (app.clone(), a.clone());
        tokio::spawn(async move { my_status(&app, &a, "alice").await })
    };
    assert!(paused.reached_within(Duration::from_secs(10)).await);
    // The drawer, held before its record: the winner's reservation stays `pending`.
    let held = pause::arm("draw.record.before_commit", a.id);
    let drawer = {
        let env = env.clone();
        tokio::spawn(async move { env.reconcile().run(chrono::Utc::now()).await })
    };
    assert!(held.reached_within(Duration::from_secs(10)).await);
    assert!(
        draw::pool_entry(&env.redis, a.id, "alice")
            .await?
            .unwrap()
            .won
    );
    paused.resume();
    assert_eq!(asking.await?, "pending");
    held.resume();
    drawer.await??;
    Ok(())
}

/// A draw sale's pool takes `maxEntrants` entrants: the next is refused 409 `pool_full` and
/// nothing is written (no pool entry, no ticket, no rank); an entrant already in it is still
/// `queued` on a retry, and one whose entry left after a 503 may come back. The admin API
/// refuses a maxEntrants out of bounds, and a raise lets the next entrant in.
async fn a_full_pool_refuses_the_next_entrant_and_changes_nothing(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let now = chrono::Utc::now();
    let new = |max_entrants: i64| {
        testkit::new_activity()
            .title("small pool")
            .stock(2)
            .limit(1)
            .window(
                now - chrono::Duration::seconds(1),
                now + chrono::Duration::hours(1),
            )
            .draw(600_000)
            .rate(0)
            .max_entrants(max_entrants)
            .build()
    };
    for bad in [0, -1, 10_000_001] {
        let e = new(bad).settings().unwrap_err();
        assert!(e.0.contains("maxEntrants"), "{e}");
    }
    let a = env.load_new(&new(3)).await?;
    let mut first = None;
    for user in ["u1", "u2", "u3"] {
        let (status, body) = buy(&app, &a, user, None).await;
        assert_eq!(
            (status, body["status"].as_str()),
            (StatusCode::ACCEPTED, Some("queued"))
        );
        first.get_or_insert(body["requestId"].as_str().unwrap().parse::<Uuid>()?);
    }
    let before = (
        draw::pool(&env.redis, a.id).await?.len(),
        tickets(&env, a.id).await.len(),
    );
    let (status, body) = buy(&app, &a, "u4", None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("pool_full")),
        "{body}"
    );
    assert_eq!(
        (
            draw::pool(&env.redis, a.id).await?.len(),
            tickets(&env, a.id).await.len()
        ),
        before
    );
    assert!(draw::pool_entry(&env.redis, a.id, "u4").await?.is_none());
    // An entrant in the pool is answered as before; one taken back comes back.
    let (status, _) = buy(&app, &a, "u2", None).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a second entry is already_purchased"
    );
    assert!(draw::leave(&env.redis, a.id, "u1", first.unwrap()).await?);
    let (status, body) = buy(&app, &a, "u1", None).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::ACCEPTED, Some("queued"))
    );
    // Out of bounds through the admin API: 400, nothing changed. A raise reaches Redis with
    // the admin's change.
    let admin = env.admin_router();
    let ops = Some(("ops", "seckill:admin"));
    let path = format!("/admin/activities/{}", a.id);
    let (status, body) = call(
        &admin,
        request("PUT", &path, ops, Some(r#"{"maxEntrants": 0}"#)),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("bad_request")),
        "{body}"
    );
    let (status, body) = call(
        &admin,
        request("PUT", &path, ops, Some(r#"{"maxEntrants": 4}"#)),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["maxEntrants"], 4, "{body}");
    let (status, body) = buy(&app, &a, "u4", None).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::ACCEPTED, Some("queued")),
        "{body}"
    );
    Ok(())
}

/// Once a draw step ran the pool is closed, even should the server's clock go back before the
/// window's end (a failover to a replica whose clock is behind): an entry then would land
/// below the cursor and never be looked at. The purchase is told `draw_due` and writes nothing.
async fn no_entry_after_the_first_draw_step_whatever_the_clock(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.draw_activity(2 * draw::STEP_TICKETS as i64, 1).await?;
    for i in 0..3 * draw::STEP_TICKETS {
        enter(&env, a.id, &format!("e{i}")).await;
    }
    close_draw_window(&env, a.id).await;
    let first = draw::draw(&env.redis, a.id, Duration::ZERO).await?;
    assert!(matches!(first, Drawn::Running { .. }), "{first:?}");
    // The clock "goes back": the window's end lies ahead again.
    let k = env.redis.keys(a.id);
    let ahead = chrono::Utc::now().timestamp_millis() + 600_000;
    testkit::set_term(&mut env.redis.conn.clone(), &k.meta, "drawEndMs", ahead).await?;
    assert_eq!(enter(&env, a.id, "late").await, Outcome::DrawDue);
    assert!(!tickets(&env, a.id).await.contains_key("late"));
    assert!(draw::pool_entry(&env.redis, a.id, "late").await?.is_none());
    Ok(())
}

/// The draw runs in steps of at most `STEP_TICKETS` tickets, each atomic, from a cursor in
/// Redis, by the drawer alone. The drawer (reconcile's run) is paused between its first two
/// steps while others act: a direct purchase is told `draw_due` and changes nothing, a
/// purchase through HTTP answers 409 `draw_running` with `Retry-After: 1`, reserves nothing and
/// runs no step, a queued entrant's status read is `queued` and runs none either, an entry
/// beyond the cursor is taken back (a 503's clean-up). The winners are exactly the lowest
/// tickets of the entries still in the pool, as many as the stock.
async fn the_draw_runs_in_bounded_steps_that_others_run_between(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let entrants = 3 * draw::STEP_TICKETS + 17;
    // Stock for more than one step's tickets: the draw needs several steps.
    let stock = (2 * draw::STEP_TICKETS) as i64;
    let a = env.draw_activity(stock, 1).await?;
    let users: Vec<String> = (0..entrants).map(|i| format!("e{i:04}")).collect();
    for user in &users {
        assert!(matches!(
            enter(&env, a.id, user).await,
            Outcome::Queued { .. }
        ));
    }
    close_draw_window(&env, a.id).await;
    let mut order: Vec<(i64, String)> = tickets(&env, a.id)
        .await
        .into_iter()
        .map(|(u, t)| (t, u))
        .collect();
    order.sort();

    let paused = pause::arm("draw.between_steps", a.id);
    let drawer = {
        let env = env.clone();
        tokio::spawn(async move { env.reconcile().run(chrono::Utc::now()).await })
    };
    assert!(paused.reached_within(Duration::from_secs(10)).await);
    let k = env.redis.keys(a.id);
    let cursor = || async {
        let at: i64 = env
            .redis
            .cmd(redis::cmd("HGET").arg(&k.meta).arg("drawAt"))
            .await
            .unwrap();
        at
    };
    assert_eq!(
        cursor().await,
        1 + draw::STEP_TICKETS as i64,
        "one step looked at STEP_TICKETS tickets"
    );
    let stock_between = view::stock(&env.redis, a.id).await?;
    assert_eq!(stock_between, Some(stock - draw::STEP_TICKETS as i64));

    assert_eq!(enter(&env, a.id, "another").await, Outcome::DrawDue);
    let path = format!("/activities/{}/orders", a.id);
    let (status, headers, body) =
        call_with_headers(&app, request("POST", &path, Some(("latecomer", "")), None)).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("draw_running")),
        "{body}"
    );
    assert_eq!(
        headers.get("retry-after").map(|v| v.to_str().unwrap()),
        Some("1")
    );
    let beyond = &order[draw::STEP_TICKETS + 7].1;
    assert_eq!(my_status(&app, &a, beyond).await, "queued");
    assert_eq!(
        cursor().await,
        1 + draw::STEP_TICKETS as i64,
        "no request ran a step"
    );
    let taken_back = &order[draw::STEP_TICKETS + 5].1;
    let entry = draw::pool_entry(&env.redis, a.id, taken_back)
        .await?
        .unwrap();
    assert!(draw::leave(&env.redis, a.id, taken_back, entry.request_id).await?);
    assert_eq!(view::stock(&env.redis, a.id).await?, stock_between);
    paused.resume();
    drawer.await??;
    let rest = draw::draw(&env.redis, a.id, Duration::MAX).await?;
    assert!(rest.is_done(), "{rest:?}");
    let won: HashSet<String> = draw::pool(&env.redis, a.id)
        .await?
        .into_iter()
        .filter(|(_, e)| e.won)
        .map(|(u, _)| u)
        .collect();
    let want: HashSet<String> = order
        .iter()
        .map(|(_, u)| u.clone())
        .filter(|u| u != taken_back)
        .take(stock as usize)
        .collect();
    assert_eq!(won, want);
    assert_eq!(view::stock(&env.redis, a.id).await?, Some(0));
    invariants::check(&env, a.id).await?;
    Ok(())
}
