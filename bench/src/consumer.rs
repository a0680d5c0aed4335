//! The order consumer's committed orders/s against one transaction per order, and against bare
//! single-row inserts, on the same table.
//!
//! Reservations are made with `testkit::purchase` on the real Redis, turned into order messages
//! and grouped in SQS batches of 10 built in-process. `instances` consumers (each with its own
//! pool of `conns` connections and its own Redis connection, as separate Lambda containers)
//! take batches concurrently. The baseline runs the same two statements (order insert +
//! conditional stock update) in one transaction per order, with `instances × conns`
//! connections, on a fresh activity of the same size. The bare inserts are the floor the batch
//! path is held to: one autocommit single-row `INSERT` per order (the consumer's own order
//! insert, no stock update), with the same connections, on another fresh activity.

use crate::util;
use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use futures::StreamExt;
use order_consumer::Consumer;
use seckill_shared::domain::purchase::{Attempt, MessageKind, OrderMessage};
use seckill_shared::domain::{activity, order};
use seckill_shared::store::conn::Redis;
use seckill_shared::store::purchase::{far_deadline, Reservation};
use seckill_shared::{Config, Context};
use serde::Serialize;
use sqlx::PgPool;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerRun {
    pub what: String,
    pub orders: usize,
    pub committed: u64,
    pub failed_or_retried: u64,
    /// Of `committed`, how many went through the batch fast path.
    pub batched: u64,
    pub seconds: f64,
    pub orders_per_s: f64,
    /// Orders and stock read back from the database afterwards.
    pub db_orders: i64,
    pub db_remaining_stock: i64,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerResults {
    pub instances: usize,
    pub connections_per_instance: u32,
    pub batch_size: usize,
    pub handle_batch: ConsumerRun,
    pub handle_batch_per_message: ConsumerRun,
    pub baseline: ConsumerRun,
    pub bare_inserts: ConsumerRun,
    pub consumer_vs_baseline: f64,
    /// The batch path's orders/s over the bare inserts'.
    pub consumer_batch_vs_bare_inserts: f64,
}

pub async fn run(
    database_url: &str,
    pool: &PgPool,
    orders: usize,
    instances: usize,
    conns: u32,
) -> anyhow::Result<ConsumerResults> {
    let mut config = testkit::config(database_url, testkit::RedisKind::Standalone);
    config.key_prefix = util::fresh_prefix();
    config.db_max_connections = conns;
    config.redis_timeout = Duration::from_secs(5);
    let redis = Redis::connect(&config).await?;
    let result = async {
        let batch = consumer_run(&config, pool, &redis, orders, instances, true).await?;
        let single = consumer_run(&config, pool, &redis, orders, instances, false).await?;
        let connections = instances * conns as usize;
        let baseline = baseline_run(database_url, pool, orders, connections).await?;
        let bare = bare_inserts_run(database_url, pool, orders, connections).await?;
        Ok::<_, anyhow::Error>(ConsumerResults {
            instances,
            connections_per_instance: conns,
            batch_size: 10,
            consumer_vs_baseline: batch.orders_per_s / baseline.orders_per_s,
            consumer_batch_vs_bare_inserts: batch.orders_per_s / bare.orders_per_s,
            handle_batch: batch,
            handle_batch_per_message: single,
            baseline,
            bare_inserts: bare,
        })
    }
    .await;
    let client = redis::Client::open(
        std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
    )?;
    let mut con = client.get_multiplexed_async_connection().await?;
    util::delete_prefix(&mut con, &config.key_prefix).await?;
    result
}

async fn new_activity(
    pool: &PgPool,
    stock: usize,
) -> anyhow::Result<seckill_shared::domain::activity::Activity> {
    Ok(activity::insert(
        pool,
        &testkit::new_activity()
            .title("bench consumer")
            .stock(stock as i64)
            .limit(1)
            .build()
            .settings()?,
    )
    .await?)
}

async fn db_facts(pool: &PgPool, activity_id: i64) -> anyhow::Result<(i64, i64)> {
    let orders = order::tally(pool, activity_id).await?.confirmed;
    let left = activity::remaining_stock(pool, activity_id)
        .await?
        .ok_or(sqlx::Error::RowNotFound)?;
    Ok((orders, left))
}

async fn consumer_run(
    config: &Config,
    pool: &PgPool,
    redis: &Redis,
    orders: usize,
    instances: usize,
    batch_writes: bool,
) -> anyhow::Result<ConsumerRun> {
    let a = new_activity(pool, orders).await?;
    testkit::load_without_db(redis, &a, Duration::from_secs(3600)).await?;
    let messages = reservations(redis, a.id, orders).await?;
    let batches = Arc::new(sqs_batches(&messages));

    // One consumer per "container": its own warm pool and Redis connection.
    let mut consumers = Vec::new();
    for _ in 0..instances {
        let p = sqlx::postgres::PgPoolOptions::new()
            .max_connections(config.db_max_connections)
            .min_connections(config.db_max_connections)
            .connect(config.database_url.expose())
            .await?;
        let r = Redis::connect(config).await?;
        consumers.push(
            Consumer::new(Context::new(config.clone(), p, r)).with_batch_writes(batch_writes),
        );
    }
    let start = Instant::now();
    let (committed, failed, batched) = consume_all(&consumers, batches).await?;
    let elapsed = start.elapsed();
    for c in consumers {
        c.pool().close().await;
    }
    let (db_orders, db_remaining_stock) = db_facts(pool, a.id).await?;
    let what = if batch_writes {
        "Consumer::handle_batch (batch fast path on)"
    } else {
        "Consumer::handle_batch (batch fast path off)"
    };
    let run = ConsumerRun {
        what: what.into(),
        orders,
        committed,
        failed_or_retried: failed,
        batched,
        seconds: elapsed.as_secs_f64(),
        orders_per_s: committed as f64 / elapsed.as_secs_f64(),
        db_orders,
        db_remaining_stock,
    };
    eprintln!(
        "  {:<44} {:>9.0} orders/s  committed {} (batched {}), failed/retried {}",
        run.what, run.orders_per_s, run.committed, run.batched, run.failed_or_retried
    );
    Ok(run)
}

/// Real reservations, one per buyer: the ledger holds each one, as after seckill-entry
/// accepted it. Returns the order messages the entry would have sent.
async fn reservations(
    redis: &Redis,
    activity_id: i64,
    orders: usize,
) -> anyhow::Result<Vec<OrderMessage>> {
    futures::stream::iter(0..orders)
        .map(|i| {
            let redis = redis.clone();
            async move {
                let user = format!("buyer-{i:07}");
                let request_id = Uuid::now_v7();
                let deadline = far_deadline();
                match testkit::purchase(&redis, activity_id, &user, 1, request_id, deadline).await?
                {
                    Ok(Reservation { now_ms, epoch, .. }) => Ok(OrderMessage {
                        attempt: Attempt {
                            request_id,
                            activity_id,
                            user_id: user,
                            quantity: 1,
                            buckets: 1,
                        },
                        reserved_at_ms: now_ms,
                        load_epoch: Some(epoch),
                        kind: MessageKind::Order,
                    }),
                    other => Err(anyhow::anyhow!("reservation refused: {other:?}")),
                }
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<anyhow::Result<OrderMessage>>>()
        .await
        .into_iter()
        .collect()
}

/// The messages as SQS delivers them to the consumer: events of up to 10 records.
fn sqs_batches(messages: &[OrderMessage]) -> Vec<SqsEvent> {
    messages
        .chunks(10)
        .map(|chunk| {
            let mut event = SqsEvent::default();
            event.records = chunk
                .iter()
                .map(|m| {
                    let mut msg = SqsMessage::default();
                    msg.message_id = Some(m.attempt.request_id.to_string());
                    msg.body = Some(serde_json::to_string(m).expect("serializable"));
                    msg
                })
                .collect();
            event
        })
        .collect()
}

/// Every consumer takes the next batch until none is left. Returns (committed, failed or
/// retried, committed by the batch fast path).
async fn consume_all(
    consumers: &[Consumer],
    batches: Arc<Vec<SqsEvent>>,
) -> anyhow::Result<(u64, u64, u64)> {
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = consumers
        .iter()
        .cloned()
        .map(|consumer| {
            let (next, batches) = (next.clone(), batches.clone());
            tokio::spawn(async move {
                let (mut committed, mut failed, mut batched) = (0u64, 0u64, 0u64);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(event) = batches.get(i) else { break };
                    // `handle_batch` minus its metrics line on stdout.
                    let (resp, stats) = consumer.handle_batch_with_stats(event.clone()).await;
                    committed += stats.committed as u64;
                    batched += stats.batched as u64;
                    failed += resp.batch_item_failures.len() as u64 + stats.failed as u64;
                }
                (committed, failed, batched)
            })
        })
        .collect();
    let (mut committed, mut failed, mut batched) = (0, 0, 0);
    for t in tasks {
        let (c, f, b) = t.await?;
        committed += c;
        failed += f;
        batched += b;
    }
    Ok((committed, failed, batched))
}

/// The per-order baseline: the single order's transaction (its insert and conditional stock
/// update, then commit) per order, with `connections` connections.
async fn baseline_run(
    database_url: &str,
    pool: &PgPool,
    orders: usize,
    connections: usize,
) -> anyhow::Result<ConsumerRun> {
    let what = "baseline: one transaction per order";
    per_order_run(
        database_url,
        pool,
        orders,
        connections,
        what,
        |p, attempt| async move {
            let mut tx = p.begin().await?;
            order::insert_confirmed(&mut tx, &attempt).await?;
            let left = activity::take_stock(&mut tx, attempt.activity_id, 1, None).await?;
            if left.is_none() {
                tx.rollback().await?;
                return Ok(false);
            }
            tx.commit().await?;
            Ok(true)
        },
    )
    .await
}

/// The floor the batch path is held to: one autocommit `INSERT` of one order row per statement
/// (`order::insert_confirmed` on a pooled connection, no transaction around it, no stock update),
/// with `connections` connections.
async fn bare_inserts_run(
    database_url: &str,
    pool: &PgPool,
    orders: usize,
    connections: usize,
) -> anyhow::Result<ConsumerRun> {
    let what = "bare inserts: one autocommit single-row INSERT per order";
    per_order_run(
        database_url,
        pool,
        orders,
        connections,
        what,
        |p, attempt| async move {
            let mut conn = p.acquire().await?;
            order::insert_confirmed(&mut conn, &attempt).await?;
            Ok(true)
        },
    )
    .await
}

/// `orders` orders of a fresh activity of that size, each a distinct buyer's one unit written by
/// `write` on a pool of `connections` connections of its own (`Ok(true)`: sold, `Ok(false)`:
/// refused), `connections` at once; then what the database holds.
async fn per_order_run<F, Fut>(
    database_url: &str,
    pool: &PgPool,
    orders: usize,
    connections: usize,
    what: &str,
    write: F,
) -> anyhow::Result<ConsumerRun>
where
    F: Fn(PgPool, Attempt) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<bool, sqlx::Error>> + Send + 'static,
{
    let a = new_activity(pool, orders).await?;
    let p = sqlx::postgres::PgPoolOptions::new()
        .max_connections(connections as u32)
        .min_connections(connections as u32)
        .connect(database_url)
        .await?;
    let activity_id = a.id;
    let pp = p.clone();
    let run = util::run_tasks(connections, orders, move |i| {
        let (p, write) = (pp.clone(), write.clone());
        async move {
            let attempt = Attempt {
                request_id: Uuid::now_v7(),
                activity_id,
                user_id: format!("buyer-{i:07}"),
                quantity: 1,
                buckets: 1,
            };
            match write(p, attempt).await {
                Ok(true) => util::Outcome::Sold,
                Ok(false) => util::Outcome::Refused,
                Err(e) => util::Outcome::Error(e.to_string()),
            }
        }
    })
    .await;
    run.warn_errors(what);
    p.close().await;
    let (db_orders, db_remaining_stock) = db_facts(pool, a.id).await?;
    let r = ConsumerRun {
        what: what.into(),
        orders,
        committed: run.counts.sold,
        failed_or_retried: run.counts.refused + run.counts.errors,
        batched: 0,
        seconds: run.elapsed.as_secs_f64(),
        orders_per_s: run.counts.sold as f64 / run.elapsed.as_secs_f64(),
        db_orders,
        db_remaining_stock,
    };
    eprintln!(
        "  {:<44} {:>9.0} orders/s  committed {}",
        r.what, r.orders_per_s, r.committed
    );
    Ok(r)
}
