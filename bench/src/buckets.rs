//! Stock buckets on the 3-master Redis Cluster: one hot sale, the same crowd (distinct users,
//! one unit each, demand well above the stock) bought through `protocol::purchase::enter` as the
//! entry calls it (knowing the sale's bucket count), with the stock in 1, 3 and 8 buckets.
//!
//! Each row reads `INFO commandstats` on every node of the cluster directly (a standalone
//! connection per node) before and after the crowd, and diffs them: the node's script calls
//! (`evalsha` + `eval`) as a share of the row's, and every command the nodes ran (those the
//! scripts called included) per attempt. The counters are server-wide and never reset (other
//! clients of the cluster may be counting too): the row's figures are differences.
//!
//! At the end of each row every bucket is read (`buckets::snapshots`): the units still in
//! stock, the units in transfer between buckets (borrowed, not yet credited), and the
//! reservations. With demand at or above the stock, every unit should have been sold.

use crate::util::{self, Outcome};
use redis::aio::MultiplexedConnection;
use seckill_shared::domain::activity::{self, Activity};
use seckill_shared::domain::purchase::Attempt;
use seckill_shared::infra::config::RedisTopology;
use seckill_shared::protocol::load;
use seckill_shared::protocol::purchase::{self, Outcome as Decided};
use seckill_shared::store::buckets;
use seckill_shared::store::conn::Redis;
use seckill_shared::store::keys::{self, Bucket};
use seckill_shared::store::purchase::far_deadline;
use seckill_shared::{Config, Refusal};
use serde::Serialize;
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::RedisKind;
use uuid::Uuid;

/// The share of a bucketed row's script calls each node should carry, in percent: with the
/// buckets on every node, none idle and none the hot spot.
pub const SHARE_GOAL: (f64, f64) = (20.0, 45.0);

/// The section's sizes.
pub struct Sizes {
    pub stock: i64,
    /// Attempts per row, each by a user of its own.
    pub attempts: usize,
    pub concurrency: usize,
    /// The bucket counts measured, one row each.
    pub counts: Vec<u32>,
}

/// One cluster node's part of a row.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeShare {
    /// `host:port`, as `REDIS_CLUSTER_URLS` names it.
    pub node: String,
    /// The sale's buckets whose slot this node serves.
    pub buckets: u32,
    /// `evalsha` + `eval` calls over the row.
    pub script_calls: u64,
    /// Percent of the row's script calls.
    pub share: f64,
    /// Every command over the row (the scripts' own calls included; `INFO` not counted).
    pub commands: u64,
    /// The node process's CPU time over the row (`INFO cpu`: `used_cpu_user` +
    /// `used_cpu_sys`), ms.
    pub cpu_ms: f64,
}

/// One bucket count under the crowd.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BucketRow {
    pub buckets: u32,
    pub attempts: usize,
    pub stock: i64,
    pub concurrency: usize,
    pub seconds: f64,
    pub attempts_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// When the last unit sold, from the start of the crowd.
    pub sold_out_after_s: f64,
    /// The attempts handed out up to the one that bought the last unit, per second of that
    /// time: the rate while there was stock to sell (the rest of the crowd is refusals).
    pub selling_attempts_per_s: f64,
    pub nodes: Vec<NodeShare>,
    /// The bench process's CPU time over the row (every thread's, from
    /// `/proc/self/task/*/schedstat`), ms: the crowd's client side, the hints and the borrows.
    pub bench_cpu_ms: f64,
    /// The cores the bench and the three nodes kept busy together over the row (their CPU time
    /// ÷ the row's wall time), against the machine's `cores`.
    pub cores_busy: f64,
    pub cores: usize,
    pub script_calls_per_attempt: f64,
    /// Commands the three nodes executed per attempt, the scripts' own calls included.
    pub redis_commands_per_attempt: f64,
    pub sold: u64,
    pub sold_out: u64,
    /// Units left in the buckets' stock when every attempt is done.
    pub stock_left: i64,
    /// Units taken from a bucket for another and not yet known to be there.
    pub in_transfer: i64,
    /// Units the buckets' ledgers hold as reservations (each a sale the crowd was told of).
    pub reserved: i64,
    /// Stock − sold when the demand was at least the stock (`None` otherwise).
    pub undersell: Option<i64>,
    pub errors: u64,
}

