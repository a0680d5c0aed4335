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
//! - double-clicked cancels, pays, and the payment-timeout release of unpaid orders;
//! - admin raises, lowers and extensions of the window, under the fenced lock;
//! - preheat runs;
//! - on the test's private standalone Redis: SIGSTOP for 0.3-1.5 s, then SIGCONT (the shared
//!   cluster is never stopped);
//! - with reconcile on: reconcile runs with a short grace, the sale's keys are lost once, a
//!   draw sale's keys again just after its draw is done (before, during or after its sends),
//!   and now and then one buyer's field in `users` is lost while the sale stays loaded (a
//!   failover that dropped the last writes; only a field whose user has no entry in flight);
//! - in a draw sale (some one-bucket sales admit by draw, with a window of a quarter to
//!   three fifths of the phase), buyers queue in the pool, and whoever comes after the window
//!   (a buyer, reconcile) runs the draw and sends its winners;
//! - a watcher: Redis stock never negative, the database never oversold.
//!
//! Then quiescence: actors stopped, Redis resumed, the queue drained without faults (past the
//! visibility timeout), with reconcile on a few reconcile passes, and the checks, per sale:
//! conservation (`redis_stock + pending + confirmed = total`), the database's remaining stock,
//! an empty ledger, the Redis user set against the live orders, one live order per user, every
//! 202 resolved to an order or an allowed failure (a 202 `queued` also to a pool entry the
//! draw passed over, whatever keys were lost: the database keeps the entries and the draw's
//! outcome), every drawn winner's request to an order and no loser's, and no order behind any
//! other answer. A draw sale's queued users ask for
//! their status once the actors stop, as they would: that runs a draw not run yet and sends
//! what its outbox holds.
//!
//! A failure names its seed. The choices are seeded; the interleavings are real concurrency,
//! so a replay makes the same choices, not always the same interleaving:
//! `CHAOS_SEEDS=17 cargo nextest run -p seckill-tests --test chaos`.
//! Many seeds: `make chaos SEEDS=1..200 MINUTES=20` (`CHAOS_SEEDS`, `CHAOS_MINUTES`; a
//! `CHAOS_SECONDS` in the environment sets the phase). Run it under nextest (one process per
//! test): pause points are scoped by activity id, and every fresh database starts at id 1.

use anyhow::Context as _;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use aws_sdk_sqs::types::{Message, QueueAttributeName};
use chrono::{Duration as ChronoDuration, Utc};
use order_consumer::Consumer;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{RngExt, SeedableRng};
use reconcile::ReconcileReport;
use seckill_shared::domain::activity;
use seckill_shared::domain::payment::Outcome;
use seckill_shared::domain::settings::ActivityPatch;
use seckill_shared::protocol;
use seckill_shared::protocol::cancel;
use seckill_shared::protocol::pay::Settled;
use seckill_shared::store;
use seckill_shared::store::buckets;
use seckill_shared::store::ledger;
use seckill_shared::store::view;

use seckill_shared::domain::order;
use seckill_shared::domain::order::Order;
use seckill_shared::infra::pause;
use seckill_shared::infra::sqs::OrderQueue;
use seckill_shared::protocol::cancel::CancelOutcome;
use seckill_shared::store::conn::Redis;
use seckill_shared::store::draw::Drawn;
use seckill_shared::store::keys::Bucket;
use seckill_shared::store::keys::SENTINEL;
use sqlx::{Connection, PgConnection};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use testkit::call;
use testkit::invariants::{self, some, Books, Violation};
use testkit::request;
use testkit::PrivateRedis;
use testkit::RedisKind;
use testkit::TestEnv;
use tokio::task::JoinHandle;
use uuid::Uuid;

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

// ---------------------------------------------------------------------------------------------
// The four tests

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
        };
        let reconcile = if self.reconcile { "on" } else { "off" };
        write!(f, "{redis} redis, reconcile {reconcile}")
    }
}

// ---------------------------------------------------------------------------------------------
// Seeds, configuration, the campaign

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
    for &id in &chaos.sales {
        chaos.check_sale(id).await?;
    }
    chaos.print_report();
    let mut findings = chaos.findings();
    let stuck = chaos.clean_up(findings.is_empty()).await;
    findings.extend(stuck);
    Ok(findings)
}

// ---------------------------------------------------------------------------------------------
// Shared state

/// What one seed's actors share.
struct Chaos {
    seed: u64,
    variant: Variant,
    env: TestEnv,
    /// The services as every actor but the entry sees them: its Redis handle waits out a
    /// pause, and with reconcile on its grace is short.
    patient: TestEnv,
    private: Option<PrivateRedis>,
    router: axum::Router,
    sales: Vec<i64>,
    /// Each sale's bucket count (1: one bucket).
    buckets: HashMap<i64, u32>,
    /// The draw sales and their draw window.
    draws: HashMap<i64, Duration>,
    stocks: Vec<i64>,
    users: Vec<String>,
    attempts_budget: u64,
    stop: AtomicBool,
    attempts: Mutex<Vec<Attempt>>,
    report: Mutex<Report>,
    findings: Mutex<Vec<Finding>>,
}

/// One purchase click and its answer.
#[derive(Clone, Debug)]
struct Attempt {
    activity_id: i64,
    user: String,
    quantity: i64,
    /// 0: no answer within [`REQUEST_LIMIT`].
    status: u16,
    /// A 202 `queued`: in a draw sale's pool.
    queued: bool,
    request_id: Option<Uuid>,
    code: Option<String>,
}

