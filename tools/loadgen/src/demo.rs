//! `make demo`: a real flash sale through HTTP, end to end, and what came of it.
//!
//! Starts the dev server in-process on a free port (the same routers, poller and schedules as
//! `make serve`), creates an activity as an admin, waits for preheat, lets a crowd loose as the
//! window opens, waits for the consumer to drain the queue, runs reconcile once, then reads the
//! truth back from PostgreSQL and Redis. Every figure in the report is counted from responses or
//! read from the stores; nothing is assumed from the inputs.
//!
//! The sale may have several stock buckets (`--buckets`), and the stack's Redis may be the
//! standalone server or the 3-master cluster (`--cluster`): the stock is then sampled, and read
//! back, bucket by bucket, and the report says which node serves each bucket's hash tag.
//!
//! The sale may be a draw (`--admission draw`): the crowd's purchases in its window are
//! queued, every entrant then asks for their status until it is final, and the report says
//! who won and whether the winners' arrival ranks look uniform ([`admission`]).

use crate::chart::{self, Arrivals, Entrant, StockSample};
use crate::load::{self, CrowdSpec, LoadReport, Plan, RunOptions};
use anyhow::Context;
use chrono::{DateTime, Utc};
use seckill_devserver::DevConfig;
use seckill_shared::domain::order;
use seckill_shared::domain::settings::{self, Admission};
use seckill_shared::http::auth::{issued_scope, mint};
use seckill_shared::infra::shape::Function;
use seckill_shared::store::buckets;
use seckill_shared::store::conn::Redis;
use seckill_shared::Config;
use sqlx::PgPool;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub mod admission;
mod facts;
mod report;

pub use facts::facts;
use report::build_report;
pub use report::{BucketFacts, DemoReport, StoreFacts};

/// The demo's knobs.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    pub stock: i64,
    pub per_order_limit: i64,
    /// Stock buckets the sale's Redis stock is split over (1 to `keys::MAX_BUCKETS`).
    pub buckets: u32,
    /// First come, first served, or a draw over the purchases of the first `draw_window`.
    pub admission: Admission,
    /// A draw sale's pool window after the opening (unused for first come, first served).
    pub draw_window: Duration,
    pub users: usize,
    pub requests: usize,
    pub concurrency: usize,
    /// Seconds from creating the activity to its window opening.
    pub opens_in: Duration,
    /// The crowd starts this long before the window opens (those requests get `not_started`).
    pub early: Duration,
    pub bad_ratio: f64,
    pub seed: u64,
    pub jwt_secret: String,
    pub out_dir: PathBuf,
    pub drain_timeout: Duration,
    /// Bound on the entry function's SQS send. `make demo` runs on fauxqs, which answers in
    /// milliseconds; the generous default keeps a demo pointed at moto (seconds per send under a
    /// crowd: each of its sends scans every queued message) from turning a slow emulator into
    /// 503s.
    pub sqs_timeout: Duration,
    pub quiet: bool,
    /// Where the stack is and how the functions are tuned (`sqs_timeout` above wins).
    pub config: Config,
}

impl DemoOptions {
    /// Refuses what the sale cannot be: a draw runs as one script on one shard, so a draw
    /// sale has one stock bucket.
    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.admission == Admission::Fcfs || self.buckets == 1,
            "--admission draw cannot be combined with --buckets {}: a draw sale keeps its pool \
             and its stock in one bucket (its draw is one Lua script on one shard)",
            self.buckets
        );
        anyhow::ensure!(
            self.admission == Admission::Fcfs
                || (1..=settings::MAX_DRAW_WINDOW_MS as u128)
                    .contains(&self.draw_window.as_millis()),
            "--draw-window-ms must be between 1 and {}",
            settings::MAX_DRAW_WINDOW_MS
        );
        Ok(())
    }
}

/// Runs the whole show.
pub async fn run(opts: DemoOptions) -> anyhow::Result<DemoReport> {
    opts.check()?;
    let stage = Stage::set_up(&opts).await?;
    let activity = open_activity(&stage, &opts).await?;
    let activity_id = activity.id;
    let (plan, load, sampler) = let_crowd_in(&stage, &opts, &activity).await?;
    let offset = admission::opening_offset(&load, activity.start_at);
    let (draw, arrivals) = match opts.admission {
        Admission::Draw => {
            let (report, entrants) =
                admission::settle(&stage, &opts, &activity, &plan, &load).await?;
            (Some(report), entrants)
        }
        Admission::Fcfs => (None, admission::first_come(&plan, &load, offset)),
    };
    let winners = draw.as_ref().map_or(0, |d| d.winners);
    let (drained, drain_secs) = drain(&stage, &opts, &activity, &load, winners).await?;
    let samples = sampler.stop().await;
    let (reconcile, store) = read_back(stage, activity_id).await?;
    let arrivals = arrivals_of(&opts, arrivals);
    let chart = draw_chart(&opts, &load, &samples, &store, &arrivals);
    let mut report = build_report(
        activity_id,
        &opts,
        load,
        store,
        drained,
        drain_secs,
        reconcile,
        samples,
        chart,
    );
    report.draw = draw;
    let json_path = opts.out_dir.join("report.json");
    std::fs::write(&json_path, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("cannot write {}", json_path.display()))?;
    Ok(report)
}

