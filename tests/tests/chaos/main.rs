//! Seeded chaos: every actor of the system at once against the real services, faults injected
//! at random moments, then the sale's books checked at quiescence.
//!
//! One run per seed: a fresh database, key prefix and queue, one or two open sales, and for
//! `CHAOS_SECONDS` (default 6) these actors at once:
//!
//! - crowds of buyers through the entry router (in-process, as Lambda calls it), users drawn
//!   from a pool smaller than the attempts, so the same user clicks again;
//! - SQS sends that store the message and then report a timeout (`queue.send.lost_reply`);
//! - two consumers that sometimes handle a batch twice (in a row or at once), die mid-batch,
//!   or finish it without deleting, so SQS redelivers it after the 2 s visibility timeout;
//! - double-clicked cancels, pays through the Stripe provider at localstripe (the fake of
//!   Stripe's API: a buyer who confirms, gives up half way, or pays while she cancels; the
//!   provider's event late or twice), and the payment-timeout release of unpaid orders;
//! - admin raises, lowers and extensions of the window, under the fenced lock;
//! - preheat runs;
//! - on the test's private standalone Redis: SIGSTOP for 0.3-1.5 s, then SIGCONT (the shared
//!   cluster is never stopped);
//! - with reconcile on: reconcile runs with a short grace, the sale's keys are lost once, a
//!   draw sale's keys again just after its draw is done (before, during or after its sends),
//!   and now and then one buyer's field in `users` is lost while the sale stays loaded (a
//!   failover that dropped the last writes; only a field whose user has no entry in flight);
//! - in a draw sale (some one-bucket sales admit by draw, with a window of a quarter to
//!   three fifths of the phase), buyers queue in the pool, buyers after the window are told
//!   `draw_running`, and reconcile, the drawer, runs the draw's steps, records it and sends
//!   its winners;
//! - a watcher: Redis stock never negative, the database never oversold.
//!
//! Then quiescence: actors stopped, Redis resumed, the queue drained without faults (past the
//! visibility timeout), with reconcile on a few reconcile passes, and the checks, per sale:
//! conservation (`redis_stock + pending + confirmed = total`), the database's remaining stock,
//! an empty ledger, the Redis user set against the live orders, one live order per user, every
//! 202 resolved to an order or an allowed failure (a 202 `queued` also to a pool entry the
//! draw passed over, whatever keys were lost: the database keeps the entries and the draw's
//! outcome), every drawn winner's request to an order and no loser's, and no order behind any
//! other answer; and every payment against the provider (paid only by money taken, money taken
//! paid its order or is owed back, a cancelled order's payment cancelled there). Once the
//! actors stop, each draw sale's draw is finished and its winners' orders written as
//! reconcile's draw part does (with reconcile off, in place of the runs that would come).
//!
//! A failure names its seed. The choices are seeded; the interleavings are real concurrency,
//! so a replay makes the same choices, not always the same interleaving:
//! `CHAOS_SEEDS=17 cargo nextest run -p seckill-tests --test chaos`.
//! Many seeds: `make chaos SEEDS=1..200 MINUTES=20` (`CHAOS_SEEDS`, `CHAOS_MINUTES`; a
//! `CHAOS_SECONDS` in the environment sets the phase). Run it under nextest (one process per
//! test): pause points are scoped by activity id, and every fresh database starts at id 1.
//!
//! Here the four tests and the campaign over the seeds; [`world`] what a seed's actors share,
//! [`buyers`], [`consumers`], [`orders`], [`jobs`], [`faults`] and [`watcher`] the actors,
//! [`quiescence`] and [`checks`] the end of a seed, [`report`] its counts.

mod buyers;
mod checks;
mod consumers;
mod faults;
mod jobs;
mod orders;
mod quiescence;
mod report;
mod watcher;
mod world;

use crate::world::Chaos;
use anyhow::Context as _;
use sqlx::{Connection, PgConnection};
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::RedisKind;

/// The `failure_reason`s a request answered 202 may end with (a `failed` row). Anything else,
/// or no row at all, means an accepted purchase was lost.
const ALLOWED_FAILURE_REASONS: &[&str] = &[
    "sold_out",
    "already_purchased",
    "reservation_expired",
    "send_failed",
    "unavailable",
];

/// Seeds of the short version (reconcile on runs the first one only).
const DEFAULT_SEEDS: &[u64] = &[1, 2, 3];
const DEFAULT_PHASE_SECS: f64 = 6.0;

const PER_ORDER_LIMIT: i64 = 3;
/// The entry's Redis timeout (production's default): a pause longer than this is a 503.
const ENTRY_REDIS_TIMEOUT_STANDALONE: Duration = Duration::from_millis(300);
/// The cluster is never paused; its timeouts come only from a busy machine.
const ENTRY_REDIS_TIMEOUT_CLUSTER: Duration = Duration::from_secs(1);
/// Every other actor waits out a pause (at most 1.5 s), so it mostly succeeds.
const PATIENT_REDIS_TIMEOUT: Duration = Duration::from_secs(5);
const SOLD_OUT_CACHE_TTL: Duration = Duration::from_millis(200);
const VISIBILITY_TIMEOUT_SECS: u32 = 2;
/// High enough that no message reaches the DLQ because of the injected faults.
const MAX_RECEIVE_COUNT: u32 = 50;

