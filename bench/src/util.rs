//! The measuring tools every section shares: a bounded concurrent attempt loop with
//! hdrhistogram latencies, server-side Redis command counts, a stock sampler and key cleanup.

use hdrhistogram::Histogram;
use redis::aio::{ConnectionManager, MultiplexedConnection};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one attempt came to.
#[derive(Debug)]
pub enum Outcome {
    /// A unit was sold and the client lived to record it.
    Sold,
    /// Refused (sold out, already purchased, ...): nothing sold.
    Refused,
    /// Gave up waiting for a lock.
    Busy,
    /// The client "died" between its two steps (its future was dropped there).
    Died,
    /// Any error (kept to report; never expected).
    Error(String),
}

/// Counts of one run.
#[derive(Clone, Debug, Default)]
pub struct Counts {
    pub sold: u64,
    pub refused: u64,
    pub busy: u64,
    pub died: u64,
    pub errors: u64,
    pub first_error: Option<String>,
}

impl Counts {
    fn add(&mut self, o: Outcome) {
        match o {
            Outcome::Sold => self.sold += 1,
            Outcome::Refused => self.refused += 1,
            Outcome::Busy => self.busy += 1,
            Outcome::Died => self.died += 1,
            Outcome::Error(e) => {
                self.errors += 1;
                self.first_error.get_or_insert(e);
            }
        }
    }

    fn merge(&mut self, o: Counts) {
        self.sold += o.sold;
        self.refused += o.refused;
        self.busy += o.busy;
        self.died += o.died;
        self.errors += o.errors;
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
    }
}

/// One bounded run: `attempts` calls spread over `concurrency` tasks.
pub struct Run {
    pub attempts: usize,
    pub elapsed: Duration,
    /// Latency per attempt, in microseconds.
    pub hist: Histogram<u64>,
    pub counts: Counts,
}

impl Run {
    pub fn per_sec(&self) -> f64 {
        self.attempts as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn p50_ms(&self) -> f64 {
        self.hist.value_at_quantile(0.50) as f64 / 1000.0
    }

    pub fn p99_ms(&self) -> f64 {
        self.hist.value_at_quantile(0.99) as f64 / 1000.0
    }

    /// Says so on stderr when attempts failed unexpectedly.
    pub fn warn_errors(&self, what: &str) {
        if self.counts.errors > 0 {
            eprintln!(
                "  ! {what}: {} errors, first: {}",
                self.counts.errors,
                self.counts.first_error.as_deref().unwrap_or("?")
            );
        }
    }
}

pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid histogram bounds")
}

/// Runs `f(0..attempts)` on `concurrency` tokio tasks, each taking the next index as soon as
/// its previous attempt finished (a closed loop, like a crowd of clients each waiting for its
/// answer).
pub async fn run_tasks<F, Fut>(concurrency: usize, attempts: usize, f: F) -> Run
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    let f = Arc::new(f);
    let next = Arc::new(AtomicUsize::new(0));
    // Each task's histogram is ~150 KB of counters: made before the clock starts, so a run of
    // short rounds times its attempts, not the zeroing of 64 histograms a round.
    let hists: Vec<_> = (0..concurrency).map(|_| histogram()).collect();
    let start = Instant::now();
    let tasks: Vec<_> = hists
        .into_iter()
        .map(|mut hist| {
            let f = f.clone();
            let next = next.clone();
            tokio::spawn(async move {
                let mut counts = Counts::default();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= attempts {
                        break;
                    }
                    let t = Instant::now();
                    let outcome = f(i).await;
                    hist.saturating_record(t.elapsed().as_micros().max(1) as u64);
                    counts.add(outcome);
                }
                (hist, counts)
            })
        })
        .collect();
    let mut hist = histogram();
    let mut counts = Counts::default();
    for t in tasks {
        let (h, c) = t.await.expect("bench task panicked");
        hist.add(h).expect("same histogram bounds");
        counts.merge(c);
    }
    Run {
        attempts,
        elapsed: start.elapsed(),
        hist,
        counts,
    }
}

/// `INFO commandstats` as name -> calls.
pub async fn commandstats(
    con: &mut MultiplexedConnection,
) -> anyhow::Result<BTreeMap<String, u64>> {
    Ok(calls(&command_times(con).await?))
}

