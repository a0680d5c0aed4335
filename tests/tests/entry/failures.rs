//! A dependency failing: a dead queue answers 503 and gives the stock and quota back, a crash
//! between the script and the send leaves the reservation in the ledger, a paused Redis gets a
//! fast 503, never a hang.

use axum::http::StatusCode;
use seckill_shared::infra::sqs::Queues;
use seckill_shared::store::ledger;
use seckill_shared::store::purchase;
use seckill_shared::store::values::EntryKind;
use std::time::{Duration, Instant};
use testkit::call;
use testkit::on_every_redis;
use testkit::request;
use testkit::PrivateRedis;
use testkit::RedisKind;
use testkit::TestEnv;
use testkit::{buy, dead_queue, snapshot};
use uuid::Uuid;

on_every_redis!(
    dead_queue_answers_503_and_gives_stock_and_quota_back,
    crash_between_script_and_send_leaves_the_reservation_in_the_ledger,
);

async fn dead_queue_answers_503_and_gives_stock_and_quota_back(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.open_activity(5, 2).await?;
    let broken = env.entry_router_on(Queues::one(dead_queue(&env)), |_| {});

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

async fn crash_between_script_and_send_leaves_the_reservation_in_the_ledger(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.open_activity(5, 3).await?;
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

/// A redis-server of this test's own, so it can be paused and its commands counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paused_redis_gets_a_fast_503_never_a_hang() -> anyhow::Result<()> {
    let private = PrivateRedis::start().await;
    let env = private
        .env(Duration::from_millis(300), Duration::from_secs(1))
        .await;
    let a = env.open_activity(5, 1).await?;
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

/// A node that lost its script cache (restarted or replaced empty): the entry, whose Redis user
/// may not load a script, answers 503 and loads nothing; the next preheat run, as the loader,
/// loads every script on the node, and purchases go through again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_without_its_scripts_answers_503_until_preheat_loads_them() -> anyhow::Result<()> {
    let private = PrivateRedis::start().await;
    let env = private
        .env(Duration::from_millis(300), Duration::from_secs(1))
        .await;
    let a = env.open_activity(5, 1).await?;
    let app = env.entry_router();
    let mut raw = private.raw().await?;
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async::<()>(&mut raw)
        .await?;
    let purchase = seckill_shared::store::scripts::PURCHASE
        .get_hash()
        .to_string();
    let cached = |raw: &mut redis::aio::MultiplexedConnection| {
        let mut raw = raw.clone();
        let sha = purchase.clone();
        async move {
            let exists: Vec<bool> = redis::cmd("SCRIPT")
                .arg("EXISTS")
                .arg(&sha)
                .query_async(&mut raw)
                .await
                .unwrap();
            exists[0]
        }
    };

    let (status, body) = buy(&app, &a, "alice", None).await;

    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(!cached(&mut raw).await, "the entry loaded no script");
    assert_eq!(testkit::redis_stock(&env, a.id).await, Some(5));

    let report = env.preheat().run(chrono::Utc::now()).await?;
    assert_eq!(report.script_error, None);
    assert_eq!(
        report.scripts_loaded,
        seckill_shared::store::scripts::SOURCES.len()
    );
    assert!(cached(&mut raw).await);
    let mut bought = None;
    for _ in 0..30 {
        let (status, _) = buy(&app, &a, "alice", None).await;
        if status == StatusCode::ACCEPTED {
            bought = Some(status);
            break;
        }
        // The breaker the first 503 opened lets calls through again after its cooldown.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(bought, Some(StatusCode::ACCEPTED));
    Ok(())
}