/// The running actors. Dropped before they were joined (a seed that failed or ran out of
/// time), they are aborted, so none of them outlives its seed and meddles with the next one
/// (whose sale has the same id in its own fresh database).
struct Actors(Vec<(&'static str, JoinHandle<anyhow::Result<()>>)>);

impl Drop for Actors {
    fn drop(&mut self) {
        for (_, handle) in &self.0 {
            handle.abort();
        }
    }
}

/// A broken check, with how often it was seen (the watcher sees a lasting one many times).
struct Finding {
    check: &'static str,
    activity_id: Option<i64>,
    detail: String,
    times: u64,
}

/// How a consumer treats one received batch.
#[derive(Clone, Copy, Debug)]
enum Delivery {
    Once,
    TwiceInARow,
    TwiceAtOnce,
    /// The consumer is killed a few milliseconds in; nothing is deleted.
    DiesMidBatch,
    /// Handled, but the consumer dies before deleting: a redelivery is a duplicate.
    NotDeleted,
}

/// Counts of one seed, printed at its end.
#[derive(Default, Debug)]
struct Report {
    attempts: u64,
    accepted: u64,
    unavailable: u64,
    refused: BTreeMap<String, u64>,
    other_status: BTreeMap<u16, u64>,
    lost_replies_armed: u64,
    lost_replies: u64,
    batches: BTreeMap<&'static str, u64>,
    acked: u64,
    reported_failed: u64,
    sqs_errors: u64,
    drain_batches: u64,
    drain_secs: f64,
    dlq: u64,
    cancel_clicks: u64,
    cancels: BTreeMap<&'static str, u64>,
    pays: u64,
    pays_refused: u64,
    release_runs: u64,
    released: u64,
    release_deferred: u64,
    release_errors: u64,
    admin: BTreeMap<String, u64>,
    preheats: u64,
    preheat_loaded: u64,
    preheat_errors: u64,
    pauses: u64,
    paused_ms: u64,
    reconciles: u64,
    reconcile_repairs: u64,
    reconcile_errors: u64,
    keys_lost: u64,
    draw_keys_lost: u64,
    fields_lost: u64,
    draw_entrants: u64,
    draw_winners: u64,
    watcher_samples: u64,
    watcher_errors: u64,
    rows: BTreeMap<String, u64>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "  buyers: {} attempts, {} accepted, {} unavailable, refused {:?}, other {:?}",
            self.attempts, self.accepted, self.unavailable, self.refused, self.other_status
        )?;
        writeln!(
            f,
            "  queue: lost replies {}/{} armed, batches {:?}, {} acked, {} reported failed, \
             {} sqs errors, drain {} batches in {:.1} s, dlq {}",
            self.lost_replies,
            self.lost_replies_armed,
            self.batches,
            self.acked,
            self.reported_failed,
            self.sqs_errors,
            self.drain_batches,
            self.drain_secs,
            self.dlq
        )?;
        writeln!(
            f,
            "  orders: {} cancel clicks {:?}, {} pays ({} refused), release {} runs: {} released, \
             {} deferred, {} errors; rows {:?}",
            self.cancel_clicks,
            self.cancels,
            self.pays,
            self.pays_refused,
            self.release_runs,
            self.released,
            self.release_deferred,
            self.release_errors,
            self.rows
        )?;
        writeln!(f, "  admin: {:?}", self.admin)?;
        write!(
            f,
            "  jobs: {} preheats ({} loaded, {} errors), {} reconciles ({} repairs, {} errors), \
             {} key losses ({} after a draw), {} fields lost, {} pauses ({} ms), watcher {} \
             samples ({} errors), draws {} entrants {} winners",
            self.preheats,
            self.preheat_loaded,
            self.preheat_errors,
            self.reconciles,
            self.reconcile_repairs,
            self.reconcile_errors,
            self.keys_lost,
            self.draw_keys_lost,
            self.fields_lost,
            self.pauses,
            self.paused_ms,
            self.watcher_samples,
            self.watcher_errors,
            self.draw_entrants,
            self.draw_winners
        )
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Chaos {
    async fn new(variant: Variant, seed: u64, phase: Duration) -> anyhow::Result<Self> {
        let mut rng = seeded(seed, 0);
        let (private, env) = test_env(variant.kind).await?;
        let mut config = env.config.clone();
        config.redis_timeout = PATIENT_REDIS_TIMEOUT;
        if variant.reconcile {
            config.reconcile_grace = Duration::from_millis(rng.random_range(1000..=2000));
        }
        let patient = TestEnv {
            redis: Redis::connect(&config).await?,
            config,
            ..env.clone()
        };

        let mut stocks = vec![rng.random_range(20..=60)];
        if rng.random_bool(0.5) {
            stocks.push(rng.random_range(10..=40));
        }
        // Half the sales keep their stock in 2-4 buckets (their own stream: the rest of the
        // seed's scenario is drawn as before).
        let mut layout = seeded(seed, 11);
        // Some one-bucket sales admit by draw (their own stream too).
        let mut admission = seeded(seed, 12);
        let mut sales = Vec::new();
        let mut buckets = HashMap::new();
        let mut draws = HashMap::new();
        for &stock in &stocks {
            let count = if layout.random_bool(0.5) {
                layout.random_range(2..=4)
            } else {
                1
            };
            let window = (count == 1 && admission.random_bool(0.6))
                .then(|| phase.mul_f64(admission.random_range(0.25..0.6)));
            let id = match window {
                Some(window) => draw_sale(&env, stock, window).await?,
                None => {
                    env.open_sale_in_buckets(stock, PER_ORDER_LIMIT, count)
                        .await?
                        .id
                }
            };
            sales.push(id);
            buckets.insert(id, count);
            if let Some(window) = window {
                draws.insert(id, window);
            }
        }
        let users = (0..rng.random_range(15..=45))
            .map(|i| format!("user-{i}"))
            .collect();
        // 40-100 clicks a second, whatever the phase's length.
        let per_second = rng.random_range(40..=100u64) as f64;
        let clicks = (per_second * phase.as_secs_f64()) as u64;
        let attempts_budget = clicks.div_ceil(BUYERS) * BUYERS;
        let router = env.entry_router();
        Ok(Self {
            seed,
            variant,
            env,
            patient,
            private,
            router,
            sales,
            buckets,
            draws,
            stocks,
            users,
            attempts_budget,
            stop: AtomicBool::new(false),
            attempts: Mutex::new(Vec::new()),
            report: Mutex::new(Report::default()),
            findings: Mutex::new(Vec::new()),
        })
    }

    fn announce(&self, phase: Duration) {
        let grace = if self.variant.reconcile {
            format!(
                ", reconcile grace {:?}",
                self.patient.config.reconcile_grace
            )
        } else {
            String::new()
        };
        let draws: Vec<String> = self
            .sales
            .iter()
            .filter_map(|id| {
                self.draws
                    .get(id)
                    .map(|w| format!("sale {id} draws after {w:?}"))
            })
            .collect();
        println!(
            "seed={} [{}]: sales {:?} with stock {:?} in {:?} bucket(s) (limit {PER_ORDER_LIMIT}), \
             {:?}, {} users, {} attempts, {phase:?} of actors{grace}",
            self.seed,
            self.variant,
            self.sales,
            self.stocks,
            self.sales.iter().map(|id| self.buckets[id]).collect::<Vec<_>>(),
            draws,
            self.users.len(),
            self.attempts_budget
        );
    }

    /// Every bucket of a sale.
    fn buckets_of(&self, id: i64) -> impl Iterator<Item = Bucket> {
        Bucket::all(id, self.buckets.get(&id).copied().unwrap_or(1))
    }

    /// Every bucket's snapshot of a sale, bucket 0 first.
    async fn snapshots(&self, id: i64) -> anyhow::Result<Vec<(Bucket, ledger::Snapshot)>> {
        let count = self.buckets.get(&id).copied().unwrap_or(1);
        Ok(buckets::snapshots(&self.patient.redis, id, count).await?)
    }

    /// The RNG of one actor (`stream`), derived from the seed only.
    fn rng(&self, stream: u64) -> StdRng {
        seeded(self.seed, stream)
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Sleeps `ms`, waking early when the actors are told to stop. False once stopped.
    async fn nap(&self, ms: u64) -> bool {
        let until = Instant::now() + Duration::from_millis(ms);
        while !self.stopped() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return true;
            }
            tokio::time::sleep(left.min(Duration::from_millis(50))).await;
        }
        false
    }

    /// The first sale gets most of the traffic.
    fn pick_sale(&self, rng: &mut StdRng) -> i64 {
        match self.sales.get(1) {
            Some(&second) if rng.random_bool(0.3) => second,
            _ => self.sales[0],
        }
    }

    fn count(&self, f: impl FnOnce(&mut Report)) {
        f(&mut lock(&self.report));
    }

    /// Records a broken check. The seed and variant are added when it is printed.
    fn violate(&self, check: &'static str, activity_id: Option<i64>, detail: String) {
        let mut findings = lock(&self.findings);
        match findings
            .iter_mut()
            .find(|f| f.check == check && f.activity_id == activity_id)
        {
            Some(f) => f.times += 1,
            None => findings.push(Finding {
                check,
                activity_id,
                detail,
                times: 1,
            }),
        }
    }

    /// Records a broken promise of the kit's invariant checker, under its name.
    fn broke(&self, id: i64, v: Violation) {
        self.violate(v.invariant.name(), Some(id), v.detail);
    }

    fn findings(&self) -> Vec<String> {
        lock(&self.findings)
            .iter()
            .map(|f| {
                let sale = f
                    .activity_id
                    .map(|id| format!(" sale {id}"))
                    .unwrap_or_default();
                let times = if f.times > 1 {
                    format!(" (seen {} times)", f.times)
                } else {
                    String::new()
                };
                format!(
                    "seed={} [{}] check {}{sale}: {}{times}",
                    self.seed, self.variant, f.check, f.detail
                )
            })
            .collect()
    }

    fn consumer(&self) -> Consumer {
        self.patient.consumer()
    }

    fn spawn_actors(self: &Arc<Self>, phase: Duration) -> Actors {
        let mut actors = Vec::new();
        let per_buyer = self.attempts_budget / BUYERS;
        // Paced so a buyer's clicks spread over the whole phase.
        let gap = phase / per_buyer.max(1) as u32;
        for i in 0..BUYERS {
            let actor = buyer(self.clone(), i, per_buyer, gap);
            actors.push(("buyer", tokio::spawn(actor)));
        }
        for i in 0..CONSUMERS {
            actors.push(("consumer", tokio::spawn(consumer(self.clone(), i))));
        }
        actors.push(("lost replies", tokio::spawn(lost_replies(self.clone()))));
        actors.push(("order clicks", tokio::spawn(order_clicks(self.clone()))));
        actors.push(("admin", tokio::spawn(admin_changes(self.clone()))));
        actors.push(("preheat", tokio::spawn(preheats(self.clone()))));
        actors.push(("watcher", tokio::spawn(watcher(self.clone()))));
        if self.private.is_some() {
            actors.push(("redis pauses", tokio::spawn(redis_pauses(self.clone()))));
        }
        if self.variant.reconcile {
            actors.push(("reconcile", tokio::spawn(reconciles(self.clone()))));
            actors.push(("key loss", tokio::spawn(key_loss(self.clone(), phase))));
            actors.push(("lost fields", tokio::spawn(lost_fields(self.clone()))));
            actors.push(("draw key loss", tokio::spawn(draw_key_loss(self.clone()))));
        }
        Actors(actors)
    }

    /// Waits for every actor, within one shared limit; a straggler is aborted and reported.
    async fn join(&self, mut actors: Actors) {
        let until = tokio::time::Instant::now() + ACTOR_STOP_LIMIT;
        for (name, mut handle) in std::mem::take(&mut actors.0) {
            match tokio::time::timeout_at(until, &mut handle).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => {
                    self.violate("harness", None, format!("actor {name} failed: {e:#}"))
                }
                Ok(Err(e)) => self.violate("harness", None, format!("actor {name} panicked: {e}")),
                Err(_) => {
                    handle.abort();
                    let _ = handle.await;
                    self.violate(
                        "actors_stop",
                        None,
                        format!("actor {name} still ran {ACTOR_STOP_LIMIT:?} after the stop"),
                    );
                }
            }
        }
    }

    fn resume_redis(&self) {
        if let Some(p) = &self.private {
            p.signal("-CONT");
        }
    }
}