/// The calls of each command in a [`command_times`] snapshot.
pub fn calls(times: &BTreeMap<String, CommandTime>) -> BTreeMap<String, u64> {
    times
        .iter()
        .map(|(name, t)| (name.clone(), t.calls))
        .collect()
}

/// Calls and microseconds the server spent in one command, from `INFO commandstats`
/// (`cmdstat_<name>:calls=…,usec=…`). A script's `usec` covers its whole run, the commands it
/// calls included.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CommandTime {
    pub calls: u64,
    pub usec: u64,
}

impl CommandTime {
    /// Server µs per call between two snapshots (`None` when no call happened).
    pub fn us_per_call_since(self, before: CommandTime) -> Option<f64> {
        let calls = self.calls.saturating_sub(before.calls);
        (calls > 0).then(|| self.usec.saturating_sub(before.usec) as f64 / calls as f64)
    }
}

/// `INFO commandstats` as name -> [`CommandTime`], every command the server has run.
pub async fn command_times(
    con: &mut MultiplexedConnection,
) -> anyhow::Result<BTreeMap<String, CommandTime>> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await?;
    Ok(parse_commandstats(&info))
}

fn parse_commandstats(info: &str) -> BTreeMap<String, CommandTime> {
    let mut out = BTreeMap::new();
    for line in info.lines() {
        let Some((name, fields)) = line
            .strip_prefix("cmdstat_")
            .and_then(|rest| rest.split_once(':'))
        else {
            continue;
        };
        let field = |key: &str| {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix(key))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let time = CommandTime {
            calls: field("calls="),
            usec: field("usec="),
        };
        out.insert(name.to_string(), time);
    }
    out
}

/// Server µs spent between two snapshots in the commands other than `outer` (and the `INFO`
/// calls that took the snapshots): for a script row, the time inside the commands the script
/// called.
pub fn usec_outside(
    before: &BTreeMap<String, CommandTime>,
    after: &BTreeMap<String, CommandTime>,
    outer: &str,
) -> u64 {
    after
        .iter()
        .filter(|(name, _)| name.as_str() != "info" && name.as_str() != outer)
        .map(|(name, t)| {
            let was = before.get(name).map_or(0, |b| b.usec);
            t.usec.saturating_sub(was)
        })
        .sum()
}

/// Commands the server executed between two snapshots (including those run inside scripts),
/// not counting the `INFO` calls that took the snapshots.
pub fn commands_between(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> u64 {
    after
        .iter()
        .filter(|(name, _)| name.as_str() != "info")
        .map(|(name, calls)| calls.saturating_sub(before.get(name).copied().unwrap_or(0)))
        .sum()
}

/// Per-command deltas (for the report's detail), `info` left out.
pub fn command_deltas(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter(|(name, _)| name.as_str() != "info")
        .map(|(name, calls)| {
            (
                name.clone(),
                calls.saturating_sub(before.get(name).copied().unwrap_or(0)),
            )
        })
        .filter(|(_, d)| *d > 0)
        .collect()
}

/// What the side sampler saw.
#[derive(Clone, Copy, Debug, Default)]
pub struct Samples {
    pub count: u64,
    pub min: Option<i64>,
}

/// Reads the stock every millisecond or so on a connection of its own until stopped, so a
/// negative value the clients never report is still seen. Each read is one command
/// (`GET key` or `HGET key field`), counted so it can be taken off the command totals.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Samples>,
}

impl Sampler {
    pub fn start(mut con: MultiplexedConnection, key: String, field: Option<String>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut s = Samples::default();
            while !flag.load(Ordering::Relaxed) {
                let cmd = match &field {
                    Some(f) => {
                        let mut c = redis::cmd("HGET");
                        c.arg(&key).arg(f);
                        c
                    }
                    None => {
                        let mut c = redis::cmd("GET");
                        c.arg(&key);
                        c
                    }
                };
                let v: Option<i64> = cmd.query_async(&mut con).await.unwrap_or(None);
                s.count += 1;
                if let Some(v) = v {
                    s.min = Some(s.min.map_or(v, |m| m.min(v)));
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            s
        });
        Self { stop, task }
    }

    pub async fn stop(self) -> Samples {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_default()
    }
}

