//! Concurrency: the purchase script on any topology without CROSSSLOT, crowds selling exactly the
//! stock and never below zero, one user's parallel requests getting exactly one 202.

use crate::messages;
use axum::http::StatusCode;
use futures::StreamExt;
use seckill_shared::store::purchase;
use seckill_shared::store::purchase::Reservation;
use seckill_shared::store::view;
use serde_json::Value;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::on_every_redis;
use testkit::RedisKind;
use testkit::TestEnv;
use testkit::{buy, snapshot};
use uuid::Uuid;

on_every_redis!(
    purchase_script_runs_on_any_topology_without_crossslot,
    five_hundred_attempts_from_200_users_sell_exactly_the_stock_of_50,
    ten_thousand_requests_from_2000_users_sell_exactly_100_and_stock_never_goes_negative,
    one_user_sending_100_requests_in_parallel_gets_exactly_one_202,
);

async fn purchase_script_runs_on_any_topology_without_crossslot(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.open_activity(5, 2).await?;

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

async fn five_hundred_attempts_from_200_users_sell_exactly_the_stock_of_50(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.open_activity(50, 1).await?;
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

async fn ten_thousand_requests_from_2000_users_sell_exactly_100_and_stock_never_goes_negative(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await.unwrap();
    let a = env.open_activity(100, 1).await.unwrap();
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

async fn one_user_sending_100_requests_in_parallel_gets_exactly_one_202(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.open_activity(10, 1).await?;
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
