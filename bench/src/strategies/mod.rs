//! Five ways to take one unit of stock, compared under the same workload (same users, stock,
//! attempt count and concurrency) on the same Redis and PostgreSQL.
//!
//! - `lua`: our purchase script through `testkit::purchase` (window, limit, stock, user set,
//!   ledger: one round trip).
//! - `hincrby`: HINCRBY -1 on the goods hash, a client-side check, and a compensating
//!   HINCRBY +1 on a negative result (two round trips on failure).
//! - `lock`: a Redis lock around a read and a decrement, on our lock's scripts: take it
//!   (`lua/lock_acquire.lua`, retry every 1 ms for up to 1 s), GET, DECR, owner-checked
//!   release (`lua/lock_release.lua`).
//! - `db-only`: conditional update + order insert, one transaction per attempt.
//! - `limit`: the purchase script by raw EVALSHA, arguments prepared beforehand: no
//!   application around it.
//!
//! Each Redis strategy's tasks share one `ConnectionManager` (one multiplexed TCP connection).
//! A second, "kill" run of `lua`, `hincrby` and `lock` drops the attempt's future between its
//! first and second step for a fixed 1% of attempts and counts the stock that nobody can
//! account for afterwards.

mod attempts;

pub use attempts::Strategy;
use attempts::{attempt, Ctx};

use crate::util::{self, counter, Run, Sampler};
use chrono::Utc;
use redis::aio::MultiplexedConnection;
use seckill_shared::domain::activity;
use seckill_shared::domain::activity::Activity;
use seckill_shared::store::conn::Redis;
use seckill_shared::store::conn::RedisConn;
use seckill_shared::store::ledger;
use seckill_shared::store::purchase;
use seckill_shared::store::scripts;
use serde::Serialize;
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// Share of attempts (per mille) that die between their two steps in the kill run.
pub const DIE_PERMILLE: u64 = 10;

#[derive(Clone, Copy, Debug)]
pub struct Workload {
    pub name: &'static str,
    pub attempts: usize,
    pub stock: i64,
}

impl Workload {
    pub fn success_heavy(attempts: usize) -> Self {
        Self {
            name: "success-heavy",
            attempts,
            stock: attempts as i64,
        }
    }

    pub fn failure_heavy(attempts: usize) -> Self {
        Self {
            name: "failure-heavy",
            attempts,
            stock: (attempts as i64 / 100).max(1),
        }
    }
}

/// The kill run's figures.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KillRun {
    pub attempts: usize,
    pub stock: i64,
    pub died: u64,
    /// Units sold and recorded by living clients.
    pub sold: u64,
    /// Units a durable record still accounts for (the ledger's pending reservations; only the
    /// `lua` strategy has one).
    pub pending_in_ledger: i64,
    pub final_stock: i64,
    /// `stock - final_stock - sold - pending_in_ledger`: units nobody can account for.
    pub leaked: i64,
}

/// One row of the table.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    pub name: &'static str,
    pub workload: &'static str,
    pub attempts: usize,
    pub stock: i64,
    pub concurrency: usize,
    pub seconds: f64,
    pub attempts_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Commands the Redis server executed per attempt (INFO commandstats delta, including
    /// commands run inside scripts, less the side sampler's reads).
    pub redis_commands_per_attempt: f64,
    /// Requests the client sent to Redis per attempt (counted by the client).
    pub round_trips_per_attempt: f64,
    pub command_detail: BTreeMap<String, u64>,
    pub sold: u64,
    pub busy: u64,
    pub oversell: i64,
    pub final_stock: i64,
    pub negative_seen: bool,
    pub negative_observed_by_clients: u64,
    pub min_stock_sampled: Option<i64>,
    pub stock_samples: u64,
    /// From the kill run (`None` where there is no second step to die before).
    pub leaked: Option<i64>,
    pub kill: Option<KillRun>,
    pub errors: u64,
}

