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
use admission::DrawReport;
use anyhow::Context;
use chrono::{DateTime, Utc};
use seckill_devserver::DevConfig;
use seckill_shared::domain::settings::{self, Admission};
use seckill_shared::domain::{activity, order};
use seckill_shared::http::auth::{mint, ADMIN_SCOPE};
use seckill_shared::store::buckets;
use seckill_shared::store::conn::Redis;
use seckill_shared::store::keys::{self, Bucket as StockBucket};
use seckill_shared::store::ledger::Snapshot;
use seckill_shared::Config;
use serde::Serialize;
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub mod admission;

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
    /// crowd, see TOOLCHAIN.md) from turning a slow emulator into 503s.
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

/// What the stores say after the sale.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreFacts {
    /// Confirmed + paid orders.
    pub orders: i64,
    pub units_sold: i64,
    pub failed_orders: i64,
    pub duplicate_users: i64,
    pub db_total_stock: i64,
    pub db_remaining_stock: i64,
    /// Over all buckets; `None` when a bucket is not loaded.
    pub redis_stock: Option<i64>,
    pub redis_participants: i64,
    pub pending_qty: i64,
    pub pending_count: usize,
    /// Units taken from one bucket for another and not yet settled there.
    pub transfer_qty: i64,
    /// The masters serving the cluster's slots (empty on a standalone Redis).
    pub redis_nodes: Vec<String>,
    /// Each stock bucket, bucket 0 first (one for a sale with one bucket).
    pub buckets: Vec<BucketFacts>,
}

/// One stock bucket after the sale.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BucketFacts {
    pub index: u32,
    /// The hash tag the bucket's keys share, and its cluster slot.
    pub tag: String,
    pub slot: u32,
    /// The cluster master serving that slot (`None` on a standalone Redis).
    pub node: Option<String>,
    /// Units left; `None` when the bucket is not loaded.
    pub stock: Option<i64>,
    /// Buyers whose home bucket this is.
    pub participants: i64,
}

/// The report `make demo` prints and writes to `report.json`.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DemoReport {
    pub activity_id: i64,
    pub stock: i64,
    pub units_sold: i64,
    pub orders: i64,
    pub duplicate_users: i64,
    pub oversell: i64,
    pub conservation_ok: bool,
    pub conservation: String,
    pub requests: u64,
    pub requests_by_outcome: BTreeMap<String, u64>,
    pub requests_by_kind: BTreeMap<String, u64>,
    pub accepted: u64,
    pub throughput: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub users: usize,
    pub concurrency: usize,
    pub elapsed_secs: f64,
    pub drain_secs: f64,
    pub drained: bool,
    pub reconcile: serde_json::Value,
    pub store: StoreFacts,
    /// Responses per 100 ms, by class (what the chart draws).
    pub timeline: Vec<load::Bucket>,
    pub stock_samples: Vec<StockSample>,
    pub chart: String,
    /// A draw sale's pool, winners and fairness (absent for first come, first served).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draw: Option<DrawReport>,
}

impl DemoReport {
    /// True when the sale came out exactly right (a draw: every entrant settled, and the
    /// winners' ranks consistent with a uniform draw).
    pub fn ok(&self) -> bool {
        self.oversell == 0
            && self.duplicate_users == 0
            && self.conservation_ok
            && self.draw.as_ref().is_none_or(DrawReport::ok)
    }

    /// The human report.
    pub fn text(&self) -> String {
        let mut o = String::new();
        self.write_crowd(&mut o);
        self.write_outcome(&mut o);
        o
    }

