//! Bucketed sales on the 3-master Redis Cluster: a sale's stock split over buckets on
//! different shards, with one order per user and no undersell (docs/invariants.md,
//! "Bucketed sales"). Crowds with demand far over the stock, skewed users, a crash between
//! the two steps of a borrow, a cancel and a re-buy across buckets, admin changes of a
//! bucketed sale, and the interleavings that would break a naive version.
//!
//! Here the helpers every part shares (an attempt as the entry makes it, a crowd, the buckets'
//! stocks); the [`crowds`], the [`borrows`] between buckets, and the [`changes`] of a bucketed
//! sale.

mod borrows;
mod changes;
mod crowds;

use futures::StreamExt;
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::purchase::{Attempt, MessageKind, OrderMessage};
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol;
use seckill_shared::protocol::consume::Decision;
use seckill_shared::protocol::purchase::Outcome as Decided;
use seckill_shared::store;
use seckill_shared::store::buckets;
use seckill_shared::store::keys::Bucket;
use seckill_shared::Refusal;
use std::collections::HashSet;
use testkit::RedisKind;
use testkit::TestEnv;
use uuid::Uuid;

const CLUSTER: RedisKind = RedisKind::Cluster;

/// One purchase attempt as the entry makes it (the Redis decision), and the order message it
/// would send.
async fn attempt(
    env: &TestEnv,
    a: &Activity,
    user: &str,
    quantity: i64,
    known: u32,
) -> anyhow::Result<Result<OrderMessage, Refusal>> {
    attempt_with(
        env,
        &protocol::buckets::Hints::none(),
        a,
        user,
        quantity,
        known,
    )
    .await
}

/// [`attempt`] with a container's hints, through the entry's own Redis login.
async fn attempt_with(
    env: &TestEnv,
    hints: &protocol::buckets::Hints,
    a: &Activity,
    user: &str,
    quantity: i64,
    known: u32,
) -> anyhow::Result<Result<OrderMessage, Refusal>> {
    let mut buy = Attempt {
        request_id: Uuid::now_v7(),
        activity_id: a.id,
        user_id: user.to_string(),
        quantity,
        buckets: known,
    };
    let deadline = store::purchase::far_deadline();
    // As the entry runs it: its own Redis ACL user, its connection's timeout.
    let (_, redis) = env.login(Function::Entry);
    Ok(
        match protocol::purchase::enter(&redis, hints, &mut buy, deadline).await? {
            Decided::Reserved(r) => Ok(OrderMessage {
                attempt: Attempt {
                    buckets: r.buckets,
                    ..buy
                },
                reserved_at_ms: r.now_ms,
                load_epoch: Some(r.epoch),
                kind: MessageKind::Order,
            }),
            Decided::Refused(refusal) => Err(refusal),
            other => anyhow::bail!("a first-come sale answered {other:?}"),
        },
    )
}

/// Every user of `users` tries `tries` times, 64 attempts at a time; half the attempts come
/// with no knowledge of the bucket count (a fresh container). Returns the accepted messages
/// and every refusal.
async fn crowd(
    env: &TestEnv,
    a: &Activity,
    users: &[String],
    tries: usize,
) -> (Vec<OrderMessage>, Vec<Refusal>) {
    let attempts: Vec<(usize, &String)> = (0..tries)
        .flat_map(|t| users.iter().map(move |u| (t, u)))
        .collect();
    let results: Vec<Result<OrderMessage, Refusal>> = futures::stream::iter(attempts)
        .map(|(t, user)| async move {
            let known = if t % 2 == 0 { a.bucket_count() } else { 1 };
            attempt(env, a, user, 1, known)
                .await
                .expect("redis answers")
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let mut accepted = Vec::new();
    let mut refused = Vec::new();
    for r in results {
        match r {
            Ok(m) => accepted.push(m),
            Err(refusal) => refused.push(refusal),
        }
    }
    (accepted, refused)
}

/// The consumer commits every message, 16 at a time.
async fn commit_all(env: &TestEnv, messages: &[OrderMessage]) {
    let consumer = env.consumer();
    let outcomes: Vec<Decision> = futures::stream::iter(messages)
        .map(|m| {
            let consumer = &consumer;
            async move { consumer.handle_message(m).await.expect("consumed").decision }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    assert!(
        outcomes.iter().all(|o| *o == Decision::Committed),
        "{outcomes:?}"
    );
}

/// Redis stock of every bucket, bucket 0 first.
async fn stocks(env: &TestEnv, a: &Activity) -> Vec<i64> {
    buckets::stocks(&env.redis, a.id, a.bucket_count())
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.expect("every bucket loaded"))
        .collect()
}

/// Whether the user holds a field in their home bucket's `users`.
async fn in_users(env: &TestEnv, a: &Activity, user: &str) -> bool {
    let home = Bucket::home(a.id, a.bucket_count(), user);
    env.redis
        .cmd(
            redis::cmd("HEXISTS")
                .arg(env.redis.bucket_keys(home).users)
                .arg(user),
        )
        .await
        .unwrap()
}

/// Users whose home bucket (of `count`) is `index`.
fn users_at_home(activity_id: i64, count: u32, index: u32, n: usize, tag: &str) -> Vec<String> {
    (0..)
        .map(|i| format!("{tag}-{i}"))
        .filter(|u| Bucket::home(activity_id, count, u).index == index)
        .take(n)
        .collect()
}

fn distinct_users(messages: &[OrderMessage]) -> usize {
    messages
        .iter()
        .map(|m| m.attempt.user_id.as_str())
        .collect::<HashSet<_>>()
        .len()
}