/// The dev server the crowd calls, and the demo's own clients of the stores (the operator's:
/// the admin function's logins).
struct Stage {
    server: seckill_devserver::DevServer,
    base: String,
    pool: PgPool,
    redis: Redis,
    http: reqwest::Client,
}

impl Stage {
    async fn set_up(opts: &DemoOptions) -> anyhow::Result<Self> {
        let mut config = opts.config.clone().check()?;
        config.sqs_timeout = opts.sqs_timeout;
        std::fs::create_dir_all(&opts.out_dir)
            .with_context(|| format!("cannot create {}", opts.out_dir.display()))?;

        let mut dev = DevConfig::new(config.clone(), opts.jwt_secret.clone());
        dev.addr = ([127, 0, 0, 1], 0).into();
        dev.preheat_every = Some(Duration::from_millis(500));
        // Reconcile runs once, after the drain, so the report shows what it found.
        dev.reconcile_every = None;
        let server = seckill_devserver::start(dev)
            .await
            .context("failed to start the dev server (is the stack up? `make stack`)")?;
        let base = server.url();
        say(opts, &format!("dev server on {base}"));

        // The demo watches the sale and reads what came of it as the operator does: with the
        // admin function's logins, so that only the functions' roles and users are connected
        // while the crowd runs.
        let operator = Function::Admin.local_config(&config)?;
        let pool = operator.database_pool().await?;
        let redis = Redis::connect(&operator).await?;
        let http = reqwest::Client::new();
        Ok(Self {
            server,
            base,
            pool,
            redis,
            http,
        })
    }
}

/// The sale the admin created.
struct CreatedActivity {
    id: i64,
    start_at: DateTime<Utc>,
    /// Its bucket count, as the created activity says.
    buckets: u32,
}

/// An admin creates the sale, opening a few seconds from now; answers once it is preheated.
async fn open_activity(stage: &Stage, opts: &DemoOptions) -> anyhow::Result<CreatedActivity> {
    let Stage { base, http, .. } = stage;
    let admin = mint(&opts.jwt_secret, "demo-admin", &issued_scope(true), 3600)?;
    let start_at = Utc::now() + chrono::Duration::from_std(opts.opens_in)?;
    let end_at = start_at + chrono::Duration::minutes(30);
    let (id, buckets) = create_activity(http, base, &admin, opts, start_at, end_at).await?;
    let admission = match opts.admission {
        Admission::Fcfs => String::new(),
        Admission::Draw => format!(
            ", a draw over its first {} ms",
            opts.draw_window.as_millis()
        ),
    };
    anyhow::ensure!(
        buckets == opts.buckets,
        "activity {id} was created with {buckets} buckets, not the {} asked for",
        opts.buckets
    );
    say(
        opts,
        &format!(
            "activity {id}: {} units in {buckets} bucket(s), {} per user, opens at {}{admission}",
            opts.stock,
            opts.per_order_limit,
            start_at.format("%H:%M:%S%.3f")
        ),
    );
    wait_for_preheat(http, base, id).await?;
    say(opts, "preheated into Redis");
    Ok(CreatedActivity {
        id,
        start_at,
        buckets,
    })
}

/// The crowd arrives a moment before the window opens; the stock sampler runs from then on
/// and keeps running (through the drain) until stopped. Answers the crowd's plan too (its
/// users and their tokens).
async fn let_crowd_in(
    stage: &Stage,
    opts: &DemoOptions,
    activity: &CreatedActivity,
) -> anyhow::Result<(Plan, LoadReport, StockSampler)> {
    let activity_id = activity.id;
    let plan = Plan::crowd(&CrowdSpec {
        activity_id,
        users: opts.users,
        requests: opts.requests,
        quantity: 1,
        bad_ratio: opts.bad_ratio,
        seed: opts.seed,
        secret: opts.jwt_secret.clone(),
        user_prefix: format!("demo{activity_id}-user"),
    })?;

    let fire_at_utc = activity.start_at - chrono::Duration::from_std(opts.early)?;
    let wait = (fire_at_utc - Utc::now()).to_std().unwrap_or_default();
    let fire_at = Instant::now() + wait;
    let sampler = StockSampler::start(stage.redis.clone(), activity_id, activity.buckets, fire_at);
    tokio::time::sleep_until(fire_at.into()).await;
    say(
        opts,
        &format!(
            "crowd: {} requests from {} users",
            opts.requests, opts.users
        ),
    );
    let load = load::run(
        &plan,
        &RunOptions {
            base_url: stage.base.clone(),
            concurrency: opts.concurrency,
            timeout: Duration::from_secs(30),
            quiet: opts.quiet,
        },
    )
    .await?;
    Ok((plan, load, sampler))
}