    /// What the crowd sent and how the entry function answered it.
    fn write_crowd(&self, o: &mut String) {
        let _ = writeln!(o, "\n== flash sale: activity {} ==", self.activity_id);
        let _ = writeln!(
            o,
            "redis           {}, {} stock bucket{}",
            redis_topology(&self.store.redis_nodes),
            self.store.buckets.len(),
            if self.store.buckets.len() == 1 {
                ""
            } else {
                "s"
            }
        );
        let _ = writeln!(
            o,
            "crowd           {} requests from {} users, {} concurrent, {:.2} s",
            self.requests, self.users, self.concurrency, self.elapsed_secs
        );
        let _ = writeln!(o, "requests by outcome");
        for (k, v) in &self.requests_by_outcome {
            let pct = 100.0 * *v as f64 / self.requests.max(1) as f64;
            let _ = writeln!(o, "  {k:<24}{v:>8}  {pct:>5.1}%");
        }
        let _ = writeln!(o, "requests as planned");
        for (k, v) in &self.requests_by_kind {
            let _ = writeln!(o, "  {k:<24}{v:>8}");
        }
        let _ = writeln!(o, "throughput      {:.0} req/s", self.throughput);
        let _ = writeln!(
            o,
            "latency         p50 {:.2} ms  p95 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
            self.p50_ms, self.p95_ms, self.p99_ms, self.max_ms
        );
    }

    /// What the stores hold afterwards, each check with its verdict.
    fn write_outcome(&self, o: &mut String) {
        let verdict = |ok: bool| if ok { "ok" } else { "FAILED" };
        let _ = writeln!(
            o,
            "queue drained   {} in {:.1} s after the crowd",
            if self.drained {
                "yes"
            } else {
                "NO (timed out)"
            },
            self.drain_secs
        );
        let s = &self.store;
        let _ = writeln!(
            o,
            "orders in DB    {} confirmed/paid, {} failed",
            self.orders, s.failed_orders
        );
        let winners = self
            .draw
            .as_ref()
            .map_or_else(String::new, |d| format!(", draw winners: {}", d.winners));
        let _ = writeln!(
            o,
            "units sold      {} of {} (accepted responses: {}{winners})",
            self.units_sold, self.stock, self.accepted
        );
        if let Some(d) = &self.draw {
            d.write(o);
        }
        if s.buckets.len() > 1 {
            write_buckets(o, &s.buckets);
        }
        let _ = writeln!(
            o,
            "duplicate users {}  [{}]",
            self.duplicate_users,
            verdict(self.duplicate_users == 0)
        );
        let _ = writeln!(
            o,
            "oversell        {}  [{}]",
            self.oversell,
            verdict(self.oversell == 0)
        );
        let _ = writeln!(
            o,
            "conservation    {}  [{}]",
            self.conservation,
            verdict(self.conservation_ok)
        );
        let _ = writeln!(o, "reconcile       {}", self.reconcile);
        let _ = writeln!(o, "chart           {}", self.chart);
    }
}

/// "standalone", or the cluster's masters.
fn redis_topology(nodes: &[String]) -> String {
    if nodes.is_empty() {
        "standalone".into()
    } else {
        format!("cluster of {} masters ({})", nodes.len(), nodes.join(", "))
    }
}

/// Each bucket's stock at the end, where it lives, and how many buyers it is home to.
fn write_buckets(o: &mut String, buckets: &[BucketFacts]) {
    let _ = writeln!(o, "stock by bucket at the end");
    for b in buckets {
        let stock = b
            .stock
            .map_or_else(|| "not loaded".to_string(), |s| s.to_string());
        let _ = writeln!(
            o,
            "  bucket {:<3}{:<20}slot {:>5}  {:<16}{:>8} left{:>8} buyers",
            b.index,
            format!("{{{}}}", b.tag),
            b.slot,
            b.node.as_deref().unwrap_or("-"),
            stock,
            b.participants
        );
    }
}