/// The seed's services, as the entry sees them: its own standalone Redis (which the test may
/// pause) or the shared cluster, and a queue with a short visibility timeout, so a dead
/// consumer's batch comes back soon.
async fn test_env(kind: RedisKind) -> anyhow::Result<(Option<PrivateRedis>, TestEnv)> {
    let (private, mut env) = match kind {
        RedisKind::Standalone => {
            let private = PrivateRedis::start().await;
            let env = private
                .env(ENTRY_REDIS_TIMEOUT_STANDALONE, SOLD_OUT_CACHE_TTL)
                .await;
            (Some(private), env)
        }
        RedisKind::Cluster => {
            let mut env = TestEnv::new(RedisKind::Cluster).await?;
            env.config.redis_timeout = ENTRY_REDIS_TIMEOUT_CLUSTER;
            env.config.sold_out_cache_ttl = SOLD_OUT_CACHE_TTL;
            env.redis = Redis::connect(&env.config).await?;
            (None, env)
        }
    };
    let unused = env.queue.url.clone();
    let url = testkit::fresh_queue(&env.sqs, VISIBILITY_TIMEOUT_SECS, MAX_RECEIVE_COUNT).await?;
    delete_queue(&env.sqs, &unused).await;
    env.config.order_queue_url = url.clone();
    env.queue = OrderQueue::new(env.sqs.clone(), url, env.config.sqs_timeout);
    Ok((private, env))
}

/// A draw sale opening now, its pool open for `window`, loaded into Redis.
async fn draw_sale(env: &TestEnv, stock: i64, window: Duration) -> anyhow::Result<i64> {
    let now = Utc::now();
    let a = env
        .load_new(
            &testkit::sale()
                .title("chaos draw")
                .stock(stock)
                .limit(PER_ORDER_LIMIT)
                .window(now, now + ChronoDuration::hours(1))
                .draw(window.as_millis().max(1) as i64)
                .build(),
        )
        .await?;
    Ok(a.id)
}

fn seeded(seed: u64, stream: u64) -> StdRng {
    StdRng::seed_from_u64(
        seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(stream),
    )
}

// ---------------------------------------------------------------------------------------------
// Actors

/// A crowd member: `budget` clicks at most, about `gap` apart, a third of them in bursts;
/// random user, sale and quantity.
async fn buyer(c: Arc<Chaos>, index: u64, budget: u64, gap: Duration) -> anyhow::Result<()> {
    let mut rng = c.rng(100 + index);
    let gap_ms = (gap.as_millis() as u64).max(1);
    for _ in 0..budget {
        // A third of the clicks come right after the previous one; the rest wait 0-3 gaps,
        // which (with the time a click takes) spreads the budget over the phase.
        if !rng.random_bool(0.35) && !c.nap(rng.random_range(0..=3 * gap_ms)).await {
            break;
        }
        if c.stopped() {
            break;
        }
        let activity_id = c.pick_sale(&mut rng);
        let user = c.users.choose(&mut rng).context("users")?.clone();
        let quantity = rng.random_range(1..=PER_ORDER_LIMIT);
        let attempt = c.purchase(activity_id, user, quantity).await;
        c.record(attempt);
    }
    Ok(())
}