/// Waits for the consumer to turn the accepted purchases (and a draw's `winners`) into
/// orders; answers whether it drained within the timeout, and how long that took.
async fn drain(
    stage: &Stage,
    opts: &DemoOptions,
    activity: &CreatedActivity,
    load: &LoadReport,
    winners: u64,
) -> anyhow::Result<(bool, f64)> {
    let accepted = load
        .requests_by_outcome
        .get("accepted")
        .copied()
        .unwrap_or(0)
        + winners;
    let drain_started = Instant::now();
    let drained = wait_for_drain(
        &stage.pool,
        &stage.redis,
        activity,
        accepted,
        opts.drain_timeout,
    )
    .await?;
    Ok((drained, drain_started.elapsed().as_secs_f64()))
}

/// Runs reconcile once, reads the outcome back from the stores, and stops the dev server.
async fn read_back(
    stage: Stage,
    activity_id: i64,
) -> anyhow::Result<(serde_json::Value, StoreFacts)> {
    // Only this activity's part: the real database holds earlier demos too.
    let reconcile = match stage.server.functions().reconcile(Utc::now()).await {
        Ok(r) => serde_json::to_value(r.activity(activity_id)).unwrap_or_default(),
        Err(e) => serde_json::json!({ "error": format!("{e:#}") }),
    };
    let store = facts(&stage.pool, &stage.redis, activity_id).await?;
    stage.server.shutdown().await?;
    Ok((reconcile, store))
}

/// The chart's arrivals panel: a draw's pool entrants, or a first-come sale's buyers.
fn arrivals_of(opts: &DemoOptions, entrants: Vec<Entrant>) -> Arrivals {
    match opts.admission {
        Admission::Draw => Arrivals {
            caption: format!(
                "draw: pool entrants by arrival in its {} ms window, winners in green",
                opts.draw_window.as_millis()
            ),
            entrants,
            window_close: Some(opts.draw_window.as_secs_f64()),
        },
        Admission::Fcfs => Arrivals {
            caption: "first come, first served: buyers by first answer after the opening, winners in green"
                .into(),
            entrants,
            window_close: None,
        },
    }
}

/// Writes chart.png; answers its path, or why it was not written.
fn draw_chart(
    opts: &DemoOptions,
    load: &LoadReport,
    samples: &[StockSample],
    store: &StoreFacts,
    arrivals: &Arrivals,
) -> String {
    let chart_path = opts.out_dir.join("chart.png");
    let buckets = match store.buckets.len() {
        1 => String::new(),
        n => format!(" in {n} buckets"),
    };
    let redis = match store.redis_nodes.len() {
        0 => "standalone Redis".to_string(),
        n => format!("a {n}-master cluster"),
    };
    let admission = match opts.admission {
        Admission::Fcfs => String::new(),
        Admission::Draw => format!(" by draw ({} ms window)", opts.draw_window.as_millis()),
    };
    match chart::draw(
        &chart_path,
        &format!(
            "seckill demo: {} units{buckets}{admission} on {redis}, {} requests, {} concurrent",
            opts.stock, load.requests, opts.concurrency
        ),
        &load.timeline,
        samples,
        store.db_total_stock,
        Some(arrivals),
    ) {
        Ok(()) => display_path(&chart_path),
        Err(e) => format!("not written: {e:#}"),
    }
}

/// Step lines go to stderr, beside the progress bar; stdout carries the report.
fn say(opts: &DemoOptions, line: &str) {
    if !opts.quiet {
        eprintln!("[demo] {line}");
    }
}

fn display_path(p: &std::path::Path) -> String {
    std::fs::canonicalize(p)
        .unwrap_or_else(|_| p.to_path_buf())
        .display()
        .to_string()
}