/// Runs the whole show.
pub async fn run(opts: DemoOptions) -> anyhow::Result<DemoReport> {
    opts.check()?;
    let stage = Stage::set_up(&opts).await?;
    let sale = open_sale(&stage, &opts).await?;
    let activity_id = sale.id;
    let (plan, load, sampler) = let_crowd_in(&stage, &opts, &sale).await?;
    let offset = admission::opening_offset(&load, sale.start_at);
    let (draw, arrivals) = match opts.admission {
        Admission::Draw => {
            let (report, entrants) = admission::settle(&stage, &opts, &sale, &plan, &load).await?;
            (Some(report), entrants)
        }
        Admission::Fcfs => (None, admission::first_come(&plan, &load, offset)),
    };
    let winners = draw.as_ref().map_or(0, |d| d.winners);
    let (drained, drain_secs) = drain(&stage, &opts, &sale, &load, winners).await?;
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

/// The dev server the crowd calls, and the demo's own clients of the stores.
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

        let pool = config.database_pool().await?;
        let redis = Redis::connect(&config).await?;
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
struct Sale {
    id: i64,
    start_at: DateTime<Utc>,
    /// Its bucket count, as the created activity says.
    buckets: u32,
}

/// An admin creates the sale, opening a few seconds from now; answers once it is preheated.
async fn open_sale(stage: &Stage, opts: &DemoOptions) -> anyhow::Result<Sale> {
    let Stage { base, http, .. } = stage;
    let admin = mint(&opts.jwt_secret, "demo-admin", ADMIN_SCOPE, 3600)?;
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
    Ok(Sale {
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
    sale: &Sale,
) -> anyhow::Result<(Plan, LoadReport, StockSampler)> {
    let activity_id = sale.id;
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

    let fire_at_utc = sale.start_at - chrono::Duration::from_std(opts.early)?;
    let wait = (fire_at_utc - Utc::now()).to_std().unwrap_or_default();
    let fire_at = Instant::now() + wait;
    let sampler = StockSampler::start(stage.redis.clone(), activity_id, sale.buckets, fire_at);
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
    sale: &Sale,
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
        sale,
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

#[allow(clippy::too_many_arguments)]
fn build_report(
    activity_id: i64,
    opts: &DemoOptions,
    load: LoadReport,
    store: StoreFacts,
    drained: bool,
    drain_secs: f64,
    reconcile: serde_json::Value,
    stock_samples: Vec<StockSample>,
    chart: String,
) -> DemoReport {
    let total = store.db_total_stock;
    let (conservation_ok, conservation) = conservation(&store);
    DemoReport {
        activity_id,
        stock: total,
        units_sold: store.units_sold,
        orders: store.orders,
        duplicate_users: store.duplicate_users,
        oversell: (store.units_sold - total).max(0),
        conservation_ok,
        conservation,
        requests: load.requests,
        accepted: load
            .requests_by_outcome
            .get("accepted")
            .copied()
            .unwrap_or(0),
        requests_by_outcome: load.requests_by_outcome,
        requests_by_kind: load.requests_by_kind,
        throughput: load.throughput,
        p50_ms: load.latency.p50_ms,
        p95_ms: load.latency.p95_ms,
        p99_ms: load.latency.p99_ms,
        max_ms: load.latency.max_ms,
        users: opts.users,
        concurrency: load.concurrency,
        elapsed_secs: load.elapsed_secs,
        drain_secs,
        drained,
        reconcile,
        store,
        timeline: load.timeline,
        stock_samples,
        chart,
        draw: None,
    }
}

/// Whether every unit is accounted for, and the sum that says so: Redis stock (over all
/// buckets) + pending reservations + units in transfer between buckets + confirmed units =
/// total stock, and PostgreSQL's remaining = total - confirmed.
fn conservation(store: &StoreFacts) -> (bool, String) {
    let total = store.db_total_stock;
    let redis_stock = store.redis_stock.unwrap_or(0);
    let left = redis_stock + store.pending_qty + store.transfer_qty + store.units_sold;
    let ok = store.redis_stock.is_some()
        && left == total
        && store.db_remaining_stock == total - store.units_sold;
    // A sale with one bucket never transfers: its sum keeps to the three terms.
    let transfers = if store.buckets.len() > 1 || store.transfer_qty != 0 {
        format!(" + in transfer {}", store.transfer_qty)
    } else {
        String::new()
    };
    let sum = format!(
        "redis {} + pending {}{transfers} + confirmed {} = {} (total {}); DB remaining {} = total - confirmed {}",
        store
            .redis_stock
            .map_or_else(|| "missing".to_string(), |s| s.to_string()),
        store.pending_qty,
        store.units_sold,
        left,
        total,
        store.db_remaining_stock,
        total - store.units_sold
    );
    (ok, sum)
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
    sale: &Sale,
    accepted: u64,
    timeout: Duration,
) -> anyhow::Result<bool> {
    let deadline = Instant::now() + timeout;
    let mut last = -1_i64;
    let mut stable_since = Instant::now();
    loop {
        let snaps = buckets::snapshots(redis, sale.id, sale.buckets).await?;
        // Every status counts: the row is the request's decided fate.
        let settled = order::tally(pool, sale.id).await?.rows;
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

/// Reads the sale's outcome back from PostgreSQL and Redis, every bucket of it.
pub async fn facts(pool: &PgPool, redis: &Redis, id: i64) -> anyhow::Result<StoreFacts> {
    let t = order::tally(pool, id).await?;
    let a = activity::get(pool, id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("activity {id} does not exist"))?;
    let snaps = buckets::snapshots(redis, id, a.bucket_count()).await?;
    let owners = slot_owners(redis).await;
    let all_loaded = snaps.iter().all(|(_, s)| s.stock.is_some());
    Ok(StoreFacts {
        orders: t.live,
        units_sold: t.live_units,
        failed_orders: t.failed,
        duplicate_users: t.users_with_two_live,
        db_total_stock: a.total_stock,
        db_remaining_stock: a.remaining_stock,
        redis_stock: all_loaded.then(|| snaps.iter().filter_map(|(_, s)| s.stock).sum()),
        redis_participants: snaps.iter().map(|(_, s)| s.participants).sum(),
        pending_qty: snaps.iter().map(|(_, s)| s.pending_quantity()).sum(),
        pending_count: snaps.iter().map(|(_, s)| s.pending_count()).sum(),
        transfer_qty: snaps.iter().map(|(_, s)| s.transfer_quantity()).sum(),
        redis_nodes: owners.masters(),
        buckets: snaps
            .iter()
            .map(|(b, s)| bucket_facts(*b, s, &owners))
            .collect(),
    })
}

fn bucket_facts(bucket: StockBucket, snap: &Snapshot, owners: &SlotOwners) -> BucketFacts {
    let tag = bucket.tag();
    let slot = keys::slot(&tag);
    BucketFacts {
        index: bucket.index,
        node: owners.of(slot),
        tag,
        slot,
        stock: snap.stock,
        participants: snap.participants,
    }
}

/// Which master serves each slot range of a cluster (`CLUSTER SLOTS`, answered by any node):
/// `(first slot, last slot, host:port)`. Empty on a standalone Redis, which refuses the command.
struct SlotOwners(Vec<(u32, u32, String)>);

impl SlotOwners {
    fn of(&self, slot: u32) -> Option<String> {
        self.0
            .iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
            .map(|(_, _, node)| node.clone())
    }

    /// Each master once, in address order.
    fn masters(&self) -> Vec<String> {
        let nodes: std::collections::BTreeSet<&String> = self.0.iter().map(|(_, _, n)| n).collect();
        nodes.into_iter().cloned().collect()
    }
}

async fn slot_owners(redis: &Redis) -> SlotOwners {
    use redis::Value;
    let Ok(Value::Array(ranges)) = redis.cmd::<Value>(redis::cmd("CLUSTER").arg("SLOTS")).await
    else {
        return SlotOwners(Vec::new());
    };
    // Each range: [first, last, [host, port, id, ...] of the master, then its replicas].
    let owner = |range: &Value| {
        let Value::Array(range) = range else {
            return None;
        };
        let (Some(Value::Int(lo)), Some(Value::Int(hi)), Some(Value::Array(master))) =
            (range.first(), range.get(1), range.get(2))
        else {
            return None;
        };
        let (Some(Value::BulkString(host)), Some(Value::Int(port))) =
            (master.first(), master.get(1))
        else {
            return None;
        };
        let node = format!("{}:{port}", String::from_utf8_lossy(host));
        Some((u32::try_from(*lo).ok()?, u32::try_from(*hi).ok()?, node))
    };
    SlotOwners(ranges.iter().filter_map(owner).collect())
}

#[cfg(test)]
mod tests;
