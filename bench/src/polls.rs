//! Order polling with a big orders table: `GET /activities/{id}/orders/me` through the entry
//! router in-process, for buyers whose order is in the database (no ledger entry left), with
//! `orders` rows of one sale in the table (1,000,000; fewer with `--quick`).
//!
//! The rows are made by one `insert … select … generate_series` in the run's fresh database,
//! then `analyze`d. The database time per poll is the `Execution Time` PostgreSQL reports for
//! `explain (analyze, format json)` of the shipped statement (`order::latest_for_user`'s, read
//! from the committed `.sqlx/` data), averaged over sampled buyers: server-side execution only,
//! no parse, plan or network. The round trip of the same call from the bench (sequential, one
//! connection) is reported beside it.

use crate::util::{self, Outcome};
use seckill_entry::EntryState;
use seckill_shared::domain::activity;
use seckill_shared::domain::order;
use seckill_shared::infra::sqs::{OrderQueue, Queues};
use seckill_shared::store::conn::Redis;
use seckill_shared::Context;
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::ServiceExt;

/// Buyers sampled for the `explain analyze` and round-trip figures.
const SAMPLES: usize = 200;

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PollResults {
    /// Orders of the polled sale in the table.
    pub orders_in_table: usize,
    pub insert_seconds: f64,
    pub polls: usize,
    pub concurrency: usize,
    pub polls_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Mean `Execution Time` of `explain (analyze)` of the shipped statement, ms.
    pub db_execution_ms: f64,
    /// Mean round trip of `order::latest_for_user` from the bench, ms.
    pub db_round_trip_ms: f64,
    /// The indexes the statement's plan reads.
    pub plan_indexes: Vec<String>,
    pub errors: u64,
}

pub struct Sizes {
    pub orders: usize,
    pub polls: usize,
    pub concurrency: usize,
}

pub async fn run(database_url: &str, sizes: &Sizes) -> anyhow::Result<PollResults> {
    let mut config = testkit::config(database_url, testkit::RedisKind::Standalone);
    config.key_prefix = util::fresh_prefix();
    config.redis_timeout = Duration::from_secs(5);
    // A pool of the section's own, closed at the end.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(sizes.concurrency as u32)
        .connect(database_url)
        .await?;
    let result = measure(&config, &pool, sizes).await;
    pool.close().await;
    result
}

async fn measure(
    config: &seckill_shared::Config,
    pool: &PgPool,
    sizes: &Sizes,
) -> anyhow::Result<PollResults> {
    let activity = activity::insert(
        pool,
        &testkit::new_activity()
            .title("bench order polling")
            .stock(sizes.orders as i64)
            .limit(1)
            .build()
            .settings()?,
    )
    .await?;
    let t = Instant::now();
    fill_orders(pool, activity.id, sizes.orders).await?;
    let insert_seconds = t.elapsed().as_secs_f64();
    eprintln!(
        "  {} orders inserted in {insert_seconds:.1} s",
        sizes.orders
    );

    let redis = Redis::connect(config).await?;
    let queue = OrderQueue::new(
        seckill_shared::infra::sqs::sqs_client().await,
        // Polls never send.
        "http://127.0.0.1:9/unused",
        config.sqs_timeout,
    );
    let state = EntryState::new(
        Context::new(config.clone(), pool.clone(), redis),
        Queues::one(queue),
    );
    let router = seckill_entry::router(state);
    let n = sizes.orders;
    let path = Arc::new(format!("/activities/{}/orders/me", activity.id));
    let run = util::run_tasks(sizes.concurrency, sizes.polls, move |i| {
        let (router, path) = (router.clone(), path.clone());
        async move {
            let user = buyer(spread(i, n));
            let req = testkit::request("GET", &path, Some((&user, "")), None);
            match router.oneshot(req).await {
                Ok(resp) if resp.status().is_success() => {
                    let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
                        .await
                        .unwrap_or_default();
                    if body.windows(11).any(|w| w == b"\"confirmed\"") {
                        Outcome::Refused
                    } else {
                        Outcome::Error(format!("unexpected {}", String::from_utf8_lossy(&body)))
                    }
                }
                Ok(resp) => Outcome::Error(format!("status {}", resp.status())),
                Err(e) => Outcome::Error(e.to_string()),
            }
        }
    })
    .await;
    run.warn_errors("order polling");

    let statement = shipped_statement()?;
    let (db_execution_ms, plan_indexes) = explain(pool, &statement, activity.id, n).await?;
    let db_round_trip_ms = round_trip(pool, activity.id, n).await?;
    eprintln!(
        "  {:>9.0} polls/s  p50 {:.3} ms  db execution {db_execution_ms:.3} ms  round trip {db_round_trip_ms:.3} ms  plan {plan_indexes:?}",
        run.per_sec(),
        run.p50_ms()
    );
    Ok(PollResults {
        orders_in_table: sizes.orders,
        insert_seconds,
        polls: sizes.polls,
        concurrency: sizes.concurrency,
        polls_per_s: run.per_sec(),
        p50_ms: run.p50_ms(),
        p99_ms: run.p99_ms(),
        db_execution_ms,
        db_round_trip_ms,
        plan_indexes,
        errors: run.counts.errors,
    })
}