async fn create_activity(
    http: &reqwest::Client,
    base: &str,
    admin_token: &str,
    opts: &DemoOptions,
    start_at: DateTime<Utc>,
    end_at: DateTime<Utc>,
) -> anyhow::Result<(i64, u32)> {
    let mut body = serde_json::json!({
        "title": "make demo flash sale",
        "totalStock": opts.stock,
        "perOrderLimit": opts.per_order_limit,
        "priceMinor": 1999,
        "currency": "usd",
        "startAt": start_at.to_rfc3339(),
        "endAt": end_at.to_rfc3339(),
        "buckets": opts.buckets,
    });
    if opts.admission == Admission::Draw {
        body["admission"] = Admission::Draw.as_str().into();
        body["drawWindowMs"] = (opts.draw_window.as_millis() as u64).into();
    }
    let resp = http
        .post(format!("{base}/admin/activities"))
        .bearer_auth(admin_token)
        .json(&body)
        .send()
        .await
        .context("POST /admin/activities")?;
    let status = resp.status();
    let body: serde_json::Value = resp.json().await.unwrap_or_default();
    anyhow::ensure!(
        status.as_u16() == 201,
        "creating the activity answered {status}: {body}"
    );
    let id = body
        .get("id")
        .and_then(|v| v.as_i64())
        .with_context(|| format!("the created activity has no numeric id: {body}"))?;
    let buckets = body
        .get("buckets")
        .and_then(|v| v.as_u64())
        .and_then(|n| u32::try_from(n).ok())
        .with_context(|| format!("the created activity has no bucket count: {body}"))?;
    let admission = body.get("admission").and_then(|v| v.as_str());
    anyhow::ensure!(
        admission == Some(opts.admission.as_str()),
        "activity {id} was created with admission {admission:?}, not the {:?} asked for",
        opts.admission.as_str()
    );
    Ok((id, buckets))
}

async fn wait_for_preheat(http: &reqwest::Client, base: &str, id: i64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let resp = http.get(format!("{base}/activities/{id}")).send().await?;
        if resp.status().is_success() {
            let body: serde_json::Value = resp.json().await.unwrap_or_default();
            if body.get("remainingStock").is_some_and(|v| v.is_number()) {
                return Ok(());
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "activity {id} was not preheated within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The Redis stock of every bucket, sampled every 100 ms in a task of its own, for the chart.
struct StockSampler {
    samples: Arc<Mutex<Vec<StockSample>>>,
    running: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl StockSampler {
    fn start(redis: Redis, activity_id: i64, buckets: u32, fire_at: Instant) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let running = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let task = tokio::spawn(sample_stock(
            redis,
            (activity_id, buckets),
            fire_at,
            samples.clone(),
            running.clone(),
        ));
        Self {
            samples,
            running,
            task,
        }
    }

    /// Takes one more sample, stops, and answers all of them.
    async fn stop(self) -> Vec<StockSample> {
        self.running
            .store(false, std::sync::atomic::Ordering::Relaxed);
        let _ = self.task.await;
        let samples = self.samples.lock().expect("sampler finished").clone();
        samples
    }
}

/// Samples each bucket's Redis stock every 100 ms; `t` is relative to the crowd's start. The
/// buckets are read one after another, not atomically: a sample's total may miss units that
/// are between two buckets at that moment.
async fn sample_stock(
    redis: Redis,
    (id, count): (i64, u32),
    fire_at: Instant,
    out: Arc<Mutex<Vec<StockSample>>>,
    running: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut ticks = tokio::time::interval(Duration::from_millis(100));
    loop {
        ticks.tick().await;
        let now = Instant::now();
        let t = if now >= fire_at {
            now.duration_since(fire_at).as_secs_f64()
        } else {
            -fire_at.duration_since(now).as_secs_f64()
        };
        let stocks = buckets::stocks(&redis, id, count).await.unwrap_or_default();
        // Only whole samples: every bucket loaded and answered.
        if let Some(each) = stocks.into_iter().collect::<Option<Vec<i64>>>() {
            if !each.is_empty() {
                out.lock().expect("sampler lock").push(StockSample {
                    t,
                    stock: each.iter().sum(),
                    buckets: each,
                });
            }
        }
        if !running.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
    }
}

/// Waits until every bucket's ledger holds no reservation and the orders table has caught up
/// with the accepted responses (or stopped moving for two seconds), within the timeout.
async fn wait_for_drain(
    pool: &PgPool,
    redis: &Redis,
    activity: &CreatedActivity,
    accepted: u64,
    timeout: Duration,
) -> anyhow::Result<bool> {
    let deadline = Instant::now() + timeout;
    let mut last = -1_i64;
    let mut stable_since = Instant::now();
    loop {
        let snaps = buckets::snapshots(redis, activity.id, activity.buckets).await?;
        // Every status counts: the row is the request's decided fate.
        let settled = order::tally(pool, activity.id).await?.rows;
        if settled != last {
            last = settled;
            stable_since = Instant::now();
        }
        let ledger_empty = snaps.iter().all(|(_, s)| s.pending_count() == 0);
        if ledger_empty
            && (settled as u64 >= accepted || stable_since.elapsed() > Duration::from_secs(2))
        {
            return Ok(true);
        }
        if Instant::now() > deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests;