/// What every strategy run needs.
pub struct Env {
    pub client: redis::Client,
    pub admin: MultiplexedConnection,
    pub pool: PgPool,
    pub database_url: String,
    pub users: Arc<Vec<String>>,
    pub concurrency: usize,
    pub db_pool_size: u32,
}

/// An activity row as preheat would load it: open now, one unit per user.
pub fn open_activity(id: i64, stock: i64) -> Activity {
    let now = Utc::now();
    Activity {
        id,
        title: "bench".into(),
        total_stock: stock,
        remaining_stock: stock,
        per_order_limit: 1,
        start_at: now - chrono::Duration::minutes(1),
        end_at: now + chrono::Duration::hours(1),
        state: seckill_shared::domain::status::ActivityState::Published,
        config_version: 1,
        last_fence_token: 0,
        load_epoch: 1,
        created_at: now,
        updated_at: now,
        buckets: 1,
        admission: seckill_shared::domain::settings::Admission::Fcfs,
        draw_window_ms: 0,
        per_user_rate_per_sec: 0,
        price_minor: 1_999,
        currency: "usd".into(),
        draw_secret: Default::default(),
        max_entrants: 1_000_000,
    }
}

/// Runs every strategy under one workload; `kill_attempts` sizes the kill runs.
pub async fn run_workload(
    env: &mut Env,
    wl: Workload,
    kill_attempts: usize,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    if wl.name == "success-heavy" {
        // Warm-up (discarded): connections, script cache, runtime threads, allocator.
        let small = Workload::success_heavy(wl.attempts.min(10_000));
        for s in [Strategy::Lua, Strategy::Limit, Strategy::Hincrby] {
            eprintln!(
                "- warm-up: {} ({} attempts, discarded)",
                s.name(),
                small.attempts
            );
            measure(env, s, small).await?;
        }
    }
    for s in Strategy::ALL {
        eprintln!(
            "- {} / {}: {} attempts, stock {}",
            s.name(),
            wl.name,
            wl.attempts,
            wl.stock
        );
        let mut row = measure(env, s, wl).await?;
        if s.killable() {
            let kwl = Workload {
                attempts: kill_attempts.min(wl.attempts),
                stock: if wl.name == "success-heavy" {
                    kill_attempts.min(wl.attempts) as i64
                } else {
                    (kill_attempts.min(wl.attempts) as i64 / 100).max(1)
                },
                ..wl
            };
            eprintln!(
                "  kill run: {} attempts, stock {}, {}‰ die between their steps",
                kwl.attempts, kwl.stock, DIE_PERMILLE
            );
            let k = kill(env, s, kwl).await?;
            row.leaked = Some(k.leaked);
            row.kill = Some(k);
        }
        eprintln!(
            "  {:>9.0}/s  p50 {:.3} ms  p99 {:.3} ms  cmds/attempt {:.2}  sold {}  leaked {:?}",
            row.attempts_per_s,
            row.p50_ms,
            row.p99_ms,
            row.redis_commands_per_attempt,
            row.sold,
            row.leaked
        );
        rows.push(row);
    }
    Ok(rows)
}

