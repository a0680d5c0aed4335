//! The entry's per-container guards: sold out answered from memory until its TTL, a repeated
//! `none` status from memory with our own purchase shown at once, and a user looping database
//! routes limited before reaching the database.

use axum::http::StatusCode;
use axum::Router;
use seckill_shared::domain::order;
use seckill_shared::infra::pause;
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol::cancel;
use seckill_shared::protocol::cancel::CancelOutcome;
use serde_json::Value;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use testkit::call;
use testkit::on_every_redis;
use testkit::request;
use testkit::PrivateRedis;
use testkit::RedisKind;
use testkit::TestEnv;
use testkit::{buy, call_with_headers, consume, counting_pool};
use uuid::Uuid;

on_every_redis!(
    one_user_looping_database_routes_gets_429_past_the_rate_without_reaching_the_database,
    a_repeated_none_is_answered_from_memory_and_our_own_purchase_shows_at_once,
    a_none_read_before_our_purchase_is_not_kept_after_it,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sold_out_is_answered_from_memory_until_the_ttl_then_redis_is_asked_again(
) -> anyhow::Result<()> {
    let private = PrivateRedis::start().await;
    let ttl = Duration::from_millis(1500);
    let env = private.env(Duration::from_secs(2), ttl).await;
    let a = env.open_activity(1, 1).await?;
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
    let outcome = cancel::cancel_order(
        &env.login(Function::Entry).0,
        &env.login(Function::Entry).1,
        &order,
        chrono::Utc::now(),
    )
    .await?;
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
    let a = env.open_activity(5, 1).await?;
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

async fn a_repeated_none_is_answered_from_memory_and_our_own_purchase_shows_at_once(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.open_activity(5, 1).await?;
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

/// A status read that found no order, stopped before keeping that answer, while the same
/// container accepts the user's purchase and the consumer commits it: the late "none" is not
/// kept, and the next read shows the order.
async fn a_none_read_before_our_purchase_is_not_kept_after_it(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.open_activity(5, 1).await?;
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