impl Chaos {
    async fn purchase(&self, activity_id: i64, user: String, quantity: i64) -> Attempt {
        let path = format!("/activities/{activity_id}/orders");
        let body = format!(r#"{{"quantity":{quantity}}}"#);
        let req = request("POST", &path, Some((&user, "")), Some(&body));
        let (status, json) =
            match tokio::time::timeout(REQUEST_LIMIT, call(&self.router, req)).await {
                Ok((status, json)) => (status.as_u16(), json),
                Err(_) => {
                    self.violate(
                        "request_answered",
                        Some(activity_id),
                        format!("POST {path} by {user} had no answer within {REQUEST_LIMIT:?}"),
                    );
                    (0, serde_json::Value::Null)
                }
            };
        Attempt {
            activity_id,
            user,
            quantity,
            status,
            queued: status == 202 && json.get("status").and_then(|v| v.as_str()) == Some("queued"),
            request_id: json
                .get("requestId")
                .and_then(|v| v.as_str())
                .and_then(|s| s.parse().ok()),
            code: json
                .get("error")
                .and_then(|v| v.as_str())
                .map(str::to_string),
        }
    }

    fn record(&self, a: Attempt) {
        self.count(|r| {
            r.attempts += 1;
            match a.status {
                202 => r.accepted += 1,
                503 => r.unavailable += 1,
                400..=499 => {
                    let code = a.code.clone().unwrap_or_else(|| a.status.to_string());
                    *r.refused.entry(code).or_default() += 1;
                }
                other => *r.other_status.entry(other).or_default() += 1,
            }
        });
        lock(&self.attempts).push(a);
    }
}

/// Arms `queue.send.lost_reply` at random moments: the next 1-3 sends of a sale store their
/// message and then report a timeout.
async fn lost_replies(c: Arc<Chaos>) -> anyhow::Result<()> {
    let mut rng = c.rng(300);
    while c.nap(rng.random_range(200..1200)).await {
        let id = c.pick_sale(&mut rng);
        let n: u32 = rng.random_range(1..=3);
        let armed = pause::arm_failure("queue.send.lost_reply", id, n);
        // Held until it fired n times, or for at most 1.5 s.
        let hold = Instant::now() + Duration::from_millis(rng.random_range(300..1500));
        while armed.hits() < n && Instant::now() < hold && !c.stopped() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let hits = armed.hits();
        drop(armed);
        c.count(|r| {
            r.lost_replies_armed += u64::from(n);
            r.lost_replies += u64::from(hits);
        });
    }
    Ok(())
}

/// What the event source mapping does, with faults: receive, handle, delete the acked.
async fn consumer(c: Arc<Chaos>, index: u64) -> anyhow::Result<()> {
    let consumer = c.consumer();
    let mut rng = c.rng(200 + index);
    while !c.stopped() {
        let messages = match c.receive().await {
            Ok(m) => m,
            Err(_) => {
                c.count(|r| r.sqs_errors += 1);
                c.nap(200).await;
                continue;
            }
        };
        if messages.is_empty() {
            continue;
        }
        let delivery = match rng.random_range(0..100) {
            0..60 => Delivery::Once,
            60..70 => Delivery::TwiceInARow,
            70..80 => Delivery::TwiceAtOnce,
            80..90 => Delivery::DiesMidBatch,
            _ => Delivery::NotDeleted,
        };
        let dies_after = Duration::from_millis(rng.random_range(0..40));
        c.deliver(&consumer, &messages, delivery, dies_after).await;
    }
    Ok(())
}

impl Chaos {
    async fn receive(&self) -> anyhow::Result<Vec<Message>> {
        let receive = self
            .env
            .sqs
            .receive_message()
            .queue_url(&self.env.queue.url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send();
        // The emulator can stall under load; a stalled call must not hold the seed forever.
        let resp = tokio::time::timeout(SQS_CALL_LIMIT, receive)
            .await
            .context("receive from the order queue timed out")?
            .context("receive from the order queue")?;
        Ok(resp.messages.unwrap_or_default())
    }

    async fn deliver(
        &self,
        consumer: &Consumer,
        messages: &[Message],
        delivery: Delivery,
        dies_after: Duration,
    ) {
        let event = event_of(messages);
        let label = match delivery {
            Delivery::Once => "once",
            Delivery::TwiceInARow => "twice in a row",
            Delivery::TwiceAtOnce => "twice at once",
            Delivery::DiesMidBatch => "died mid-batch",
            Delivery::NotDeleted => "not deleted",
        };
        self.count(|r| *r.batches.entry(label).or_default() += 1);
        let responses = match delivery {
            Delivery::Once => vec![consumer.handle_batch(event).await],
            Delivery::TwiceInARow => {
                let first = consumer.handle_batch(event.clone()).await;
                vec![first, consumer.handle_batch(event).await]
            }
            Delivery::TwiceAtOnce => {
                let (a, b) = tokio::join!(
                    consumer.handle_batch(event.clone()),
                    consumer.handle_batch(event)
                );
                vec![a, b]
            }
            Delivery::DiesMidBatch => {
                let _ = tokio::time::timeout(dies_after, consumer.handle_batch(event)).await;
                return;
            }
            Delivery::NotDeleted => {
                consumer.handle_batch(event).await;
                return;
            }
        };
        self.delete_acked(messages, &responses).await;
    }

    /// Deletes every message some delivery acked (not in its `batchItemFailures`).
    async fn delete_acked(&self, messages: &[Message], responses: &[SqsBatchResponse]) {
        for m in messages {
            let id = m.message_id().unwrap_or_default();
            let acked = responses.iter().any(|r| {
                !r.batch_item_failures
                    .iter()
                    .any(|f| f.item_identifier == id)
            });
            if !acked {
                self.count(|r| r.reported_failed += 1);
                continue;
            }
            let delete = self
                .env
                .sqs
                .delete_message()
                .queue_url(&self.env.queue.url)
                .receipt_handle(m.receipt_handle().unwrap_or_default())
                .send();
            let deleted = tokio::time::timeout(SQS_CALL_LIMIT, delete).await;
            // A failed delete is one more redelivery, which the consumer must absorb.
            self.count(|r| match deleted {
                Ok(Ok(_)) => r.acked += 1,
                _ => r.sqs_errors += 1,
            });
        }
    }
}

/// An SQS event as Lambda hands it to the consumer.
fn event_of(messages: &[Message]) -> SqsEvent {
    let mut event = SqsEvent::default();
    event.records = messages
        .iter()
        .map(|m| {
            let mut r = SqsMessage::default();
            r.message_id = m.message_id().map(str::to_string);
            r.receipt_handle = m.receipt_handle().map(str::to_string);
            r.body = m.body().map(str::to_string);
            r.event_source = Some("aws:sqs".into());
            r
        })
        .collect();
    event
}

/// Owners clicking on their confirmed orders: cancel twice at once (a double click), cancel
/// once, pay; and now and then the payment-timeout release with a timeout of a few seconds.
async fn order_clicks(c: Arc<Chaos>) -> anyhow::Result<()> {
    let mut rng = c.rng(400);
    while c.nap(rng.random_range(50..250)).await {
        let roll = rng.random_range(0..100);
        if roll >= 80 {
            c.release_unpaid(&mut rng).await;
            continue;
        }
        let id = c.pick_sale(&mut rng);
        let confirmed: Vec<i64> = sqlx::query_scalar(
            "select id from orders where activity_id = $1 and status = 'confirmed' order by id",
        )
        .bind(id)
        .fetch_all(&c.env.pool)
        .await?;
        let Some(&order_id) = confirmed.choose(&mut rng) else {
            continue;
        };
        let Some(order) = order::get(&c.env.pool, order_id).await? else {
            continue;
        };
        match roll {
            0..45 => c.cancel(&order, true).await,
            45..55 => c.cancel(&order, false).await,
            _ => c.pay(&order).await,
        }
    }
    Ok(())
}

impl Chaos {
    async fn cancel(&self, order: &Order, double_click: bool) {
        let (pool, redis) = (&self.env.pool, &self.patient.redis);
        let outcomes = if double_click {
            let (a, b) = tokio::join!(
                cancel::cancel_order(pool, redis, order, Utc::now()),
                cancel::cancel_order(pool, redis, order, Utc::now())
            );
            vec![a, b]
        } else {
            vec![cancel::cancel_order(pool, redis, order, Utc::now()).await]
        };
        let cancelled = outcomes
            .iter()
            .filter(|o| matches!(o, Ok(CancelOutcome::Cancelled { .. })))
            .count();
        if cancelled > 1 {
            self.violate(
                "cancel_exactly_once",
                Some(order.activity_id),
                format!(
                    "order {} was cancelled by both clicks of a double click",
                    order.id
                ),
            );
        }
        self.count(|r| {
            r.cancel_clicks += outcomes.len() as u64;
            for o in &outcomes {
                let label = match o {
                    Ok(CancelOutcome::Cancelled { .. }) => "cancelled",
                    Ok(CancelOutcome::AlreadyCancelled) => "already cancelled",
                    Ok(CancelOutcome::NotCancellable(_)) => "not cancellable",
                    Ok(CancelOutcome::Busy) => "busy",
                    Err(_) => "error",
                };
                *r.cancels.entry(label).or_default() += 1;
            }
        });
    }