async fn setup(env: &mut Env, s: Strategy, wl: Workload, die_permille: u64) -> anyhow::Result<Ctx> {
    let prefix = util::fresh_prefix();
    let cm = util::manager(&env.client).await?;
    let redis = Redis::new(
        RedisConn::Standalone(cm.clone()),
        &prefix,
        Duration::from_secs(5),
    );
    let activity_id = 1;
    let keys = redis.keys(activity_id);
    let goods = format!("{prefix}:{{{activity_id}}}:goods");
    let mut con = env.admin.clone();
    let purchase_sha = scripts::PURCHASE
        .prepare_invoke()
        .load_async(&mut con)
        .await?;
    for script in [&scripts::LOCK_ACQUIRE, &scripts::LOCK_RELEASE] {
        let _: String = script.prepare_invoke().load_async(&mut con).await?;
    }
    let mut pool = None;
    let mut activity_id = activity_id;
    match s {
        Strategy::Lua | Strategy::Limit => {
            testkit::load_without_db(
                &redis,
                &open_activity(activity_id, wl.stock),
                Duration::from_secs(3600),
            )
            .await?;
        }
        Strategy::Hincrby => {
            let _: i64 = redis::cmd("HSET")
                .arg(&goods)
                .arg("stock")
                .arg(wl.stock)
                .query_async(&mut con)
                .await?;
        }
        Strategy::Lock => {
            let _: i64 = redis::cmd("HSET")
                .arg(&keys.meta)
                .arg("stock")
                .arg(wl.stock)
                .query_async(&mut con)
                .await?;
        }
        Strategy::DbOnly => {
            let a = activity::insert(
                &env.pool,
                &testkit::new_activity()
                    .title("bench db-only")
                    .stock(wl.stock)
                    .limit(1)
                    .build()
                    .settings()?,
            )
            .await?;
            activity_id = a.id;
            pool = Some(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(env.db_pool_size)
                    .min_connections(env.db_pool_size)
                    .connect(&env.database_url)
                    .await?,
            );
        }
    }
    // The bucket count and the sale's terms, as the entry passes them once it has read them.
    let carried = match s {
        Strategy::Limit => {
            let terms = purchase::read_terms(&redis, activity_id.into()).await?;
            let mut args = vec!["1".to_string()];
            args.extend(purchase::carried(terms.as_ref()).map(String::from));
            args
        }
        _ => Vec::new(),
    };
    let request_ids = if s == Strategy::Limit {
        (0..wl.attempts)
            .map(|_| Uuid::now_v7().to_string())
            .collect()
    } else {
        Vec::new()
    };
    Ok(Ctx {
        redis,
        cm,
        keys,
        goods,
        users: env.users.clone(),
        request_ids: Arc::new(request_ids),
        purchase_sha,
        carried,
        die_permille,
        negative: counter(),
        calls: counter(),
        pool,
        activity_id,
    })
}

async fn final_stock(env: &mut Env, c: &Ctx, s: Strategy) -> anyhow::Result<i64> {
    let mut con = env.admin.clone();
    Ok(match s {
        Strategy::Hincrby => redis::cmd("HGET")
            .arg(&c.goods)
            .arg("stock")
            .query_async::<Option<i64>>(&mut con)
            .await?
            .unwrap_or(0),
        Strategy::DbOnly => activity::remaining_stock(&env.pool, c.activity_id)
            .await?
            .ok_or(sqlx::Error::RowNotFound)? as i64,
        _ => redis::cmd("HGET")
            .arg(&c.keys.meta)
            .arg("stock")
            .query_async::<Option<i64>>(&mut con)
            .await?
            .unwrap_or(0),
    })
}

