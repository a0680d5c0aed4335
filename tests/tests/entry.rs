//! The purchase path through the `seckill-entry` router, against real Redis (standalone and
//! cluster), real PostgreSQL and the SQS emulator: concurrency, failure of each dependency,
//! the sold-out cache, and every kind of bad input.

use axum::http::StatusCode;
use axum::Router;
use futures::StreamExt;
use seckill_shared::domain::activity;
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::order;
use seckill_shared::domain::purchase::OrderMessage;
use seckill_shared::infra::pause;
use seckill_shared::infra::sqs::OrderQueue;
use seckill_shared::protocol::cancel;
use seckill_shared::protocol::cancel::CancelOutcome;
use seckill_shared::store::ledger;
use seckill_shared::store::ledger::EntryKind;
use seckill_shared::store::purchase;
use seckill_shared::store::purchase::Reservation;
use seckill_shared::store::view;
use serde_json::Value;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::call;
use testkit::on_both_redis;
use testkit::request;
use testkit::PrivateRedis;
use testkit::RedisKind;
use testkit::TestEnv;
use uuid::Uuid;

use testkit::{
    buy, call_with_headers, consume, counting_pool, db_remaining, orders_in_db, snapshot,
};

fn orders_path(a: &Activity) -> String {
    format!("/activities/{}/orders", a.id)
}

fn messages(raw: &[aws_sdk_sqs::types::Message]) -> Vec<OrderMessage> {
    raw.iter()
        .map(|m| serde_json::from_str(m.body().unwrap()).unwrap())
        .collect()
}

async fn purchase_script_runs_on_any_topology_without_crossslot(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.open_sale(5, 2).await?;

    let decision = testkit::purchase(
        &env.redis,
        a.id,
        "alice",
        2,
        Uuid::new_v4(),
        purchase::far_deadline(),
    )
    .await
    .expect("one script, one hash tag: no CROSSSLOT");

    assert!(matches!(decision, Ok(Reservation { stock_left: 3, .. })));
    let snap = snapshot(&env, a.id).await;
    assert_eq!((snap.stock, snap.participants), (Some(3), 1));
    assert_eq!(snap.pending_quantity(), 2);
    Ok(())
}
on_both_redis!(purchase_script_runs_on_any_topology_without_crossslot);

async fn five_hundred_attempts_from_200_users_sell_exactly_the_stock_of_50(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.open_sale(50, 1).await?;
    let app = env.entry_router();

    let results = futures::future::join_all((0..500).map(|i| {
        let (app, a) = (app.clone(), a.clone());
        tokio::spawn(async move {
            let user = format!("user-{}", i % 200);
            let (status, body) = buy(&app, &a, &user, None).await;
            (user, status, body)
        })
    }))
    .await;

    let accepted: Vec<_> = results
        .into_iter()
        .map(Result::unwrap)
        .filter(|(_, s, _)| *s == StatusCode::ACCEPTED)
        .collect();
    assert_eq!(accepted.len(), 50);
    let users: HashSet<_> = accepted.iter().map(|(u, _, _)| u.clone()).collect();
    assert_eq!(users.len(), 50, "no user twice");
    let snap = snapshot(&env, a.id).await;
    assert_eq!(snap.stock, Some(0));
    assert_eq!(snap.pending_count(), 50);
    let ledger_users: HashSet<_> = snap.ledger.iter().map(|e| e.user_id.clone()).collect();
    assert_eq!(ledger_users, users);
    let request_ids: HashSet<String> = accepted
        .iter()
        .map(|(_, _, b)| b["requestId"].as_str().unwrap().to_string())
        .collect();
    let sent = messages(&env.drain_messages(200).await?);
    let sent_ids: HashSet<String> = sent
        .iter()
        .map(|m| m.attempt.request_id.to_string())
        .collect();
    assert_eq!(sent.len(), 50);
    assert_eq!(sent_ids, request_ids, "one message per accepted purchase");
    Ok(())
}
on_both_redis!(five_hundred_attempts_from_200_users_sell_exactly_the_stock_of_50);