impl BucketRow {
    /// Whether every node carried its share of the script calls; `None` for one bucket,
    /// which is one slot and so one node by design.
    pub fn shares_met(&self) -> Option<bool> {
        (self.buckets > 1).then(|| {
            let (lo, hi) = SHARE_GOAL;
            self.nodes.iter().all(|n| n.share >= lo && n.share <= hi)
        })
    }
}

/// Every bucket count of `sizes`, after a discarded warm-up on a sale spread over all of
/// them; the section's keys are deleted at the end, whatever happened.
pub async fn run(
    database_url: &str,
    pool: &PgPool,
    sizes: &Sizes,
) -> anyhow::Result<Vec<BucketRow>> {
    let mut config = testkit::config(database_url, RedisKind::Cluster);
    config.key_prefix = util::fresh_prefix();
    let redis = Redis::connect(&config).await?;
    let mut nodes = Nodes::connect(&config.redis).await?;
    let users: Arc<Vec<String>> = Arc::new(
        (0..sizes.attempts)
            .map(|i| format!("buyer-{i:07}"))
            .collect(),
    );
    let result = measure_all(&config, &redis, pool, &mut nodes, &users, sizes).await;
    if let Err(e) = nodes.delete_prefix(&config.key_prefix).await {
        eprintln!("  ! could not delete the buckets section's keys: {e:#}");
    }
    result
}

async fn measure_all(
    config: &Config,
    redis: &Redis,
    pool: &PgPool,
    nodes: &mut Nodes,
    users: &Arc<Vec<String>>,
    sizes: &Sizes,
) -> anyhow::Result<Vec<BucketRow>> {
    // Connections to every node, the scripts in every node's cache, the runtime warm.
    let widest = sizes.counts.iter().copied().max().unwrap_or(1);
    let warm = Sizes {
        stock: (sizes.stock / 10).max(i64::from(widest)),
        attempts: sizes.attempts.min(2_000),
        concurrency: sizes.concurrency,
        counts: vec![widest],
    };
    measure(config, redis, pool, nodes, users, &warm, widest).await?;
    let mut rows = Vec::new();
    for &count in &sizes.counts {
        eprintln!(
            "- {count} bucket(s): {} attempts, stock {}",
            sizes.attempts, sizes.stock
        );
        let row = measure(config, redis, pool, nodes, users, sizes, count).await?;
        let shares: Vec<String> = row
            .nodes
            .iter()
            .map(|n| format!("{} {:.1} %", n.node, n.share))
            .collect();
        eprintln!(
            "  {:>8.0}/s  p99 {:.2} ms  scripts/attempt {:.2}  cmds/attempt {:.2}  sold {} / {}  left {}  [{}]",
            row.attempts_per_s,
            row.p99_ms,
            row.script_calls_per_attempt,
            row.redis_commands_per_attempt,
            row.sold,
            row.stock,
            row.stock_left,
            shares.join(", ")
        );
        rows.push(row);
    }
    Ok(rows)
}

/// What one row's attempts need.
struct Ctx {
    redis: Redis,
    /// One container's hints, as the entry keeps them: the bench's tasks are its requests.
    hints: seckill_shared::protocol::buckets::Hints,
    activity_id: i64,
    count: u32,
    users: Arc<Vec<String>>,
    started: Instant,
    /// µs from `started` to the latest sale, and the highest attempt index that bought.
    last_activity_us: AtomicU64,
    last_activity_index: AtomicUsize,
}

