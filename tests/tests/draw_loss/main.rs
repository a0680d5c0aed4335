//! A draw sale whose Redis keys are lost, against real Redis (standalone and cluster),
//! PostgreSQL and the SQS emulator: every entry answered 202 `queued` is kept by the database
//! and put back by the load, the draw's outcome is recorded before any winner's order is
//! written from it and a load after it marks the sale drawn with the recorded winners, and a Redis that lost the draw's
//! writes draws the same winners again. Each ends with exactly the stock in orders and
//! `not_drawn` for every other entrant; none reads `none`.
//!
//! Here the helpers every part shares (a closed window, the loss and the reload, the checks of each
//! entrant); a loss at each of the draw's [`steps`], with entries still queued ([`backlog`]),
//! and the pool's [`rebuilds`].

mod backlog;
mod rebuilds;
mod steps;

use axum::http::StatusCode;
use axum::Router;
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::status::OrderStatus;
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol::load;
use seckill_shared::store::draw::{self};
use seckill_shared::store::view;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use testkit::{buy, close_draw_window, consume_queue, my_status, order_rows};
use testkit::{lose_activity, TestEnv};

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
    let a = env.draw_activity(stock, 1).await?;
    let users = entrants(app, &a, "e", n).await;
    consume_queue(env).await?;
    close_draw_window(env, a.id).await;
    Ok((a, users))
}

/// Redis loses the sale and the next load (preheat's, reconcile's) loads it from scratch.
async fn lose_and_reload(env: &TestEnv, a: &Activity) {
    lose_activity(&env.redis, a.id).await.unwrap();
    let (pool, redis) = env.login(Function::Preheat);
    load::load_under_lock(
        &redis,
        &pool,
        &env.config,
        a.id,
        testkit::a_minute_from_now(),
    )
    .await
    .unwrap();
}

/// The ends every entrant reads once the drawer (reconcile's run) drew, recorded and wrote
/// the winners' orders, and the queue is consumed: each is `confirmed` or `not_drawn`, exactly
/// `stock` confirmed, and the orders in the database are those.
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
    write_winners(env, a).await;
    consume_queue(env).await.unwrap();
    let mut winners = BTreeSet::new();
    for u in users {
        let end = my_status(app, a, u).await;
        assert!(
            end == "confirmed" || end == "not_drawn",
            "{u} reads {end} (before the drawer: {:?})",
            ends[u]
        );
        if end == "confirmed" {
            winners.insert(u.clone());
        }
    }
    assert_eq!(winners.len() as i64, a.total_stock, "{ends:?}");
    let rows = order_rows(env, a.id).await;
    assert!(
        rows.iter().all(|o| o.status == OrderStatus::Confirmed),
        "no order failed: {rows:?}"
    );
    let ordered: BTreeSet<String> = rows.iter().map(|o| o.user_id.clone()).collect();
    assert_eq!(ordered, winners);
    assert_eq!(view::stock(&env.redis, a.id).await.unwrap(), Some(0));
    winners
}

/// Reconcile's next run, the drawer: it draws if the draw is due, records it and writes its
/// winners' orders (no request does any of it); every order is written after it.
async fn write_winners(env: &TestEnv, a: &Activity) {
    let report = env.reconcile().run(chrono::Utc::now()).await.unwrap();
    assert!(report.errors.is_empty(), "{report:?}");
    let r = report.activity(a.id).expect("checked");
    assert!(!r.orders_pending, "{r:?}");
}

/// Each of `users`' ticket, as the sale's `tickets` holds it.
async fn tickets_of(env: &TestEnv, a: &Activity, users: &[String]) -> HashMap<String, i64> {
    let k = env.redis.keys(a.id);
    let mut tickets = HashMap::new();
    for u in users {
        let score: Option<f64> = env
            .redis
            .cmd(redis::cmd("ZSCORE").arg(&k.tickets).arg(u))
            .await
            .unwrap();
        tickets.insert(u.clone(), score.expect("every entrant has a ticket") as i64);
    }
    tickets
}

/// The `n` entrants with the lowest tickets: who a draw over all of `users` picks (one unit
/// each, nobody holding an order before).
async fn lowest_tickets(
    env: &TestEnv,
    a: &Activity,
    users: &[String],
    n: usize,
) -> BTreeSet<String> {
    let tickets = tickets_of(env, a, users).await;
    let mut scored: Vec<(i64, &String)> = users.iter().map(|u| (tickets[u], u)).collect();
    scored.sort();
    scored.into_iter().take(n).map(|(_, u)| u.clone()).collect()
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
async fn dump_activity(env: &TestEnv, a: &Activity) -> Vec<(String, Option<Vec<u8>>)> {
    let k = env.redis.keys(a.id);
    let mut out = Vec::new();
    for key in [
        &k.meta, &k.users, &k.ledger, &k.pool, &k.winners, &k.tickets,
    ] {
        let dump: Option<Vec<u8>> = env.redis.cmd(redis::cmd("DUMP").arg(key)).await.unwrap();
        out.push((key.to_string(), dump));
    }
    out
}

/// Puts the sale's keys back to a [`dump_sale`], as a replica promoted without the writes
/// since would hold them.
async fn restore_activity(env: &TestEnv, dump: &[(String, Option<Vec<u8>>)]) {
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