    async fn pay(&self, order: &Order) {
        let paid = testkit::pay(
            &self.env.pool,
            order.id,
            self.patient.config.payment_timeout,
        )
        .await;
        let refused = !matches!(
            paid,
            Ok(Ok(Settled::Decided {
                outcome: Outcome::Paid,
                ..
            }))
        );
        self.count(|r| {
            r.pays += 1;
            r.pays_refused += u64::from(refused);
        });
    }

    /// Reconcile's payment-timeout release alone (not a reconcile run), with a timeout of 1-4 s.
    async fn release_unpaid(&self, rng: &mut StdRng) {
        let timeout = Duration::from_millis(rng.random_range(1000..=4000));
        let job = self
            .patient
            .reconcile_with(|c| c.config.payment_timeout = timeout);
        let mut report = ReconcileReport::default();
        job.release_unpaid(Utc::now(), &mut report).await;
        self.count(|r| {
            r.release_runs += 1;
            r.released += report.released_unpaid as u64;
            r.release_deferred += report.release_deferred as u64;
            r.release_errors += report.errors.len() as u64;
        });
    }
}

/// An admin raising, lowering (maybe below what is sold: refused) and extending the sale.
async fn admin_changes(c: Arc<Chaos>) -> anyhow::Result<()> {
    let state = c.patient.admin_state();
    let mut rng = c.rng(500);
    while c.nap(rng.random_range(300..1000)).await {
        let id = c.pick_sale(&mut rng);
        let current = activity::get(&c.env.pool, id)
            .await?
            .with_context(|| format!("sale {id} is gone from the database"))?;
        let total = current.total_stock;
        let (what, patch) = match rng.random_range(0..100) {
            0..40 => (
                "raise",
                ActivityPatch {
                    total_stock: Some(total + rng.random_range(1..=8)),
                    ..Default::default()
                },
            ),
            40..75 => (
                "lower",
                ActivityPatch {
                    total_stock: Some((total - rng.random_range(1..=8)).max(1)),
                    ..Default::default()
                },
            ),
            _ => (
                "extend",
                ActivityPatch {
                    end_at: Some(
                        current.end_at + ChronoDuration::minutes(rng.random_range(1..=30)),
                    ),
                    ..Default::default()
                },
            ),
        };
        let outcome = match admin::update_activity(&state, id, &patch).await {
            Ok(_) => "ok",
            Err(e) => e.code(),
        };
        c.count(|r| *r.admin.entry(format!("{what} {outcome}")).or_default() += 1);
    }
    Ok(())
}

async fn preheats(c: Arc<Chaos>) -> anyhow::Result<()> {
    let job = c.patient.preheat();
    let mut rng = c.rng(600);
    while c.nap(rng.random_range(400..1500)).await {
        let outcome = job.run(Utc::now()).await;
        c.count(|r| {
            r.preheats += 1;
            match &outcome {
                Ok(p) => {
                    r.preheat_loaded += p.loaded as u64;
                    r.preheat_errors += p.errors.len() as u64;
                }
                Err(_) => r.preheat_errors += 1,
            }
        });
    }
    Ok(())
}

/// SIGSTOP the private Redis for 0.3-1.5 s at random moments, then SIGCONT.
async fn redis_pauses(c: Arc<Chaos>) -> anyhow::Result<()> {
    let Some(private) = &c.private else {
        return Ok(());
    };
    let mut rng = c.rng(800);
    while c.nap(rng.random_range(500..2000)).await {
        let ms = rng.random_range(300..=1500);
        private.signal("-STOP");
        tokio::time::sleep(Duration::from_millis(ms)).await;
        private.signal("-CONT");
        c.count(|r| {
            r.pauses += 1;
            r.paused_ms += ms;
        });
    }
    Ok(())
}

async fn reconciles(c: Arc<Chaos>) -> anyhow::Result<()> {
    let job = c.patient.reconcile();
    let mut rng = c.rng(900);
    while c.nap(rng.random_range(500..1500)).await {
        let outcome = job.run(Utc::now()).await;
        c.count_reconcile(&outcome);
    }
    Ok(())
}

/// Loses the sale's keys once, somewhere in the middle of the phase: FLUSHALL on the private
/// Redis, a DEL of every key of each sale on the shared cluster.
async fn key_loss(c: Arc<Chaos>, phase: Duration) -> anyhow::Result<()> {
    let mut rng = c.rng(1000);
    let at = phase.mul_f64(rng.random_range(0.3..0.7));
    if !c.nap(at.as_millis() as u64).await {
        return Ok(());
    }
    match &c.private {
        Some(private) => {
            // A paused server times the call out: try again until it is back (pauses are short).
            let until = Instant::now() + Duration::from_secs(10);
            loop {
                let flush = async {
                    let mut con = private.raw().await?;
                    redis::cmd("FLUSHALL").query_async::<()>(&mut con).await
                };
                match tokio::time::timeout(Duration::from_secs(2), flush).await {
                    Ok(Ok(())) => break,
                    _ if Instant::now() < until => {
                        tokio::time::sleep(Duration::from_millis(100)).await
                    }
                    Ok(Err(e)) => return Err(e).context("FLUSHALL"),
                    Err(_) => anyhow::bail!("FLUSHALL timed out"),
                }
            }
        }
        None => {
            // A bucketed sale may lose one bucket alone (its shard restarted empty).
            let one = rng.random_bool(0.5);
            for &id in &c.sales {
                let all: Vec<Bucket> = c.buckets_of(id).collect();
                let lost = if one && all.len() > 1 {
                    vec![all[rng.random_range(0..all.len())]]
                } else {
                    all
                };
                for bucket in lost {
                    let k = c.patient.redis.bucket_keys(bucket);
                    let _: i64 = c
                        .patient
                        .redis
                        .cmd(
                            redis::cmd("DEL")
                                .arg(&k.meta)
                                .arg(&k.users)
                                .arg(&k.ledger)
                                .arg(&k.lock)
                                .arg(&k.fence)
                                .arg(&k.pool)
                                .arg(&k.outbox)
                                .arg(&k.tickets),
                        )
                        .await?;
                }
            }
        }
    }
    c.count(|r| r.keys_lost += 1);
    Ok(())
}

/// Loses each draw sale's keys once more, 0-300 ms after its draw is done (before its
/// record, between the record and the sends, or during them): the load that follows finds the
/// recorded outcome (or none, and the draw runs again over the kept entries).
async fn draw_key_loss(c: Arc<Chaos>) -> anyhow::Result<()> {
    let mut rng = c.rng(1200);
    let mut left: Vec<i64> = c.draws.keys().copied().collect();
    while !left.is_empty() && c.nap(50).await {
        let mut i = 0;
        while i < left.len() {
            let id = left[i];
            let k = c.patient.redis.keys(id);
            let drawn: Option<String> = c
                .patient
                .redis
                .cmd(redis::cmd("HGET").arg(&k.meta).arg("drawn"))
                .await
                .unwrap_or(None);
            if drawn.as_deref() != Some("1") {
                i += 1;
                continue;
            }
            left.swap_remove(i);
            if !c.nap(rng.random_range(0..300)).await {
                return Ok(());
            }
            // A paused server times the call out: this loss is skipped then.
            if testkit::lose_sale(&c.patient.redis, id).await.is_ok() {
                c.count(|r| {
                    r.keys_lost += 1;
                    r.draw_keys_lost += 1;
                });
            }
        }
    }
    Ok(())
}

/// Loses a buyer's field in `users` every 0.3-1.2 s while the sale stays loaded, as a
/// failover that dropped the last writes leaves it: a random user of a random bucket's
/// `users`, when no entry of hers is in flight. Reconcile restores it from her live order,
/// and her cancel restores it itself; a field with no live order behind it stays gone.
async fn lost_fields(c: Arc<Chaos>) -> anyhow::Result<()> {
    let mut rng = c.rng(1100);
    while c.nap(rng.random_range(300..1200)).await {
        let id = c.pick_sale(&mut rng);
        let all: Vec<Bucket> = c.buckets_of(id).collect();
        let bucket = all[rng.random_range(0..all.len())];
        let k = c.patient.redis.bucket_keys(bucket);
        // A paused Redis may time the read out: the next round tries again.
        let Ok(users) = c
            .patient
            .redis
            .cmd::<Vec<String>>(redis::cmd("HKEYS").arg(&k.users))
            .await
        else {
            continue;
        };
        let users: Vec<&String> = users.iter().filter(|u| *u != SENTINEL).collect();
        let Some(user) = users.choose(&mut rng) else {
            continue;
        };
        if let Ok(true) = testkit::lose_field(&c.patient.redis, bucket, user).await {
            c.count(|r| r.fields_lost += 1);
        }
    }
    Ok(())
}

/// Samples throughout: Redis stock never negative, the database never oversold.
async fn watcher(c: Arc<Chaos>) -> anyhow::Result<()> {
    let mut rng = c.rng(700);
    while c.nap(rng.random_range(30..100)).await {
        for &id in &c.sales {
            c.sample(id).await?;
        }
    }
    Ok(())
}

impl Chaos {
    async fn sample(&self, id: i64) -> anyhow::Result<()> {
        // The raw value: the snapshot reports a negative stock as missing.
        for bucket in self.buckets_of(id) {
            match view::stock(&self.patient.redis, bucket).await {
                Ok(stock) => {
                    if let Some(v) = invariants::stock_never_negative(bucket, stock) {
                        self.broke(id, v);
                    }
                }
                Err(_) => self.count(|r| r.watcher_errors += 1),
            }
        }
        // One snapshot: the total and the orders are read at the same moment.
        let db = invariants::Database::read(&self.env.pool, id).await?;
        if let Some(v) = db.never_oversold() {
            self.broke(id, v);
        }
        self.count(|r| r.watcher_samples += 1);
        Ok(())
    }