async fn measure(
    config: &Config,
    redis: &Redis,
    pool: &PgPool,
    nodes: &mut Nodes,
    users: &Arc<Vec<String>>,
    sizes: &Sizes,
    count: u32,
) -> anyhow::Result<BucketRow> {
    let activity = open_activity(config, redis, pool, sizes.stock, count).await?;
    let before = nodes.commandstats().await?;
    let cpu_before = (nodes.cpu_ms().await?, own_cpu_ms());
    // The clock starts with the crowd (`run_tasks` starts its own a moment later).
    let ctx = Arc::new(Ctx {
        redis: redis.clone(),
        hints: seckill_shared::protocol::buckets::Hints::new(),
        activity_id: activity.id,
        count,
        users: users.clone(),
        started: Instant::now(),
        last_activity_us: AtomicU64::new(0),
        last_activity_index: AtomicUsize::new(0),
    });
    let c = ctx.clone();
    let run = util::run_tasks(sizes.concurrency, sizes.attempts, move |i| {
        let c = c.clone();
        async move { attempt(&c, i).await }
    })
    .await;
    let after = nodes.commandstats().await?;
    let cpu_after = (nodes.cpu_ms().await?, own_cpu_ms());
    run.warn_errors(&format!("{count} bucket(s)"));
    let node_cpu: Vec<f64> = cpu_before
        .0
        .iter()
        .zip(&cpu_after.0)
        .map(|(b, a)| a - b)
        .collect();
    let bench_cpu_ms = cpu_after.1 - cpu_before.1;

    let held = nodes.buckets_held(activity.id, count).await?;
    let per_node: Vec<(u64, u64)> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| (script_calls(b, a), util::commands_between(b, a)))
        .collect();
    let scripts: u64 = per_node.iter().map(|(s, _)| s).sum();
    let commands: u64 = per_node.iter().map(|(_, c)| c).sum();
    let shares = nodes
        .names
        .iter()
        .zip(&held)
        .zip(&per_node)
        .zip(&node_cpu)
        .map(
            |(((node, &buckets), &(script_calls, commands)), &cpu_ms)| NodeShare {
                node: node.clone(),
                buckets,
                script_calls,
                share: 100.0 * script_calls as f64 / scripts.max(1) as f64,
                commands,
                cpu_ms,
            },
        )
        .collect();
    let busy_ms = bench_cpu_ms + node_cpu.iter().sum::<f64>();

    let (mut stock_left, mut in_transfer, mut reserved) = (0, 0, 0);
    for (_, snap) in buckets::snapshots(redis, activity.id, count).await? {
        stock_left += snap.stock.unwrap_or(0);
        in_transfer += snap.transfer_quantity();
        reserved += snap.pending_quantity();
    }
    let attempts = sizes.attempts as f64;
    let sold_out_after = Duration::from_micros(ctx.last_activity_us.load(Ordering::Relaxed));
    Ok(BucketRow {
        buckets: count,
        attempts: sizes.attempts,
        stock: sizes.stock,
        concurrency: sizes.concurrency,
        seconds: run.elapsed.as_secs_f64(),
        attempts_per_s: run.per_sec(),
        p50_ms: run.p50_ms(),
        p99_ms: run.p99_ms(),
        sold_out_after_s: sold_out_after.as_secs_f64(),
        selling_attempts_per_s: (ctx.last_activity_index.load(Ordering::Relaxed) + 1) as f64
            / sold_out_after.as_secs_f64().max(1e-9),
        nodes: shares,
        bench_cpu_ms,
        cores_busy: busy_ms / 1e3 / run.elapsed.as_secs_f64().max(1e-9),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        script_calls_per_attempt: scripts as f64 / attempts,
        redis_commands_per_attempt: commands as f64 / attempts,
        sold: run.counts.sold,
        sold_out: run.counts.refused,
        stock_left,
        in_transfer,
        reserved,
        undersell: (sizes.attempts as i64 >= sizes.stock)
            .then(|| sizes.stock - run.counts.sold as i64),
        errors: run.counts.errors,
    })
}

/// A sale open now with its stock in `count` buckets, loaded as preheat loads it (the
/// database row, the lock, every bucket).
async fn open_activity(
    config: &Config,
    redis: &Redis,
    pool: &PgPool,
    stock: i64,
    count: u32,
) -> anyhow::Result<Activity> {
    let row = activity::insert(
        pool,
        &testkit::new_activity()
            .title(format!("bench buckets x{count}"))
            .stock(stock)
            .limit(1)
            .buckets(count)
            .build()
            .settings()?,
    )
    .await?;
    let (_, loaded) = load::load_under_lock(
        redis,
        pool,
        config,
        row.id,
        std::time::Instant::now() + std::time::Duration::from_secs(60),
    )
    .await?;
    anyhow::ensure!(
        buckets::all_loaded(redis, row.id, count).await?,
        "sale {} is not loaded in {count} buckets",
        row.id
    );
    Ok(loaded)
}