/// Deletes every key under `prefix:` (SCAN + UNLINK). Only keys this bench created carry it.
pub async fn delete_prefix(con: &mut MultiplexedConnection, prefix: &str) -> anyhow::Result<u64> {
    let pattern = format!("{prefix}:*");
    let mut cursor: u64 = 0;
    let mut deleted = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(con)
            .await?;
        if !keys.is_empty() {
            deleted += keys.len() as u64;
            let _: i64 = redis::cmd("UNLINK").arg(&keys).query_async(con).await?;
        }
        if next == 0 {
            return Ok(deleted);
        }
        cursor = next;
    }
}

/// A fresh key prefix for one scenario.
pub fn fresh_prefix() -> String {
    format!("bench{}", &uuid::Uuid::new_v4().simple().to_string()[..10])
}

/// Deterministic pseudo-random choice of which attempts "die": the same indices for every
/// strategy, `permille` of them.
pub fn dies(i: usize, permille: u64) -> bool {
    let mut z = (i as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    z % 1000 < permille
}

/// A shared counter (negative results seen by clients, ...).
pub type Counter = Arc<AtomicU64>;

pub fn counter() -> Counter {
    Arc::new(AtomicU64::new(0))
}

/// A connection manager (reconnecting, multiplexed: one TCP connection shared by every task).
pub async fn manager(client: &redis::Client) -> anyhow::Result<ConnectionManager> {
    Ok(client.get_connection_manager().await?)
}

/// PINGs on a connection of their own, about one a millisecond, while a step runs: how long the
/// server kept a client waiting meanwhile.
pub struct Pinger {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<(u64, std::time::Duration)>,
}

impl Pinger {
    /// Starts the loop and lets a few PINGs go first, so it is running when the step starts.
    pub async fn start(client: &redis::Client) -> anyhow::Result<Self> {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut con = client.get_multiplexed_async_connection().await?;
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let (mut count, mut worst) = (0u64, std::time::Duration::ZERO);
                while !stop.load(Ordering::Relaxed) {
                    let t = std::time::Instant::now();
                    let _: Result<String, _> = redis::cmd("PING").query_async(&mut con).await;
                    worst = worst.max(t.elapsed());
                    count += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
                (count, worst)
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        Ok(Self { stop, task })
    }

    /// Lets a few more PINGs run, stops, and answers how many were answered and the slowest,
    /// in ms.
    pub async fn stop(self) -> anyhow::Result<(u64, f64)> {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (count, worst) = self.task.await?;
        Ok((count, worst.as_secs_f64() * 1e3))
    }
}

/// Drops one of the bench's own databases (its name is a UUID this run created).
pub async fn drop_database(url: &str) -> anyhow::Result<()> {
    use sqlx::Connection;
    let (base, name) = url
        .rsplit_once('/')
        .ok_or_else(|| anyhow::anyhow!("unexpected database url"))?;
    let name = name.split('?').next().unwrap_or(name);
    anyhow::ensure!(
        name.starts_with("seckill_test_"),
        "not a bench database: {name}"
    );
    let mut con = sqlx::PgConnection::connect(&format!("{base}/postgres")).await?;
    // A database name cannot be a bind parameter: the statement is built at runtime, which
    // `sqlx::query!` (a checked literal) cannot take.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "drop database if exists {name} with (force)"
    )))
    .execute(&mut con)
    .await?;
    con.close().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_read_as_calls_and_usec_per_command_and_the_outer_script_is_left_out() {
        let before = parse_commandstats(
            "# Commandstats\r\ncmdstat_evalsha:calls=10,usec=100,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\ncmdstat_hmget:calls=10,usec=20,usec_per_call=2.00\r\n",
        );
        let after = parse_commandstats(
            "# Commandstats\r\ncmdstat_evalsha:calls=20,usec=200,usec_per_call=10.00\r\ncmdstat_hmget:calls=20,usec=45,usec_per_call=2.25\r\ncmdstat_time:calls=10,usec=5\r\ncmdstat_info:calls=2,usec=90\r\ncmdstat_client|list:calls=1,usec=3\r\n",
        );
        assert_eq!(
            after["evalsha"].us_per_call_since(before["evalsha"]),
            Some(10.0)
        );
        assert_eq!(after["client|list"], CommandTime { calls: 1, usec: 3 });
        // hmget 25 + time 5 + client|list 3; neither the script itself nor INFO.
        assert_eq!(usec_outside(&before, &after, "evalsha"), 33);
    }
}