fn buyer(i: usize) -> String {
    format!("buyer-{i:07}")
}

/// The `i`th poll's buyer, spread over the whole table rather than its first rows.
fn spread(i: usize, n: usize) -> usize {
    (i.wrapping_mul(7_919)) % n.max(1)
}

/// One order per buyer, all of one sale, in one statement.
async fn fill_orders(pool: &PgPool, activity_id: i64, n: usize) -> anyhow::Result<()> {
    sqlx::query(
        "insert into orders (request_id, activity_id, user_id, quantity, status,
                             unit_price_minor, currency)
         select gen_random_uuid(), $1, 'buyer-' || lpad(g::text, 7, '0'), 1, 'confirmed',
                a.price_minor, a.currency
         from generate_series(0, $2 - 1) g, activities a where a.id = $1",
    )
    .bind(activity_id)
    .bind(n as i64)
    .execute(pool)
    .await?;
    sqlx::query("analyze orders").execute(pool).await?;
    Ok(())
}

/// `order::latest_for_user`'s statement as shipped (the committed offline data).
fn shipped_statement() -> anyhow::Result<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.sqlx");
    for entry in std::fs::read_dir(&dir)? {
        let data: Value = serde_json::from_str(&std::fs::read_to_string(entry?.path())?)?;
        let query = data["query"].as_str().unwrap_or_default();
        if query.contains("from orders where activity_id = $1 and user_id = $2")
            && query.contains("order by")
        {
            return Ok(query.to_string());
        }
    }
    anyhow::bail!(
        "order::latest_for_user's statement is not in {}",
        dir.display()
    )
}

/// Mean execution time (ms) of the statement for sampled buyers, and the indexes its plan reads.
async fn explain(
    pool: &PgPool,
    statement: &str,
    activity_id: i64,
    n: usize,
) -> anyhow::Result<(f64, Vec<String>)> {
    let explain = format!("explain (analyze, format json) {statement}");
    let mut total = 0.0;
    let mut indexes = Vec::new();
    for i in 0..SAMPLES {
        let (plan,): (Value,) = sqlx::query_as(sqlx::AssertSqlSafe(explain.clone()))
            .bind(activity_id)
            .bind(buyer(spread(i + 1, n)))
            .fetch_one(pool)
            .await?;
        total += plan[0]["Execution Time"].as_f64().unwrap_or(0.0);
        if i == 0 {
            collect_indexes(&plan[0]["Plan"], &mut indexes);
        }
    }
    Ok((total / SAMPLES as f64, indexes))
}

fn collect_indexes(node: &Value, out: &mut Vec<String>) {
    if let Some(name) = node["Index Name"].as_str() {
        out.push(name.to_string());
    }
    if let Some(children) = node["Plans"].as_array() {
        for child in children {
            collect_indexes(child, out);
        }
    }
}

/// Mean round trip (ms) of `order::latest_for_user` from here, one call at a time.
async fn round_trip(pool: &PgPool, activity_id: i64, n: usize) -> anyhow::Result<f64> {
    let t = Instant::now();
    for i in 0..SAMPLES {
        let found = order::latest_for_user(pool, activity_id, &buyer(spread(i + 2, n))).await?;
        anyhow::ensure!(found.is_some(), "a sampled buyer has no order");
    }
    Ok(t.elapsed().as_secs_f64() * 1e3 / SAMPLES as f64)
}
