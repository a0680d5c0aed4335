//! `make demo`: a live flash sale through the local stack, with a report and a chart.
//!
//! Exits non-zero when the sale came out wrong (oversell, a user with two orders, or stock that
//! does not add up), so the demo doubles as a smoke test.

use clap::{CommandFactory, Parser};
use seckill_loadgen::demo::{self, DemoOptions};
use seckill_shared::domain::settings::MAX_BUCKETS;
use seckill_shared::domain::settings::{Admission, MAX_DRAW_WINDOW_MS};
use seckill_shared::infra::config::RedisTopology;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

/// Runs a flash sale end to end against the local stack and reports what happened.
#[derive(Parser, Debug)]
#[command(name = "seckill-demo", version, about)]
// The entry function's SQS send: generous here, since moto is slow under a crowd.
#[command(mut_arg("sqs_timeout", |a| a.default_value("15000")))]
struct Args {
    /// Units on sale.
    #[arg(long, default_value_t = 500)]
    stock: i64,
    /// Units one user may buy (per order; one order per user).
    #[arg(long, default_value_t = 1)]
    per_user: i64,
    /// Stock buckets the sale's Redis stock is split over (on a cluster, over its nodes).
    #[arg(long, default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_BUCKETS)))]
    buckets: u32,
    /// How the sale admits buyers: `fcfs` (first come, first served) or `draw` (purchases in
    /// the first --draw-window-ms are queued, the winners drawn at random when it closes; needs
    /// --buckets 1).
    #[arg(long, default_value = "fcfs", value_parser = parse_admission)]
    admission: Admission,
    /// A draw sale's window after the opening, in milliseconds (with --admission draw).
    #[arg(long, default_value_t = 2_000,
          value_parser = clap::value_parser!(u64).range(1..=MAX_DRAW_WINDOW_MS as u64))]
    draw_window_ms: u64,
    /// Run on the local Redis Cluster (the nodes of REDIS_CLUSTER_URLS) instead of REDIS_URL.
    // Its own id: the config's `--redis-cluster` already holds the id `cluster`.
    #[arg(long = "cluster")]
    on_cluster: bool,
    /// The cluster's seed nodes, comma-separated (used with --cluster).
    #[arg(
        long,
        env = "REDIS_CLUSTER_URLS",
        value_name = "REDIS_CLUSTER_URLS",
        hide_env_values = true
    )]
    cluster_urls: Option<String>,
    /// Distinct users in the crowd.
    #[arg(long, default_value_t = 5_000)]
    users: usize,
    /// Purchase requests the crowd sends (users repeat).
    #[arg(long, default_value_t = 20_000)]
    requests: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    /// Seconds from creating the activity to its window opening.
    #[arg(long, default_value_t = 3.0)]
    opens_in_secs: f64,
    /// Milliseconds before the opening that the crowd starts (early requests: not_started).
    #[arg(long, default_value_t = 150)]
    early_ms: u64,
    /// Share of bad requests (malformed body, bad quantity, no token).
    #[arg(long, default_value_t = 0.01)]
    bad_ratio: f64,
    /// Seed of the crowd's randomness.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Give up waiting for the queue to drain after this many seconds.
    #[arg(long, default_value_t = 180)]
    drain_timeout_secs: u64,
    /// Where report.json and chart.png go (default: target/demo).
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// No progress bar and no step lines; the report is still printed.
    #[arg(long)]
    quiet: bool,
    #[arg(long, env = "SECKILL_JWT_SECRET", hide_env_values = true)]
    jwt_secret: String,
    #[command(flatten)]
    config: seckill_shared::Config,
}

fn main() -> anyhow::Result<()> {
    // The server's logs would tear through the progress bar: warnings only, unless asked.
    // (Its EMF metric lines go to stdout only inside Lambda; here they are debug tracing events.)
    if std::env::var_os("RUST_LOG").is_none() && std::env::var_os("LOG_LEVEL").is_none() {
        std::env::set_var("LOG_LEVEL", "warn");
    }
    seckill_shared::infra::telemetry::init();
    let mut args = Args::parse();
    anyhow::ensure!(
        args.stock > 0 && args.users > 0 && args.requests > 0 && args.concurrency > 0,
        "stock, users, requests and concurrency must be positive"
    );
    if args.on_cluster {
        let urls = args.cluster_urls.as_deref().ok_or_else(|| {
            anyhow::anyhow!("--cluster needs REDIS_CLUSTER_URLS (scripts/env.sh sets it)")
        })?;
        // The topology the functions' config reads from REDIS_URL, given the cluster's nodes.
        args.config.redis = RedisTopology::from_urls(urls, true);
    }
    let opts = DemoOptions {
        stock: args.stock,
        per_order_limit: args.per_user,
        buckets: args.buckets,
        admission: args.admission,
        draw_window: Duration::from_millis(args.draw_window_ms),
        users: args.users,
        requests: args.requests,
        concurrency: args.concurrency,
        opens_in: Duration::from_secs_f64(args.opens_in_secs.max(0.5)),
        early: Duration::from_millis(args.early_ms),
        bad_ratio: args.bad_ratio,
        seed: args.seed,
        jwt_secret: args.jwt_secret,
        out_dir: args
            .out_dir
            .unwrap_or_else(seckill_loadgen::default_out_dir),
        drain_timeout: Duration::from_secs(args.drain_timeout_secs),
        sqs_timeout: args.config.sqs_timeout,
        quiet: args.quiet || !std::io::stdout().is_terminal(),
        config: args.config,
    };
    // A usage error, like clap's own: the message and exit code 2, no backtrace.
    if let Err(e) = opts.check() {
        Args::command()
            .error(clap::error::ErrorKind::ArgumentConflict, e)
            .exit();
    }
    let report = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(demo::run(opts))?;
    print!("{}", report.text());
    println!("report          {}", report_path(&report));
    if !report.ok() {
        eprintln!("the sale did NOT come out right (see above)");
        std::process::exit(1);
    }
    Ok(())
}

fn parse_admission(s: &str) -> Result<Admission, String> {
    Admission::parse(s).ok_or_else(|| format!("expected fcfs or draw, got {s:?}"))
}

fn report_path(report: &demo::DemoReport) -> String {
    std::path::Path::new(&report.chart)
        .parent()
        .map(|d| d.join("report.json").display().to_string())
        .unwrap_or_else(|| "target/demo/report.json".into())
}
