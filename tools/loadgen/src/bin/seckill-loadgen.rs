//! `seckill-loadgen`: fires a crowd of purchase requests at a running server (`make serve`)
//! and prints what came back, as a table and optionally as JSON.

use clap::Parser;
use seckill_loadgen::load::{self, CrowdSpec, Plan, RunOptions};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

/// Concurrent purchase requests with JWTs against one activity.
#[derive(Parser, Debug)]
#[command(name = "seckill-loadgen", version, about)]
struct Args {
    /// Base URL of the server.
    #[arg(long, default_value = "http://127.0.0.1:3000")]
    url: String,
    /// The activity to buy from.
    #[arg(long)]
    activity: i64,
    #[arg(long, default_value_t = 1_000)]
    users: usize,
    #[arg(long, default_value_t = 10_000)]
    requests: usize,
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Units per request.
    #[arg(long, default_value_t = 1)]
    quantity: i64,
    /// Share of deliberately bad requests (0-1).
    #[arg(long, default_value_t = 0.0)]
    bad_ratio: f64,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Prefix of the user ids the tokens are minted for.
    #[arg(long, default_value = "load-user")]
    user_prefix: String,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 30)]
    timeout_secs: u64,
    /// Also write the result as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    #[arg(long, env = "SECKILL_JWT_SECRET", hide_env_values = true)]
    jwt_secret: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let plan = Plan::crowd(&CrowdSpec {
        activity_id: args.activity,
        users: args.users,
        requests: args.requests,
        quantity: args.quantity,
        bad_ratio: args.bad_ratio,
        seed: args.seed,
        secret: args.jwt_secret.clone(),
        user_prefix: args.user_prefix.clone(),
    })?;
    let report = load::run(
        &plan,
        &RunOptions {
            base_url: args.url.trim_end_matches('/').to_string(),
            concurrency: args.concurrency,
            timeout: Duration::from_secs(args.timeout_secs),
            quiet: args.quiet || !std::io::stdout().is_terminal(),
        },
    )
    .await?;
    print!("{}", report.table());
    if let Some(path) = args.json {
        std::fs::write(&path, serde_json::to_vec_pretty(&report)?)?;
        println!("json          {}", path.display());
    }
    Ok(())
}