    fn count_reconcile(&self, outcome: &anyhow::Result<ReconcileReport>) {
        self.count(|r| {
            r.reconciles += 1;
            match outcome {
                Ok(rep) => {
                    r.reconcile_repairs +=
                        rep.activities.iter().map(|a| a.repairs as u64).sum::<u64>();
                    r.reconcile_errors += rep.errors.len() as u64;
                }
                Err(_) => r.reconcile_errors += 1,
            }
        });
    }
}

// ---------------------------------------------------------------------------------------------
// Quiescence

impl Chaos {
    /// Consumes until the queue holds nothing, visible or in flight (a dead consumer's batch
    /// comes back after the visibility timeout), with no faults.
    async fn drain_queue(&self) -> anyhow::Result<()> {
        let consumer = self.consumer();
        let started = Instant::now();
        let mut quiet_polls = 0;
        while quiet_polls < 2 {
            if started.elapsed() > DRAIN_LIMIT {
                let depth = queue_depth(&self.env.sqs, &self.env.queue.url).await?;
                self.violate(
                    "queue_drained",
                    None,
                    format!("(visible, in flight) messages {depth:?} after {DRAIN_LIMIT:?}"),
                );
                break;
            }
            let messages = self.receive().await?;
            if messages.is_empty() {
                let (visible, in_flight) = queue_depth(&self.env.sqs, &self.env.queue.url).await?;
                quiet_polls = if visible + in_flight == 0 {
                    quiet_polls + 1
                } else {
                    0
                };
                continue;
            }
            quiet_polls = 0;
            self.deliver(&consumer, &messages, Delivery::Once, Duration::ZERO)
                .await;
            self.count(|r| r.drain_batches += 1);
        }
        let dlq = queue_depth(&self.env.sqs, &testkit::dlq_url(&self.env.queue.url)).await?;
        self.count(|r| {
            r.drain_secs = started.elapsed().as_secs_f64();
            r.dlq = dlq.0 + dlq.1;
        });
        Ok(())
    }

    /// What a draw sale's queued users do once the actors stop: ask for their status, which
    /// runs the draw if nobody ran it and sends what the outbox holds (sends that fail are
    /// tried again, as the next asker would). Bounded: what is left shows in the checks.
    async fn finish_draws(&self) {
        for &id in self.draws.keys() {
            let until = Instant::now() + DRAIN_LIMIT;
            while Instant::now() < until {
                let done = async {
                    let drawn = store::draw::draw(&self.patient.redis, id, Duration::MAX).await?;
                    if matches!(drawn, Drawn::Open { .. }) {
                        return anyhow::Ok(false);
                    }
                    let _ = protocol::draw::drain(
                        &self.patient.redis,
                        &self.env.pool,
                        &self.env.queue,
                        id,
                        usize::MAX,
                    )
                    .await;
                    Ok(store::draw::unsent(&self.patient.redis, id).await? == 0)
                };
                match done.await {
                    Ok(true) => break,
                    Ok(false) => tokio::time::sleep(Duration::from_millis(100)).await,
                    Err(e) => {
                        self.violate("harness", Some(id), format!("finishing the draw: {e:#}"));
                        break;
                    }
                }
            }
        }
    }