/// Samples the DB row's stock every couple of milliseconds (db-only's "negative seen").
fn db_sampler(
    pool: PgPool,
    activity_id: i64,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<util::Samples> {
    tokio::spawn(async move {
        let mut s = util::Samples::default();
        while !stop.load(Ordering::Relaxed) {
            if let Ok(Some(v)) = activity::remaining_stock(&pool, activity_id).await {
                s.count += 1;
                s.min = Some(s.min.map_or(v, |m| m.min(v)));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        s
    })
}

async fn measure(env: &mut Env, s: Strategy, wl: Workload) -> anyhow::Result<Row> {
    let c = Arc::new(setup(env, s, wl, 0).await?);
    let sampler_con = env.client.get_multiplexed_async_connection().await?;
    let (sampler, db_stop, db_task) = match s {
        Strategy::DbOnly => {
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let task = db_sampler(env.pool.clone(), c.activity_id, stop.clone());
            (None, Some(stop), Some(task))
        }
        Strategy::Hincrby => (
            Some(Sampler::start(
                sampler_con,
                c.goods.clone(),
                Some("stock".into()),
            )),
            None,
            None,
        ),
        _ => (
            Some(Sampler::start(
                sampler_con,
                c.keys.meta.clone(),
                Some("stock".into()),
            )),
            None,
            None,
        ),
    };
    let mut admin = env.admin.clone();
    let before = util::commandstats(&mut admin).await?;
    let ctx = c.clone();
    let run: Run = util::run_tasks(env.concurrency, wl.attempts, move |i| {
        let ctx = ctx.clone();
        async move { attempt(ctx, s, i).await }
    })
    .await;
    let after = util::commandstats(&mut admin).await?;
    let samples = match sampler {
        Some(sm) => sm.stop().await,
        None => {
            db_stop.expect("db sampler").store(true, Ordering::Relaxed);
            db_task.expect("db sampler").await.unwrap_or_default()
        }
    };
    run.warn_errors(s.name());
    // The sampler's reads are ours, not the strategy's.
    let redis_samples = if s == Strategy::DbOnly {
        0
    } else {
        samples.count
    };
    let mut detail = util::command_deltas(&before, &after);
    let sampled_cmd = if s == Strategy::Hincrby {
        "hget"
    } else {
        "get"
    };
    if let Some(v) = detail.get_mut(sampled_cmd) {
        *v = v.saturating_sub(redis_samples);
    }
    detail.retain(|_, v| *v > 0);
    let commands = util::commands_between(&before, &after).saturating_sub(redis_samples);
    let final_stock = final_stock(env, &c, s).await?;
    let negative_clients = c.negative.load(Ordering::Relaxed);
    let row = Row {
        name: s.name(),
        workload: wl.name,
        attempts: wl.attempts,
        stock: wl.stock,
        concurrency: env.concurrency,
        seconds: run.elapsed.as_secs_f64(),
        attempts_per_s: run.per_sec(),
        p50_ms: run.p50_ms(),
        p99_ms: run.p99_ms(),
        redis_commands_per_attempt: commands as f64 / wl.attempts as f64,
        round_trips_per_attempt: c.calls.load(Ordering::Relaxed) as f64 / wl.attempts as f64,
        command_detail: detail,
        sold: run.counts.sold,
        busy: run.counts.busy,
        oversell: (run.counts.sold as i64 - wl.stock).max(0),
        final_stock,
        negative_seen: negative_clients > 0
            || samples.min.is_some_and(|m| m < 0)
            || final_stock < 0,
        negative_observed_by_clients: negative_clients,
        min_stock_sampled: samples.min,
        stock_samples: samples.count,
        leaked: None,
        kill: None,
        errors: run.counts.errors,
    };
    cleanup(env, c).await?;
    Ok(row)
}

async fn kill(env: &mut Env, s: Strategy, wl: Workload) -> anyhow::Result<KillRun> {
    let c = Arc::new(setup(env, s, wl, DIE_PERMILLE).await?);
    let ctx = c.clone();
    let run = util::run_tasks(env.concurrency, wl.attempts, move |i| {
        let ctx = ctx.clone();
        async move { attempt(ctx, s, i).await }
    })
    .await;
    run.warn_errors(&format!("{} kill run", s.name()));
    let final_stock = final_stock(env, &c, s).await?;
    let pending_in_ledger = if s == Strategy::Lua {
        let snap = ledger::snapshot(&c.redis, c.activity_id).await?;
        snap.pending_quantity()
    } else {
        0
    };
    // `lua` counts every accepted reservation in the ledger (sold ones included, as a
    // consumer would settle them later): its accounted units are the ledger's.
    let accounted = if s == Strategy::Lua {
        pending_in_ledger
    } else {
        run.counts.sold as i64
    };
    let k = KillRun {
        attempts: wl.attempts,
        stock: wl.stock,
        died: run.counts.died,
        sold: run.counts.sold,
        pending_in_ledger,
        final_stock,
        leaked: wl.stock - final_stock - accounted,
    };
    cleanup(env, c).await?;
    Ok(k)
}

async fn cleanup(env: &mut Env, c: Arc<Ctx>) -> anyhow::Result<()> {
    let mut con = env.admin.clone();
    util::delete_prefix(&mut con, &c.redis.prefix).await?;
    if let Some(pool) = &c.pool {
        pool.close().await;
    }
    Ok(())
}