async fn ten_thousand_requests_from_2000_users_sell_exactly_100_and_stock_never_goes_negative(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await.unwrap();
    let a = env.open_sale(100, 1).await.unwrap();
    let app = env.entry_router();
    let done = Arc::new(AtomicBool::new(false));
    let lowest = Arc::new(AtomicI64::new(i64::MAX));
    let sampler = {
        let (redis, done, lowest, id) = (env.redis.clone(), done.clone(), lowest.clone(), a.id);
        tokio::spawn(async move {
            let mut samples = 0;
            while !done.load(Ordering::Relaxed) {
                if let Ok(Some(stock)) = view::stock(&redis, id).await {
                    lowest.fetch_min(stock, Ordering::Relaxed);
                    samples += 1;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            samples
        })
    };

    let started = Instant::now();
    let results: Vec<(String, StatusCode, Value)> = futures::stream::iter(0..10_000)
        .map(|i| {
            let (app, a) = (app.clone(), a.clone());
            async move {
                let user = format!("user-{}", i % 2000);
                let (status, body) = buy(&app, &a, &user, None).await;
                (user, status, body)
            }
        })
        .buffer_unordered(200)
        .collect()
        .await;
    done.store(true, Ordering::Relaxed);
    let samples = sampler.await.unwrap();
    eprintln!(
        "10,000 requests in {:?}, {samples} stock samples",
        started.elapsed()
    );

    let accepted: Vec<_> = results
        .iter()
        .filter(|(_, s, _)| *s == StatusCode::ACCEPTED)
        .collect();
    assert_eq!(accepted.len(), 100);
    let users: HashSet<_> = accepted.iter().map(|(u, _, _)| u).collect();
    assert_eq!(users.len(), 100, "no user twice");
    for (_, status, body) in &results {
        assert!(
            *status == StatusCode::ACCEPTED || *status == StatusCode::CONFLICT,
            "{status} {body}"
        );
    }
    assert!(samples > 0);
    assert!(
        lowest.load(Ordering::Relaxed) >= 0,
        "Redis stock went below 0"
    );
    let snap = snapshot(&env, a.id).await;
    assert_eq!(snap.stock, Some(0));
    // Conservation with nothing consumed yet: stock + pending = total.
    assert_eq!(snap.stock.unwrap() + snap.pending_quantity(), 100);
    assert_eq!(messages(&env.drain_messages(200).await.unwrap()).len(), 100);
    Ok(())
}
on_both_redis!(
    ten_thousand_requests_from_2000_users_sell_exactly_100_and_stock_never_goes_negative
);

async fn one_user_sending_100_requests_in_parallel_gets_exactly_one_202(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.open_sale(10, 1).await?;
    let app = env.entry_router();

    let results = futures::future::join_all((0..100).map(|_| {
        let (app, a) = (app.clone(), a.clone());
        tokio::spawn(async move { buy(&app, &a, "alice", None).await })
    }))
    .await;

    let statuses: Vec<_> = results.into_iter().map(|r| r.unwrap()).collect();
    let accepted = statuses
        .iter()
        .filter(|(s, _)| *s == StatusCode::ACCEPTED)
        .count();
    assert_eq!(accepted, 1);
    assert!(statuses
        .iter()
        .filter(|(s, _)| *s != StatusCode::ACCEPTED)
        .all(|(s, b)| *s == StatusCode::CONFLICT && b["error"] == "already_purchased"));
    assert_eq!(snapshot(&env, a.id).await.stock, Some(9));
    Ok(())
}
on_both_redis!(one_user_sending_100_requests_in_parallel_gets_exactly_one_202);

/// An order queue whose endpoint refuses every connection.
fn dead_queue(env: &TestEnv) -> OrderQueue {
    let conf = env
        .sqs
        .config()
        .to_builder()
        .endpoint_url("http://127.0.0.1:9")
        .build();
    OrderQueue::new(
        aws_sdk_sqs::Client::from_conf(conf),
        env.queue.url.clone(),
        Duration::from_secs(1),
    )
}

async fn dead_queue_answers_503_and_gives_stock_and_quota_back(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.open_sale(5, 2).await?;
    let broken = env.entry_router_on(dead_queue(&env), |_| {});

    let started = Instant::now();
    let (status, body) = buy(&broken, &a, "alice", Some(r#"{"quantity":2}"#)).await;

    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"], "unavailable");
    assert!(started.elapsed() < Duration::from_secs(5));
    let snap = snapshot(&env, a.id).await;
    assert_eq!(snap.stock, Some(5), "stock given back");
    assert_eq!(snap.participants, 0, "quota given back");
    assert!(snap.ledger.is_empty());

    let (status, body) = buy(&env.entry_router(), &a, "alice", Some(r#"{"quantity":2}"#)).await;
    assert_eq!(
        status,
        StatusCode::ACCEPTED,
        "the same user buys later: {body}"
    );
    assert_eq!(snapshot(&env, a.id).await.stock, Some(3));
    Ok(())
}
on_both_redis!(dead_queue_answers_503_and_gives_stock_and_quota_back);

async fn crash_between_script_and_send_leaves_the_reservation_in_the_ledger(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.open_sale(5, 3).await?;
    let request_id = Uuid::new_v4();

    // The script ran; the process "died" before sending.
    let decision = testkit::purchase(
        &env.redis,
        a.id,
        "bob",
        3,
        request_id,
        purchase::far_deadline(),
    )
    .await?;

    assert!(decision.is_ok());
    let reservation = ledger::entry(&env.redis, a.id, "bob")
        .await?
        .expect("a ledger entry");
    assert_eq!(reservation.kind, EntryKind::Reservation);
    assert_eq!(reservation.user_id, "bob");
    assert_eq!(reservation.quantity, 3);
    assert_eq!(reservation.request_id(), Some(request_id));
    assert!(reservation.at_ms > 0);
    let (status, me) = call(
        &env.entry_router(),
        request(
            "GET",
            &format!("/activities/{}/orders/me", a.id),
            Some(("bob", "")),
            None,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(me["status"], "pending");
    assert_eq!(me["requestId"], request_id.to_string());
    assert_eq!(me["quantity"], 3);
    Ok(())
}
on_both_redis!(crash_between_script_and_send_leaves_the_reservation_in_the_ledger);

/// A redis-server of this test's own, so it can be paused and its commands counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paused_redis_gets_a_fast_503_never_a_hang() -> anyhow::Result<()> {
    let private = PrivateRedis::start().await;
    let env = private
        .env(Duration::from_millis(300), Duration::from_secs(1))
        .await;
    let a = env.open_sale(5, 1).await?;
    let app = env.entry_router();

    private.signal("-STOP");
    let started = Instant::now();
    let (status, body) = buy(&app, &a, "alice", None).await;
    let first = started.elapsed();
    let mut more = Vec::new();
    for i in 0..8 {
        let t = Instant::now();
        let (s, _) = buy(&app, &a, &format!("u{i}"), None).await;
        more.push((s, t.elapsed()));
    }
    private.signal("-CONT");

    eprintln!("first 503 after {first:?}; then {more:?}");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"], "unavailable");
    assert!(first < Duration::from_secs(3), "answered after {first:?}");
    assert!(more
        .iter()
        .all(|(s, t)| *s == StatusCode::SERVICE_UNAVAILABLE && *t < Duration::from_secs(3)));
    // Once the breaker has opened, refusals no longer wait for the timeout.
    assert!(more.last().unwrap().1 < Duration::from_millis(100));

    // Redis back: after the breaker's cooldown purchases go through again.
    let mut recovered = false;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if buy(&app, &a, "alice", None).await.0 == StatusCode::ACCEPTED {
            recovered = true;
            break;
        }
    }
    assert!(recovered, "purchases resume once Redis answers again");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sold_out_is_answered_from_memory_until_the_ttl_then_redis_is_asked_again(
) -> anyhow::Result<()> {
    let private = PrivateRedis::start().await;
    let ttl = Duration::from_millis(1500);
    let env = private.env(Duration::from_secs(2), ttl).await;
    let a = env.open_sale(1, 1).await?;
    let app = env.entry_router();
    let (status, accepted) = buy(&app, &a, "winner", None).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let sold_at = Instant::now();
    // The consumer's part, by hand: a confirmed order, DB stock down, ledger entry settled.
    let request_id: Uuid = accepted["requestId"].as_str().unwrap().parse().unwrap();
    let order_id = consume(&env, a.id, "winner", request_id, 1).await?;

    let before = private.commands_served().await;
    for i in 0..20 {
        let (status, body) = buy(&app, &a, &format!("late-{i}"), None).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (StatusCode::CONFLICT, Some("sold_out"))
        );
    }
    assert_eq!(
        private.commands_served().await,
        before,
        "refusals from memory never reach Redis"
    );

    // The unit comes back through a cancel made elsewhere (another container, or reconcile).
    let order = order::get(&env.pool, order_id).await.unwrap().unwrap();
    let outcome = cancel::cancel_order(&env.pool, &env.redis, &order, chrono::Utc::now()).await?;
    assert_eq!(outcome, CancelOutcome::Cancelled { quantity: 1 });
    let before = private.commands_served().await;
    let (status, _) = buy(&app, &a, "late-0", None).await;
    if sold_at.elapsed() < ttl {
        assert_eq!(status, StatusCode::CONFLICT, "still answered from memory");
        assert_eq!(private.commands_served().await, before);
    }
    tokio::time::sleep(ttl.saturating_sub(sold_at.elapsed()) + Duration::from_millis(100)).await;
    let (status, body) = buy(&app, &a, "late-0", None).await;
    assert_eq!(
        status,
        StatusCode::ACCEPTED,
        "after the TTL Redis decides again: {body}"
    );
    Ok(())
}

async fn user_id_in_the_body_is_ignored_in_favour_of_the_token(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.open_sale(5, 2).await?;

    let (status, body) = buy(
        &env.entry_router(),
        &a,
        "alice",
        Some(r#"{"quantity":1,"userId":"mallory"}"#),
    )
    .await;

    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let snap = snapshot(&env, a.id).await;
    assert_eq!(snap.ledger.len(), 1);
    assert_eq!(snap.ledger[0].user_id, "alice");
    Ok(())
}
on_both_redis!(user_id_in_the_body_is_ignored_in_favour_of_the_token);

/// method, path, (user, scope), body, expected status, expected error code.
type BadInput<'a> = (
    &'a str,
    String,
    Option<(&'a str, &'a str)>,
    Option<&'a str>,
    u16,
    &'a str,
);

async fn every_bad_input_gets_its_documented_4xx_and_changes_nothing(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.open_sale(10, 5).await?;
    let app = env.entry_router();
    let orders = orders_path(&a);
    let huge = format!(r#"{{"quantity":1,"userId":"{}"}}"#, "x".repeat(5000));
    let user = Some(("alice", ""));
    #[rustfmt::skip]
    let cases: Vec<BadInput> = vec![
        ("POST", orders.clone(), user, Some(r#"{"quantity":"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some("not json"), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":"2"}"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":1.5}"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":true}"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":null}"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some("[1]"), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":-1}"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":0}"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":10001}"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":99999999999999999999}"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":1e30}"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":1,"quantiy":2}"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":1,"quantity":2}"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(huge.as_str()), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":6}"#), 400, "quantity_exceeds_limit"),
        ("POST", orders.clone(), None, None, 401, "unauthorized"),
        ("POST", "/activities/abc/orders".into(), user, None, 400, "bad_request"),
        ("POST", "/activities/0/orders".into(), user, None, 400, "bad_request"),
        ("POST", "/activities/-1/orders".into(), user, None, 400, "bad_request"),
        ("POST", "/activities/1.5/orders".into(), user, None, 400, "bad_request"),
        ("POST", "/activities/99999999999999999999/orders".into(), user, None, 400, "bad_request"),
        ("POST", "/activities/987654321/orders".into(), user, None, 404, "not_found"),
        ("GET", format!("{orders}/me"), None, None, 401, "unauthorized"),
        ("GET", "/activities/abc/orders/me".into(), user, None, 400, "bad_request"),
        ("GET", "/activities/abc".into(), None, None, 400, "bad_request"),
        ("GET", "/activities/987654321".into(), None, None, 404, "not_found"),
        ("POST", "/orders/abc/pay".into(), user, None, 400, "bad_request"),
        ("POST", "/orders/0/cancel".into(), user, None, 400, "bad_request"),
        ("POST", "/orders/-7/cancel".into(), user, None, 400, "bad_request"),
        ("POST", "/orders/987654321/pay".into(), user, None, 404, "not_found"),
        ("POST", "/orders/987654321/cancel".into(), user, None, 404, "not_found"),
        ("POST", "/orders/1/pay".into(), None, None, 401, "unauthorized"),
        ("GET", "/no/such/route".into(), None, None, 404, "not_found"),
    ];
    let redis_before = snapshot(&env, a.id).await;

    for (method, path, who, body, want_status, want_code) in cases {
        let (status, json) = call(&app, request(method, &path, who, body)).await;
        let shown = body.map(|b| &b[..b.len().min(60)]);
        assert_eq!(
            status.as_u16(),
            want_status,
            "{method} {path} {shown:?}: {json}"
        );
        assert_eq!(
            json["error"], want_code,
            "{method} {path} {shown:?}: {json}"
        );
        assert!(
            json["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{method} {path}: a message says what is wrong"
        );
    }

    assert_eq!(snapshot(&env, a.id).await, redis_before, "Redis unchanged");
    assert_eq!(orders_in_db(&env).await, 0, "no order written");
    assert_eq!(db_remaining(&env, a.id).await, 10, "DB stock unchanged");
    assert!(env.drain_messages(10).await?.is_empty(), "nothing sent");
    Ok(())
}
on_both_redis!(every_bad_input_gets_its_documented_4xx_and_changes_nothing);

async fn refusals_of_the_window_map_to_their_409s(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let now = chrono::Utc::now();
    let hour = chrono::Duration::hours(1);
    let upcoming = env.sale(5, 1, now + hour, now + hour * 2).await?;
    let app = env.entry_router();

    let (status, body) = buy(&app, &upcoming, "alice", None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("not_started"))
    );

    // An activity that ended: in the DB and loaded with a past window.
    let ended = activity::insert(
        &env.pool,
        &testkit::sale()
            .title("over")
            .stock(5)
            .limit(1)
            .window(now - hour * 2, now - hour)
            .build()
            .settings()?,
    )
    .await?;
    testkit::load_without_db(&env.redis, &ended, env.config.expiry_buffer).await?;
    let (status, body) = buy(&app, &ended, "alice", None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("ended"))
    );
    Ok(())
}
on_both_redis!(refusals_of_the_window_map_to_their_409s);

async fn public_view_shows_live_stock_from_redis(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.open_sale(7, 2).await?;
    let app = env.entry_router();
    assert_eq!(
        buy(&app, &a, "alice", Some(r#"{"quantity":2}"#)).await.0,
        StatusCode::ACCEPTED
    );

    let (status, view) = call(
        &app,
        request("GET", &format!("/activities/{}", a.id), None, None),
    )
    .await;

    assert_eq!(status, StatusCode::OK);
    assert_eq!(view["id"], a.id);
    assert_eq!(view["title"], "test sale");
    assert_eq!(view["remainingStock"], 5, "Redis, not the DB's 7");
    assert_eq!(view["state"], "running");
    assert!(view["startAt"].is_string() && view["endAt"].is_string());
    let (status, health) = call(&app, request("GET", "/health", None, None)).await;
    assert_eq!(
        (status, health["status"].as_str()),
        (StatusCode::OK, Some("ok"))
    );
    Ok(())
}
on_both_redis!(public_view_shows_live_stock_from_redis);

/// Where the sale stands when a counted purchase runs.
#[derive(Clone, Copy, Debug)]
enum Window {
    Open,
    NotStarted,
    Ended,
    NotLoaded,
}

/// What ran before the counted purchase.
#[derive(Clone, Copy, Debug)]
enum Before {
    Nothing,
    /// The same user bought with another request.
    OtherRequest,
    /// The same request's script already ran (a delivery twice).
    SameRequest,
}

/// One outcome of `purchase.lua` and the most Redis commands it may run.
struct Counted {
    outcome: &'static str,
    window: Window,
    stock: i64,
    quantity: i64,
    past_deadline: bool,
    before: Before,
    max_commands: u64,
}

#[rustfmt::skip]
const COUNTED: &[Counted] = &[
    Counted { outcome: "accepted", window: Window::Open, stock: 5, quantity: 1, past_deadline: false, before: Before::Nothing, max_commands: 6 },
    Counted { outcome: "not_found", window: Window::NotLoaded, stock: 5, quantity: 1, past_deadline: false, before: Before::Nothing, max_commands: 3 },
    Counted { outcome: "expired", window: Window::Open, stock: 5, quantity: 1, past_deadline: true, before: Before::Nothing, max_commands: 3 },
    Counted { outcome: "not_started", window: Window::NotStarted, stock: 5, quantity: 1, past_deadline: false, before: Before::Nothing, max_commands: 3 },
    Counted { outcome: "ended", window: Window::Ended, stock: 5, quantity: 1, past_deadline: false, before: Before::Nothing, max_commands: 3 },
    Counted { outcome: "quantity_exceeds_limit", window: Window::Open, stock: 5, quantity: 3, past_deadline: false, before: Before::Nothing, max_commands: 3 },
    Counted { outcome: "sold_out", window: Window::Open, stock: 1, quantity: 2, past_deadline: false, before: Before::Nothing, max_commands: 3 },
    Counted { outcome: "already_purchased", window: Window::Open, stock: 5, quantity: 1, past_deadline: false, before: Before::OtherRequest, max_commands: 3 },
    Counted { outcome: "accepted", window: Window::Open, stock: 5, quantity: 1, past_deadline: false, before: Before::SameRequest, max_commands: 3 },
];

/// The commands scripts ran since the last `CONFIG RESETSTAT`: every command `INFO
/// commandstats` counts but the ones that only carry or load a script and read the count.
async fn commands_inside_scripts(
    con: &mut redis::aio::MultiplexedConnection,
) -> anyhow::Result<u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await?;
    let outside = ["info", "config", "evalsha", "eval", "script"];
    let mut sum = 0;
    for line in info.lines() {
        let Some((name, stats)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        if outside.contains(&name) || name.starts_with("config|") || name.starts_with("script|") {
            continue;
        }
        let calls = stats
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .ok_or_else(|| anyhow::anyhow!("no calls in {line}"))?;
        sum += calls.parse::<u64>()?;
    }
    Ok(sum)
}

/// Every outcome of the purchase script, run once on a server of this test's own right after
/// `CONFIG RESETSTAT`: a success costs at most six commands, any refusal at most three (they
/// are the bulk of a sale's traffic).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_runs_at_most_six_commands_and_a_refusal_at_most_three() -> anyhow::Result<()> {
    let private = PrivateRedis::start().await;
    let env = private
        .env(Duration::from_secs(2), Duration::from_secs(1))
        .await;
    let mut con = private.raw().await?;
    let now = chrono::Utc::now();
    let mut counted = Vec::new();
    for case in COUNTED {
        let hour = chrono::Duration::hours(1);
        let (start, end) = match case.window {
            Window::Open | Window::NotLoaded => (now - hour, now + hour),
            Window::NotStarted => (now + hour, now + hour * 2),
            Window::Ended => (now - hour * 2, now - hour),
        };
        let a = env.sale(case.stock, 2, start, end).await?;
        if matches!(case.window, Window::NotLoaded) {
            testkit::lose_sale(&env.redis, a.id).await?;
        }
        let request_id = Uuid::new_v4();
        let earlier = match case.before {
            Before::Nothing => None,
            Before::OtherRequest => Some(Uuid::new_v4()),
            Before::SameRequest => Some(request_id),
        };
        if let Some(earlier) = earlier {
            let first = testkit::purchase(
                &env.redis,
                a.id,
                "alice",
                1,
                earlier,
                purchase::far_deadline(),
            );
            anyhow::ensure!(
                first.await?.is_ok(),
                "{}: the earlier purchase",
                case.outcome
            );
        }
        let deadline = if case.past_deadline {
            0
        } else {
            purchase::far_deadline()
        };
        // The script is cached from the earlier runs: only its own commands are counted.
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut con)
            .await?;
        let decision = testkit::purchase(
            &env.redis,
            a.id,
            "alice",
            case.quantity,
            request_id,
            deadline,
        )
        .await?;
        let commands = commands_inside_scripts(&mut con).await?;
        let outcome = match decision {
            Ok(_) => "accepted",
            Err(refusal) => refusal.code(),
        };
        counted.push(format!(
            "{} after {:?}: {commands}",
            case.outcome, case.before
        ));
        assert_eq!(outcome, case.outcome, "{:?} {:?}", case.window, case.before);
        assert!(
            commands <= case.max_commands,
            "{} ({:?}, {:?}) ran {commands} commands, more than {}",
            case.outcome,
            case.window,
            case.before,
            case.max_commands
        );
    }
    eprintln!("commands per outcome: {counted:?}");
    Ok(())
}

/// One request through the router with the count of database connections it took.
async fn counted(
    app: &Router,
    taken: &AtomicUsize,
    req: axum::http::Request<axum::body::Body>,
) -> (StatusCode, axum::http::HeaderMap, Value, usize) {
    let before = taken.load(Ordering::SeqCst);
    let (status, headers, body) = call_with_headers(app, req).await;
    (status, headers, body, taken.load(Ordering::SeqCst) - before)
}

async fn one_user_looping_database_routes_gets_429_past_the_rate_without_reaching_the_database(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.open_sale(5, 1).await?;
    let (pool, taken) = counting_pool(&env);
    let app = env.entry_router_with(|c| {
        // 2 a second: 4 in a window of 2 s.
        c.config.user_db_rate_per_sec = 2;
        c.pool = pool;
    });
    let pay = |user: &str| request("POST", "/orders/987654/pay", Some((user, "")), None);

    let started = Instant::now();
    let mut answers = Vec::new();
    for _ in 0..10 {
        let (status, headers, body, db) = counted(&app, &taken, pay("looper")).await;
        match status {
            StatusCode::NOT_FOUND => assert!(db > 0, "a 404 the database gave: {body}"),
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(body["error"], "rate_limited", "{body}");
                let retry: u64 = headers["retry-after"].to_str()?.parse()?;
                assert!((1..=2).contains(&retry), "Retry-After {retry}");
                assert_eq!(db, 0, "a refused request never reaches the database");
            }
            other => panic!("{other} {body}"),
        }
        answers.push(status);
    }
    let allowed = answers
        .iter()
        .filter(|s| **s == StatusCode::NOT_FOUND)
        .count();
    if started.elapsed() < Duration::from_secs(2) {
        assert_eq!(allowed, 4, "the first window's 4, then 429: {answers:?}");
        assert!(answers[4..]
            .iter()
            .all(|s| *s == StatusCode::TOO_MANY_REQUESTS));
    }
    assert!(
        answers.contains(&StatusCode::TOO_MANY_REQUESTS),
        "{answers:?}"
    );

    // Every route that would reach the database counts against the same rate.
    let routes = [
        request("POST", "/orders/987654/cancel", Some(("looper", "")), None),
        request(
            "GET",
            &format!("/activities/{}/orders/me", a.id),
            Some(("looper", "")),
            None,
        ),
        request(
            "POST",
            "/activities/987654321/orders",
            Some(("looper", "")),
            None,
        ),
    ];
    for req in routes {
        let (status, _, body, db) = counted(&app, &taken, req).await;
        assert_eq!((status, db), (StatusCode::TOO_MANY_REQUESTS, 0), "{body}");
    }
    // The loaded sale's purchase needs no database: not counted, not refused.
    let (status, body) = buy(&app, &a, "looper", None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");

    // Another user is not held back by the first one's loop.
    let (status, _, body, db) = counted(&app, &taken, pay("bystander")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(db > 0);
    Ok(())
}
on_both_redis!(
    one_user_looping_database_routes_gets_429_past_the_rate_without_reaching_the_database
);

async fn a_repeated_none_is_answered_from_memory_and_our_own_purchase_shows_at_once(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.open_sale(5, 1).await?;
    let (pool, taken) = counting_pool(&env);
    let app = env.entry_router_with(|c| c.pool = pool);
    let me = |user: &str| {
        let path = format!("/activities/{}/orders/me", a.id);
        request("GET", &path, Some((user, "")), None)
    };

    let (status, _, body, db) = counted(&app, &taken, me("buyer")).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::OK, Some("none"))
    );
    assert!(db > 0, "the first none is the database's");
    let (_, _, body, db) = counted(&app, &taken, me("buyer")).await;
    assert_eq!(
        (body["status"].as_str(), db),
        (Some("none"), 0),
        "from memory"
    );

    let (status, accepted) = buy(&app, &a, "buyer", None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let (_, _, body, db) = counted(&app, &taken, me("buyer")).await;
    assert_eq!(
        (body["status"].as_str(), db),
        (Some("pending"), 0),
        "from the ledger"
    );
    // The consumer's part: the order committed, the ledger entry settled.
    let request_id: Uuid = accepted["requestId"].as_str().unwrap().parse()?;
    let order_id = consume(&env, a.id, "buyer", request_id, 1).await?;
    let (_, _, body, db) = counted(&app, &taken, me("buyer")).await;
    assert_eq!(
        body["status"], "confirmed",
        "no stale none after our own 202: {body}"
    );
    assert_eq!(body["orderId"], order_id);
    assert!(db > 0);

    // Another user's none is theirs alone, and is asked again once the memory is over.
    let (_, _, body, db) = counted(&app, &taken, me("other")).await;
    assert_eq!(body["status"], "none");
    assert!(db > 0);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (_, _, body, db) = counted(&app, &taken, me("other")).await;
    assert_eq!(body["status"], "none");
    assert!(db > 0, "past its second the database is asked again");
    Ok(())
}
on_both_redis!(a_repeated_none_is_answered_from_memory_and_our_own_purchase_shows_at_once);

/// A status read that found no order, stopped before keeping that answer, while the same
/// container accepts the user's purchase and the consumer commits it: the late "none" is not
/// kept, and the next read shows the order.
async fn a_none_read_before_our_purchase_is_not_kept_after_it(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.open_sale(5, 1).await?;
    let app = env.entry_router();
    let path = format!("/activities/{}/orders/me", a.id);
    let paused = pause::arm("entry.my_order.before_remember_none", a.id);
    let early = {
        let (app, path) = (app.clone(), path.clone());
        tokio::spawn(
            async move { call(&app, request("GET", &path, Some(("buyer", "")), None)).await },
        )
    };
    paused.reached().await;
    let (status, accepted) = buy(&app, &a, "buyer", None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let request_id: Uuid = accepted["requestId"].as_str().unwrap().parse()?;
    consume(&env, a.id, "buyer", request_id, 1).await?;
    paused.resume();
    let (_, body) = early.await?;
    assert_eq!(body["status"], "none", "true when it was read");
    let (_, body) = call(&app, request("GET", &path, Some(("buyer", "")), None)).await;
    assert_eq!(body["status"], "confirmed", "{body}");
    Ok(())
}
on_both_redis!(a_none_read_before_our_purchase_is_not_kept_after_it);