    /// Reconcile passes past the grace period of everything done so far.
    async fn final_reconcile(&self) -> anyhow::Result<()> {
        let job = self.patient.reconcile();
        let grace = ChronoDuration::from_std(self.patient.config.reconcile_grace)?;
        for _ in 0..FINAL_RECONCILES {
            let outcome = job
                .run(Utc::now() + grace + ChronoDuration::seconds(1))
                .await;
            if let Err(e) = &outcome {
                self.violate("harness", None, format!("final reconcile failed: {e:#}"));
            }
            self.count_reconcile(&outcome);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    /// Gives a reservation behind a 503 a few seconds to be given back (no reconcile needed).
    async fn wait_for_give_backs(&self) -> anyhow::Result<()> {
        let until = Instant::now() + GIVE_BACK_WAIT;
        loop {
            let mut busy = false;
            for &id in &self.sales {
                for (_, snap) in self.snapshots(id).await? {
                    busy |= !snap.ledger.is_empty();
                }
            }
            if !busy || Instant::now() >= until {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

async fn queue_depth(sqs: &aws_sdk_sqs::Client, url: &str) -> anyhow::Result<(u64, u64)> {
    let read_attrs = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send();
    let attrs = tokio::time::timeout(SQS_CALL_LIMIT, read_attrs)
        .await
        .context("queue attributes timed out")?
        .context("queue attributes")?;
    let read = |name: &QueueAttributeName| {
        attrs
            .attributes()
            .and_then(|a| a.get(name))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok((
        read(&QueueAttributeName::ApproximateNumberOfMessages),
        read(&QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
    ))
}

async fn delete_queue(sqs: &aws_sdk_sqs::Client, url: &str) {
    for u in [url.to_string(), testkit::dlq_url(url)] {
        let _ = sqs.delete_queue().queue_url(u).send().await;
    }
}

// ---------------------------------------------------------------------------------------------
// Checks at quiescence

/// An orders row, as the checks read it.
struct Row {
    id: i64,
    user_id: String,
    quantity: i64,
    status: String,
    reason: Option<String>,
}

fn is_live(status: &str) -> bool {
    matches!(status, "confirmed" | "paid")
}

impl Chaos {
    /// Every check of one sale at quiescence.
    async fn check_sale(&self, id: i64) -> anyhow::Result<()> {
        // The books: conservation, the database's remaining stock, no oversell, the users,
        // one live order per user.
        let books = Books::read(&self.patient.redis, &self.env.pool, id).await?;
        for v in books.violations() {
            self.broke(id, v);
        }
        self.check_ledger_empty(id, &books);
        let rows = self.rows(id).await?;
        let attempts: Vec<Attempt> = lock(&self.attempts)
            .iter()
            .filter(|a| a.activity_id == id)
            .cloned()
            .collect();
        let pool = if self.draws.contains_key(&id) {
            self.check_draw(id, &rows).await?
        } else {
            HashMap::new()
        };
        let accepted = self.check_accepted_requests_resolved(id, &attempts, &rows, &pool);
        self.check_no_order_behind_another_answer(id, &attempts, &accepted, &rows);
        self.count(|r| {
            for row in rows.values() {
                let label = match &row.reason {
                    Some(reason) => format!("{} {reason}", row.status),
                    None => row.status.clone(),
                };
                *r.rows.entry(label).or_default() += 1;
            }
        });
        Ok(())
    }

    /// Nothing in flight once all is quiet: every reservation became an order or was given
    /// back, every cancel finished, every check of reconcile's ended.
    fn check_ledger_empty(&self, id: i64, books: &Books) {
        if books.ledger().next().is_none() {
            return;
        }
        let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
        for e in books.ledger() {
            *kinds.entry(format!("{:?}", e.kind)).or_default() += 1;
        }
        let entries: Vec<String> = books
            .ledger()
            .map(|e| format!("{}:{:?}:{}x{}", e.user_id, e.kind, e.id, e.quantity))
            .collect();
        self.violate(
            "ledger_empty",
            Some(id),
            format!(
                "entries {kinds:?} ({} units reserved) left in the ledger {GIVE_BACK_WAIT:?} \
                 after the queue drained: {}",
                books.units().pending,
                some(&entries)
            ),
        );
    }

    async fn rows(&self, id: i64) -> anyhow::Result<HashMap<Uuid, Row>> {
        Ok(order::of_activity(&self.env.pool, id)
            .await?
            .into_iter()
            .map(|o| {
                let row = Row {
                    id: o.id,
                    user_id: o.user_id,
                    quantity: o.quantity,
                    status: o.status,
                    reason: o.failure_reason,
                };
                (o.request_id, row)
            })
            .collect())
    }

    /// Every 202 ends in an order (live or cancelled since) or a failure with an allowed reason,
    /// for the user and quantity asked. Returns the request ids answered 202.
    /// A draw sale after its draw: drawn, every winner's request an order (or an allowed
    /// failure), no loser's, and no loser holding any live order. Answers the pool by request
    /// id.
    async fn check_draw(
        &self,
        id: i64,
        rows: &HashMap<Uuid, Row>,
    ) -> anyhow::Result<HashMap<Uuid, store::draw::PoolEntry>> {
        let drawn = store::draw::draw(&self.patient.redis, id, Duration::MAX).await?;
        if !drawn.is_done() {
            self.violate(
                "draw_ran",
                Some(id),
                format!("the draw has not run: {drawn:?}"),
            );
        }
        let pool = store::draw::pool(&self.patient.redis, id).await?;
        let live_users: HashSet<&str> = rows
            .values()
            .filter(|r| is_live(&r.status))
            .map(|r| r.user_id.as_str())
            .collect();
        let (mut winners_without, mut losers_with) = (Vec::new(), Vec::new());
        for (user, e) in &pool {
            let row = rows.get(&e.request_id);
            if e.won && row.is_none() {
                winners_without.push(format!("{user} ({})", e.request_id));
            }
            if !e.won && (row.is_some() || live_users.contains(user.as_str())) {
                losers_with.push(format!("{user} ({})", e.request_id));
            }
        }
        if !winners_without.is_empty() || !losers_with.is_empty() {
            self.violate(
                "draw_outcomes",
                Some(id),
                format!(
                    "{} winner(s) without an orders row: {}; {} loser(s) with an order: {}",
                    winners_without.len(),
                    some(&winners_without),
                    losers_with.len(),
                    some(&losers_with)
                ),
            );
        }
        let unsent = store::draw::unsent(&self.patient.redis, id).await?;
        if unsent > 0 {
            self.violate(
                "draw_sent",
                Some(id),
                format!("{unsent} winner(s) left unsent"),
            );
        }
        self.count(|r| {
            r.draw_entrants += pool.len() as u64;
            r.draw_winners += pool.iter().filter(|(_, e)| e.won).count() as u64;
        });
        Ok(pool.into_iter().map(|(_, e)| (e.request_id, e)).collect())
    }

    fn check_accepted_requests_resolved(
        &self,
        id: i64,
        attempts: &[Attempt],
        rows: &HashMap<Uuid, Row>,
        pool: &HashMap<Uuid, store::draw::PoolEntry>,
    ) -> HashSet<Uuid> {
        let mut accepted = HashSet::new();
        let (mut unresolved, mut wrong) = (Vec::new(), Vec::new());
        // The users one of whose queued entries the draw decided (an order, or passed over).
        let decided: HashSet<&str> = attempts
            .iter()
            .filter(|a| a.status == 202 && a.queued)
            .filter(|a| {
                a.request_id
                    .is_some_and(|id| rows.contains_key(&id) || pool.contains_key(&id))
            })
            .map(|a| a.user.as_str())
            .collect();
        for a in attempts.iter().filter(|a| a.status == 202) {
            let Some(request_id) = a.request_id else {
                wrong.push(format!("a 202 to {} without a requestId", a.user));
                continue;
            };
            accepted.insert(request_id);
            let Some(row) = rows.get(&request_id) else {
                // A queued entry the draw passed over holds nothing: it reads `not_drawn`. One
                // Redis forgot before it was put back, whose user then entered again (and was
                // queued: nothing of hers was in the pool), is stood for by her newer entry,
                // with the same ticket: the draw decided that one.
                let passed_over = pool.get(&request_id).is_some_and(|e| !e.won);
                let superseded = decided.contains(a.user.as_str());
                if !(a.queued && (passed_over || superseded)) {
                    unresolved.push(request_id);
                }
                continue;
            };
            let allowed = match row.status.as_str() {
                "confirmed" | "paid" | "cancelled" => true,
                "failed" => row
                    .reason
                    .as_deref()
                    .is_some_and(|r| ALLOWED_FAILURE_REASONS.contains(&r)),
                _ => false,
            };
            if !allowed || row.user_id != a.user || row.quantity != a.quantity {
                wrong.push(format!(
                    "{request_id} ({} x{}) ended as order {} ({} x{}) {} {:?}",
                    a.user, a.quantity, row.id, row.user_id, row.quantity, row.status, row.reason
                ));
            }
        }
        if !unresolved.is_empty() || !wrong.is_empty() {
            self.violate(
                "accepted_requests_resolved",
                Some(id),
                format!(
                    "{} request(s) answered 202 have no orders row: {}; {} ended wrongly: {}",
                    unresolved.len(),
                    some(&unresolved),
                    wrong.len(),
                    some(&wrong)
                ),
            );
        }
        accepted
    }

    /// A 503 means nothing happened: an order that came to be (live, or cancelled since) stems
    /// from a 202. A 503 does not name its request id, so an order whose request id no buyer
    /// was answered 202 for is one behind another answer; a 503 that does carry one is checked
    /// directly.
    fn check_no_order_behind_another_answer(
        &self,
        id: i64,
        attempts: &[Attempt],
        accepted: &HashSet<Uuid>,
        rows: &HashMap<Uuid, Row>,
    ) {
        let refused_ids: HashSet<Uuid> = attempts
            .iter()
            .filter(|a| a.status != 202)
            .filter_map(|a| a.request_id)
            .collect();
        let mut behind: Vec<String> = rows
            .iter()
            .filter(|(rid, r)| {
                matches!(r.status.as_str(), "confirmed" | "paid" | "cancelled")
                    && (!accepted.contains(*rid) || refused_ids.contains(*rid))
            })
            .map(|(rid, r)| {
                // What that user was told instead, for the same quantity: 5xx, or no answer.
                let failed_answers = attempts
                    .iter()
                    .filter(|a| a.user == r.user_id && a.quantity == r.quantity)
                    .filter(|a| a.status == 0 || a.status >= 500)
                    .count();
                format!(
                    "order {} ({} x{}, {}, request {rid}; {failed_answers} 5xx/unanswered \
                     clicks of that user for x{})",
                    r.id, r.user_id, r.quantity, r.status, r.quantity
                )
            })
            .collect();
        behind.sort();
        if !behind.is_empty() {
            self.violate(
                "unavailable_means_nothing",
                Some(id),
                format!(
                    "{} order(s) exist for requests not answered 202: {}",
                    behind.len(),
                    some(&behind)
                ),
            );
        }
    }

    fn print_report(&self) {
        println!(
            "seed={} [{}] report:\n{}",
            self.seed,
            self.variant,
            lock(&self.report)
        );
    }

    /// A passed seed's database and queue are dropped (a long campaign would pile them up);
    /// a failed seed's are kept for a look. Each step is bounded, and one that does not finish
    /// is a finding that names it: closing the pool waits for every connection to come back,
    /// so a connection something still holds after quiescence shows here, with the pool's
    /// count of those not handed back.
    async fn clean_up(&self, passed: bool) -> Vec<String> {
        if !passed {
            println!(
                "seed={} [{}]: kept database {} and queue {} for a look",
                self.seed,
                self.variant,
                self.env.config.database_url.redacted(),
                self.env.queue.url
            );
            return Vec::new();
        }
        let mut findings = Vec::new();
        let mut bounded = |step: &str, done: bool| {
            if !done {
                findings.push(format!(
                    "seed={} [{}] clean-up: {step} did not finish within {CLEAN_UP_STEP_LIMIT:?}",
                    self.seed, self.variant
                ));
            }
        };
        let queue = delete_queue(&self.env.sqs, &self.env.queue.url);
        bounded("deleting the queue", finishes(queue).await);
        let pool = &self.env.pool;
        let closing = finishes(pool.close()).await;
        let held = pool.size() as usize - pool.num_idle();
        bounded(
            &format!("closing the pool ({held} connection(s) not handed back)"),
            closing,
        );
        match tokio::time::timeout(
            CLEAN_UP_STEP_LIMIT,
            drop_database(self.env.config.database_url.expose()),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => println!("seed={}: could not drop its database: {e:#}", self.seed),
            Err(_) => bounded("dropping the database", false),
        }
        findings
    }
}

async fn drop_database(url: &str) -> anyhow::Result<()> {
    let (base, rest) = url.rsplit_once('/').context("a database url")?;
    let (name, query) = match rest.split_once('?') {
        Some((name, query)) => (name, format!("?{query}")),
        None => (rest, String::new()),
    };
    anyhow::ensure!(
        name.starts_with("seckill_test_")
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
        "not a test database: {name}"
    );
    let mut admin = PgConnection::connect(&format!("{base}/postgres{query}")).await?;
    // A database name cannot be a bind parameter: the statement is built at runtime, which
    // `sqlx::query!` (a checked literal) cannot take.
    // The name is a test database's (checked above), never user input.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "drop database if exists {name} with (force)"
    )))
    .execute(&mut admin)
    .await?;
    admin.close().await?;
    Ok(())
}

#[test]
fn seeds_parse_as_lists_and_ranges() {
    assert_eq!(parse_seeds("1,5, 9").unwrap(), vec![1, 5, 9]);
    assert_eq!(parse_seeds("3..6").unwrap(), vec![3, 4, 5]);
    assert_eq!(parse_seeds("3..=5,10").unwrap(), vec![3, 4, 5, 10]);
    assert!(parse_seeds("x").is_err());
    assert!(parse_seeds(" , ").is_err());
}