const BUYERS: u64 = 6;
const CONSUMERS: u64 = 2;
/// One purchase must be answered within this (the entry bounds its own waits far below it).
const REQUEST_LIMIT: Duration = Duration::from_secs(30);
/// How long the actors may take to stop once told.
const ACTOR_STOP_LIMIT: Duration = Duration::from_secs(30);
/// How long draining the queue may take at quiescence.
const DRAIN_LIMIT: Duration = Duration::from_secs(60);
/// How long a reservation behind a 503 may take to be given back once all is quiet.
const GIVE_BACK_WAIT: Duration = Duration::from_secs(5);
/// A whole seed's limit beyond its actor phase.
const SEED_LIMIT_BEYOND_PHASE: Duration = Duration::from_secs(180);

/// Bound on each step of the clean-up after a passing run (well within the run's own limit).
const CLEAN_UP_STEP_LIMIT: Duration = Duration::from_secs(30);

/// Whether `fut` finished within [`CLEAN_UP_STEP_LIMIT`].
async fn finishes(fut: impl std::future::Future<Output = ()>) -> bool {
    tokio::time::timeout(CLEAN_UP_STEP_LIMIT, fut).await.is_ok()
}
/// Reconcile passes at quiescence (reconcile on).
const FINAL_RECONCILES: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_on_standalone_redis_with_reconcile_off() -> anyhow::Result<()> {
    campaign(Variant {
        kind: RedisKind::Standalone,
        reconcile: false,
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_on_redis_cluster_with_reconcile_off() -> anyhow::Result<()> {
    campaign(Variant {
        kind: RedisKind::Cluster,
        reconcile: false,
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_on_standalone_redis_with_reconcile_on() -> anyhow::Result<()> {
    campaign(Variant {
        kind: RedisKind::Standalone,
        reconcile: true,
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_on_redis_cluster_with_reconcile_on() -> anyhow::Result<()> {
    campaign(Variant {
        kind: RedisKind::Cluster,
        reconcile: true,
    })
    .await
}

#[derive(Clone, Copy, Debug)]
struct Variant {
    kind: RedisKind,
    reconcile: bool,
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redis = match self.kind {
            RedisKind::Standalone => "standalone",
            RedisKind::Cluster => "cluster",
            RedisKind::Valkey => "valkey",
        };
        let reconcile = if self.reconcile { "on" } else { "off" };
        write!(f, "{redis} redis, reconcile {reconcile}")
    }
}
/// `CHAOS_SEEDS`: `1,5,9`, `1..200` (200 excluded), `1..=200`, or a mix.
fn parse_seeds(spec: &str) -> anyhow::Result<Vec<u64>> {
    let mut seeds = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once("..") {
            Some((from, to)) => {
                let from: u64 = from.trim().parse().context("range start")?;
                match to.strip_prefix('=') {
                    Some(to) => seeds.extend(from..=to.trim().parse::<u64>()?),
                    None => seeds.extend(from..to.trim().parse::<u64>()?),
                }
            }
            None => seeds.push(part.parse().with_context(|| format!("seed {part:?}"))?),
        }
    }
    anyhow::ensure!(!seeds.is_empty(), "CHAOS_SEEDS={spec:?} names no seed");
    Ok(seeds)
}

fn seeds(v: Variant) -> anyhow::Result<Vec<u64>> {
    match std::env::var("CHAOS_SEEDS") {
        Ok(spec) if !spec.trim().is_empty() => parse_seeds(&spec),
        _ if v.reconcile => Ok(DEFAULT_SEEDS[..1].to_vec()),
        _ => Ok(DEFAULT_SEEDS.to_vec()),
    }
}

/// `CHAOS_SECONDS`: each seed's actor phase.
fn phase_length() -> anyhow::Result<Duration> {
    let secs = match std::env::var("CHAOS_SECONDS") {
        Ok(s) if !s.trim().is_empty() => s.trim().parse::<f64>().context("CHAOS_SECONDS")?,
        _ => DEFAULT_PHASE_SECS,
    };
    anyhow::ensure!(secs > 0.0, "CHAOS_SECONDS must be positive");
    Ok(Duration::from_secs_f64(secs))
}

/// No new seed starts after this: `CHAOS_MINUTES` from this test's start (what `make chaos`
/// sets from MINUTES; its four tests start together).
fn campaign_deadline() -> anyhow::Result<Option<Instant>> {
    match std::env::var("CHAOS_MINUTES") {
        Ok(s) if !s.trim().is_empty() => {
            let minutes: f64 = s.trim().parse().context("CHAOS_MINUTES")?;
            anyhow::ensure!(minutes >= 0.0, "CHAOS_MINUTES must not be negative");
            Ok(Some(
                Instant::now() + Duration::from_secs_f64(minutes * 60.0),
            ))
        }
        _ => Ok(None),
    }
}

/// Runs the seeds one after another (at least one, whatever the deadline), then fails with
/// every failing seed's findings.
async fn campaign(v: Variant) -> anyhow::Result<()> {
    let seeds = seeds(v)?;
    let phase = phase_length()?;
    let deadline = campaign_deadline()?;
    let started = Instant::now();
    println!(
        "chaos [{v}]: {} seed(s) from {} to {}, {phase:?} of actors each",
        seeds.len(),
        seeds[0],
        seeds[seeds.len() - 1]
    );
    let (mut passed, mut ran) = (0usize, 0usize);
    let mut failures = Vec::new();
    for &seed in &seeds {
        if ran > 0 && deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        ran += 1;
        let limit = phase + SEED_LIMIT_BEYOND_PHASE;
        let findings = match tokio::time::timeout(limit, run_seed(v, seed, phase)).await {
            Ok(Ok(findings)) => findings,
            Ok(Err(e)) => vec![format!("seed={seed} [{v}] harness error: {e:#}")],
            Err(_) => vec![format!(
                "seed={seed} [{v}] harness: the seed did not finish within {limit:?}; \
                 database sessions not idle: {}",
                busy_sessions().await
            )],
        };
        if findings.is_empty() {
            passed += 1;
        } else {
            for f in &findings {
                println!("FAIL {f}");
            }
            failures.push((seed, findings));
        }
    }
    println!(
        "chaos: {passed} seeds passed in {:.0} s ([{v}]; {} failed; {} not started before the \
         deadline)",
        started.elapsed().as_secs_f64(),
        failures.len(),
        seeds.len() - ran
    );
    if failures.is_empty() {
        return Ok(());
    }
    let failing: Vec<String> = failures.iter().map(|(s, _)| s.to_string()).collect();
    let mut summary = format!(
        "{} of {ran} seed(s) failed [{v}]; replay with CHAOS_SEEDS={}\n",
        failures.len(),
        failing.join(",")
    );
    for (_, findings) in &failures {
        for f in findings {
            summary.push_str(f);
            summary.push('\n');
        }
    }
    anyhow::bail!(summary)
}

/// Bound on one call of the harness to the SQS emulator.
const SQS_CALL_LIMIT: Duration = Duration::from_secs(20);

/// What the test databases' sessions are doing (for a seed that hangs: a lock wait, a
/// transaction left open), from `pg_stat_activity`.
async fn busy_sessions() -> String {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/seckill".into());
    let rows: Result<Vec<(String, String, String, String)>, _> = async {
        let mut conn = PgConnection::connect(&url).await?;
        sqlx::query_as(
            "select datname::text, coalesce(state, ''),
                    coalesce(wait_event_type || '/' || wait_event, ''), left(query, 100)
             from pg_stat_activity
             where datname like 'seckill_test_%' and state <> 'idle'",
        )
        .fetch_all(&mut conn)
        .await
    }
    .await;
    match rows {
        Ok(rows) => format!("{rows:?}"),
        Err(e) => format!("unreadable: {e}"),
    }
}

/// One seed, start to finish. Returns its findings (empty: it passed).
async fn run_seed(v: Variant, seed: u64, phase: Duration) -> anyhow::Result<Vec<String>> {
    let chaos = Arc::new(Chaos::new(v, seed, phase).await?);
    chaos.announce(phase);
    let actors = chaos.spawn_actors(phase);
    tokio::time::sleep(phase).await;
    chaos.stop.store(true, Ordering::SeqCst);
    chaos.join(actors).await;

    chaos.resume_redis();
    chaos.finish_draws().await;
    chaos.drain_queue().await?;
    if v.reconcile {
        chaos.final_reconcile().await?;
    }
    chaos.wait_for_give_backs().await?;
    for &id in &chaos.activities {
        chaos.check_activity(id).await?;
    }
    chaos.check_payments().await?;
    chaos.print_report();
    let mut findings = chaos.findings();
    let stuck = chaos.clean_up(findings.is_empty()).await;
    findings.extend(stuck);
    Ok(findings)
}

#[test]
fn seeds_parse_as_lists_and_ranges() {
    assert_eq!(parse_seeds("1,5, 9").unwrap(), vec![1, 5, 9]);
    assert_eq!(parse_seeds("3..6").unwrap(), vec![3, 4, 5]);
    assert_eq!(parse_seeds("3..=5,10").unwrap(), vec![3, 4, 5, 10]);
    assert!(parse_seeds("x").is_err());
    assert!(parse_seeds(" , ").is_err());
}