/// One buyer, one unit. A refusal other than `sold_out` is an error: every buyer is new and
/// the sale is open.
async fn attempt(c: &Ctx, i: usize) -> Outcome {
    let mut buy = Attempt {
        request_id: Uuid::now_v7(),
        activity_id: c.activity_id,
        user_id: c.users[i % c.users.len()].clone(),
        quantity: 1,
        buckets: c.count,
    };
    match purchase::enter(&c.redis, &c.hints, &mut buy, far_deadline()).await {
        Ok(Decided::Reserved(_)) => {
            let at = c.started.elapsed().as_micros() as u64;
            c.last_activity_us.fetch_max(at, Ordering::Relaxed);
            c.last_activity_index.fetch_max(i, Ordering::Relaxed);
            Outcome::Sold
        }
        Ok(Decided::Refused(Refusal::SoldOut { .. })) => Outcome::Refused,
        Ok(Decided::Refused(other)) => Outcome::Error(format!("refused: {other}")),
        Ok(other) => Outcome::Error(format!("a first-come sale answered {other:?}")),
        Err(e) => Outcome::Error(format!("{e:#}")),
    }
}

/// Script calls between two snapshots of one node.
fn script_calls(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> u64 {
    ["evalsha", "eval"]
        .iter()
        .map(|name| {
            let at = |m: &BTreeMap<String, u64>| m.get(*name).copied().unwrap_or(0);
            at(after).saturating_sub(at(before))
        })
        .sum()
}

/// CPU time of every thread of this process so far, ms (the first field of each thread's
/// `schedstat`: ns on a CPU). Threads that ended are not counted; the runtime's workers live
/// as long as the bench.
fn own_cpu_ms() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e6
}

/// A standalone connection to each node of the cluster, in `REDIS_CLUSTER_URLS` order.
struct Nodes {
    names: Vec<String>,
    cons: Vec<MultiplexedConnection>,
}

impl Nodes {
    async fn connect(topology: &RedisTopology) -> anyhow::Result<Self> {
        let RedisTopology::Cluster(urls) = topology else {
            anyhow::bail!("the buckets section needs REDIS_CLUSTER_URLS");
        };
        let mut names = Vec::new();
        let mut cons = Vec::new();
        for url in urls {
            let mut con = redis::Client::open(url.expose())?
                .get_multiplexed_async_connection()
                .await?;
            con.set_response_timeout(Duration::from_secs(60));
            let name = url
                .expose()
                .trim_start_matches("redis://")
                .trim_end_matches('/');
            names.push(name.to_string());
            cons.push(con);
        }
        Ok(Self { names, cons })
    }

    /// Each node's `INFO commandstats` as name -> calls.
    async fn commandstats(&mut self) -> anyhow::Result<Vec<BTreeMap<String, u64>>> {
        let mut all = Vec::new();
        for con in &mut self.cons {
            all.push(util::commandstats(con).await?);
        }
        Ok(all)
    }

    /// Each node process's CPU time so far (`INFO cpu`: `used_cpu_user` + `used_cpu_sys`), ms.
    async fn cpu_ms(&mut self) -> anyhow::Result<Vec<f64>> {
        let mut all = Vec::new();
        for con in &mut self.cons {
            let info: String = redis::cmd("INFO").arg("cpu").query_async(con).await?;
            let seconds: f64 = info
                .lines()
                .filter_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    matches!(name, "used_cpu_user" | "used_cpu_sys")
                        .then(|| value.trim().parse::<f64>().ok())?
                })
                .sum();
            all.push(seconds * 1e3);
        }
        Ok(all)
    }

    /// How many of the sale's buckets each node holds: the node whose slot of a bucket's
    /// tag holds keys (`CLUSTER COUNTKEYSINSLOT` is 0 on the nodes that do not serve it).
    async fn buckets_held(&mut self, activity_id: i64, count: u32) -> anyhow::Result<Vec<u32>> {
        let mut held = vec![0; self.cons.len()];
        for b in Bucket::all(activity_id, count) {
            let slot = keys::slot(&b.tag());
            for (n, con) in self.cons.iter_mut().enumerate() {
                let keys: i64 = redis::cmd("CLUSTER")
                    .arg("COUNTKEYSINSLOT")
                    .arg(slot)
                    .query_async(con)
                    .await?;
                if keys > 0 {
                    held[n] += 1;
                }
            }
        }
        Ok(held)
    }

    /// Deletes every key under `prefix:` on every node, one key per UNLINK (keys of
    /// different slots cannot share one, even on one node).
    async fn delete_prefix(&mut self, prefix: &str) -> anyhow::Result<u64> {
        let pattern = format!("{prefix}:*");
        let mut deleted = 0;
        for con in &mut self.cons {
            let mut cursor: u64 = 0;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(con)
                    .await?;
                for key in keys {
                    let n: i64 = redis::cmd("UNLINK").arg(&key).query_async(con).await?;
                    deleted += n as u64;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(deleted)
    }
}
