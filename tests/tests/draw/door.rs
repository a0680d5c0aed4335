//! The door of a draw: a crowd's entries share `SendMessageBatch` calls, each entrant still
//! answered 202 `queued` only once its own message is stored, and each told 503 (its entry
//! out of the pool) when the batch that carried it failed.

use axum::http::StatusCode;
use axum::Router;
use futures::StreamExt;
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::status::{FailureReason, OrderStatus};
use seckill_shared::infra::pause;
use seckill_shared::infra::sqs::{OrderQueue, Queues};
use seckill_shared::store::draw;
use std::time::{Duration, Instant};
use testkit::on_every_redis;
use testkit::RedisKind;
use testkit::TestEnv;
use testkit::{buy, consume_queue, dead_queue, draw_entry_rows, order_rows};

on_every_redis!(
    a_crowds_entries_share_batches_and_each_waits_for_its_own,
    every_entry_of_a_failed_batch_is_answered_503_and_leaves_the_pool,
);

/// `n` entrants (`{prefix}0..`) of sale `a` through `app`, whose `queue` has one slot: the
/// first one's batch is held before its call until the other `n - 1` wait for the slot, so
/// they go in batches of ten after it. Answers every entrant's answer.
async fn held_crowd(
    app: &Router,
    a: &Activity,
    queue: &OrderQueue,
    prefix: &str,
    n: usize,
) -> anyhow::Result<Vec<(StatusCode, serde_json::Value)>> {
    let held = pause::arm("queue.coalesce.before_send", a.id);
    let first = {
        let (app, a, user) = (app.clone(), a.clone(), format!("{prefix}0"));
        tokio::spawn(async move { buy(&app, &a, &user, None).await })
    };
    assert!(held.reached_within(Duration::from_secs(10)).await);
    let rest = {
        let (app, a, prefix) = (app.clone(), a.clone(), prefix.to_string());
        tokio::spawn(async move {
            futures::stream::iter(1..n)
                .map(|i| {
                    let (app, a, user) = (&app, &a, format!("{prefix}{i}"));
                    async move { buy(app, a, &user, None).await }
                })
                .buffer_unordered(n)
                .collect::<Vec<_>>()
                .await
        })
    };
    let until = Instant::now() + Duration::from_secs(10);
    while queue.coalesced.waiting() < n - 1 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        queue.coalesced.waiting(),
        n - 1,
        "the crowd waits for the slot"
    );
    held.resume();
    let mut answers = vec![first.await?];
    answers.extend(rest.await?);
    Ok(answers)
}

/// Entries sent while every slot of the container's line is taken wait for the next batch.
/// One slot, its first batch held before its call: the 24 entries that come meanwhile wait,
/// then go in batches of ten. All 25 are answered 202 `queued`, each message is on the queue
/// once (the consumer keeps 25 entries), in 4 calls (1 + 10 + 10 + 4).
async fn a_crowds_entries_share_batches_and_each_waits_for_its_own(
    kind: RedisKind,
) -> anyhow::Result<()> {
    const CROWD: usize = 25;
    let env = TestEnv::new(kind).await?;
    let queue = env.queues().entries.with_send_slots(1);
    let queues = Queues {
        entries: queue.clone(),
        ..env.queues()
    };
    let app = env.entry_router_on(queues, |_| {});
    let a = env.draw_activity(5, 1).await?;

    let answers = held_crowd(&app, &a, &queue, "c", CROWD).await?;
    for (status, body) in &answers {
        assert_eq!(
            (*status, body["status"].as_str()),
            (StatusCode::ACCEPTED, Some("queued")),
            "{body}"
        );
    }
    assert_eq!(queue.coalesced.sent(), (4, CROWD as u64));
    assert_eq!(consume_queue(&env).await?, 0, "entries, not orders");
    assert_eq!(draw_entry_rows(&env, a.id).await, CROWD as i64);
    assert_eq!(draw::pool(&env.redis, a.id).await?.len(), CROWD);
    Ok(())
}

/// A crowd's entries on a dead queue: the batches that carried them fail, and each entrant
/// hears it: 503, its request claimed `unavailable`, its entry out of the pool. Nothing is on
/// the queue and nothing is kept.
async fn every_entry_of_a_failed_batch_is_answered_503_and_leaves_the_pool(
    kind: RedisKind,
) -> anyhow::Result<()> {
    const CROWD: usize = 12;
    let env = TestEnv::new(kind).await?;
    let queue = dead_queue(&env).with_send_slots(1);
    let app = env.entry_router_on(Queues::one(queue.clone()), |_| {});
    let a = env.draw_activity(5, 1).await?;
    // The first batch held before its call, so the rest of the crowd shares the next ones.
    let answers = held_crowd(&app, &a, &queue, "d", CROWD).await?;
    for (status, body) in &answers {
        assert_eq!(status, &StatusCode::SERVICE_UNAVAILABLE, "{body}");
    }
    assert_eq!(
        queue.coalesced.sent(),
        (3, CROWD as u64),
        "1 + 10 + 1 entries a call"
    );
    assert!(
        draw::pool(&env.redis, a.id).await?.is_empty(),
        "every entry left the pool"
    );
    let rows = order_rows(&env, a.id).await;
    assert_eq!(rows.len(), CROWD);
    assert!(rows
        .iter()
        .all(|o| o.status == OrderStatus::Failed
            && o.failure_reason == Some(FailureReason::Unavailable)));
    assert_eq!(consume_queue(&env).await?, 0);
    assert_eq!(draw_entry_rows(&env, a.id).await, 0);
    Ok(())
}
