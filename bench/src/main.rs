//! `make bench` (`cargo run --release -p seckill-bench -- [--quick]`): stock-deduction
//! strategies (Lua script, HINCRBY with compensation, lock, database only), measured side by
//! side in one run on the real local Redis, PostgreSQL and SQS emulator, plus one hot sale
//! with its stock in buckets on the 3-node Redis Cluster, the entry handler's cost, the
//! sold-out cache, accepted purchases with their SQS send, the order consumer, Redis memory
//! per participant and the Lambda binaries. Prints one table (stdout), progress on stderr,
//! and writes `RESULTS.md` and `results.json` (to `bench/` for a full run, `target/bench/`
//! for `--quick`).
//!
//! Benchmarks print figures; nothing here asserts a timing.
//!
//! # Layout
//! - [`util`]: the bounded concurrent loop, hdrhistogram, INFO commandstats, stock sampler.
//! - [`strategies`]: lua / hincrby / lock / db-only / limit under two workloads, kill runs.
//! - [`scripts`]: the widely copied purchase scripts and ours by EVALSHA, server µs per call.
//! - [`buckets`]: one hot sale in 1, 3 and 8 stock buckets on the cluster, per-node share of
//!   the script calls, commands per attempt, undersell.
//! - [`entry`]: the entry router in-process and over HTTP, sold-out flood, public view,
//!   accepted + SQS.
//! - [`costs`]: what each candidate on the entry's refusal path costs, before and after.
//! - [`alloc`]: the counting allocator the costs section reads.
//! - [`consumer`]: `Consumer::handle_batch` against one transaction per order.
//! - [`polls`]: `GET …/orders/me` with a million orders in the table.
//! - [`memory`]: `MEMORY USAGE` of the user set and ledger per participant.
//! - [`binaries`]: release binary sizes and time to ready.
//! - [`report`]: the table, RESULTS.md and results.json.

mod alloc;
mod binaries;
mod buckets;
mod consumer;
mod costs;
mod draw;
mod entry;
mod memory;
mod polls;
mod reconcile;
mod report;
mod results;
mod scripts;
mod strategies;
mod util;

use results::{Results, Sizes};
use std::path::PathBuf;
use std::sync::Arc;

/// Counts allocations per thread for the costs section (mimalloc underneath, as in the functions).
#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

/// Command-line options.
#[derive(clap::Parser, Debug, Clone)]
#[command(
    name = "seckill-bench",
    about = "Stock-deduction strategies and the functions' costs, measured"
)]
pub struct Args {
    /// A ~30 s smoke run with small sizes (writes to target/bench/ unless --out is given).
    #[arg(long)]
    pub quick: bool,
    /// Attempts per strategy and workload (default 20000; 3000 with --quick).
    #[arg(long)]
    pub attempts: Option<usize>,
    /// Concurrent tasks for the strategies, the buckets section and the entry loops.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Sections to run (comma-separated):
    /// strategies,scripts,buckets,entry,consumer,polls,draw,reconcile,memory,binaries.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "strategies,scripts,buckets,entry,consumer,polls,draw,reconcile,memory,binaries"
    )]
    pub sections: Vec<String>,
    /// Where RESULTS.md and results.json go.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The settings, listed by `--help` and checked at start. Each section builds its own
    /// configs from the environment (`testkit::config`), so they are read from the variables
    /// only: [`parse_args`] refuses them as flags rather than ignore them.
    #[command(flatten)]
    pub settings: seckill_shared::Config,
}

/// [`Args`] from the command line and the environment; a [`seckill_shared::Config`] setting
/// given as a flag is an error naming its variable.
fn parse_args() -> Args {
    use clap::parser::ValueSource;
    use clap::{CommandFactory, FromArgMatches};
    let matches = Args::command().get_matches();
    let config = seckill_shared::Config::command();
    let flagged = config
        .get_arguments()
        .find(|a| matches.value_source(a.get_id().as_str()) == Some(ValueSource::CommandLine));
    if let Some(arg) = flagged {
        let var = arg
            .get_env()
            .map(|v| v.to_string_lossy())
            .unwrap_or_default();
        Args::command()
            .error(
                clap::error::ErrorKind::ArgumentConflict,
                format!("seckill-bench reads this setting from {var} only"),
            )
            .exit();
    }
    Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

fn main() -> anyhow::Result<()> {
    // The local defaults of scripts/env.sh, for a run outside `make` (never AWS itself).
    for (k, v) in [
        ("AWS_REGION", "us-east-1"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_ENDPOINT_URL_SQS", "http://127.0.0.1:4566"),
    ] {
        if std::env::var_os(k).is_none() {
            std::env::set_var(k, v);
        }
    }
    // Log lines are formatted as in Lambda (JSON, info) and thrown away: their cost is real,
    // their output would drown the table.
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            std::env::var("LOG_LEVEL").unwrap_or_else(|_| "info".into()),
        ))
        .with_writer(std::io::sink)
        .try_init();
    let args = parse_args();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let sizes = Sizes::new(args.quick, args.attempts, args.concurrency);
    let started = chrono::Utc::now();
    let wall = std::time::Instant::now();
    let machine = report::Machine::probe().await;
    eprintln!(
        "seckill-bench: {} cores, load {}, sizes {:?}",
        machine.nproc, machine.load_start, sizes
    );
    let mut stores = Stores::set_up(&sizes).await?;

    // The functions write their metrics (EMF lines) to stdout, as in Lambda; while measuring,
    // stdout goes to /dev/null (the write still happens) so only the table reaches it.
    let quiet = QuietStdout::new();
    let outcome = measure(&args, &sizes, &mut stores).await;
    drop(quiet);
    let clients_at_start = stores.tear_down().await;
    let results = outcome?;

    let machine = machine
        .finish(started, wall.elapsed(), clients_at_start)
        .await;
    let doc = report::Document::new(machine, sizes, results);
    println!("{}", doc.table());
    write(&args, &doc)
}

/// What every section measures against: Redis, the run's own fresh database, the users.
struct Stores {
    client: redis::Client,
    admin: redis::aio::MultiplexedConnection,
    clients_at_start: (Option<i64>, String),
    database_url: String,
    pool: sqlx::PgPool,
    users: Arc<Vec<String>>,
}

impl Stores {
    async fn set_up(sizes: &Sizes) -> anyhow::Result<Self> {
        let redis_url =
            std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
        let client = redis::Client::open(redis_url.as_str())?;
        let mut admin = client.get_multiplexed_async_connection().await?;
        // Setup, INFO and MEMORY USAGE of a 1M-member key can take a while on a busy machine.
        admin.set_response_timeout(std::time::Duration::from_secs(120));
        let clients_at_start = report::redis_clients(&mut admin).await;
        eprintln!("creating a fresh database ...");
        let (database_url, pool) = testkit::fresh_database().await?;
        let user_count = sizes
            .attempts
            .max(sizes.sqs_sends)
            .max(sizes.consumer_orders)
            .max(10_000);
        let users: Arc<Vec<String>> =
            Arc::new((0..user_count).map(|i| format!("user-{i:07}")).collect());
        Ok(Self {
            client,
            admin,
            clients_at_start,
            database_url,
            pool,
            users,
        })
    }

    /// Closes the pool and drops the run's database; answers Redis's figures from the start.
    async fn tear_down(self) -> (Option<i64>, String) {
        self.pool.close().await;
        if let Err(e) = util::drop_database(&self.database_url).await {
            eprintln!("could not drop the bench database: {e:#}");
        }
        self.clients_at_start
    }
}

/// Runs the sections asked for, in a fixed order.
async fn measure(args: &Args, sizes: &Sizes, stores: &mut Stores) -> anyhow::Result<Results> {
    let want = |s: &str| args.sections.iter().any(|x| x == s);
    let mut results = Results::default();
    if want("strategies") {
        results.rows = measure_strategies(sizes, stores).await?;
    }
    if want("scripts") {
        eprintln!(
            "== purchase scripts side by side ({} tasks, EVALSHA)",
            sizes.concurrency
        );
        results.scripts = scripts::run(
            &stores.client,
            &stores.admin,
            stores.users.clone(),
            sizes.attempts,
            sizes.concurrency,
        )
        .await?;
    }
    if want("buckets") {
        results.buckets = measure_buckets(sizes, stores).await?;
    }
    if want("entry") {
        results.entry = Some(measure_entry(sizes, stores).await?);
    }
    if want("consumer") {
        results.consumer = Some(measure_consumer(sizes, stores).await?);
    }
    if want("polls") {
        eprintln!(
            "== order polling ({} orders in the table, {} polls, {} tasks)",
            sizes.poll_orders, sizes.polls, sizes.db_pool
        );
        let poll_sizes = polls::Sizes {
            orders: sizes.poll_orders,
            polls: sizes.polls,
            concurrency: sizes.db_pool as usize,
        };
        results.polls = Some(polls::run(&stores.database_url, &poll_sizes).await?);
    }
    if want("draw") {
        eprintln!(
            "== the draw at {:?} entrants ({} units; the whole-pool draw beside it up to {})",
            sizes.draw_entrants,
            draw::STOCK,
            sizes.draw_baseline_max
        );
        results.draw = draw::run(
            &stores.client,
            &stores.database_url,
            &stores.pool,
            &draw::Sizes {
                entrants: sizes.draw_entrants.clone(),
                baseline_max: sizes.draw_baseline_max,
                concurrency: sizes.concurrency,
            },
        )
        .await?;
    }
    if want("reconcile") {
        eprintln!(
            "== reconcile over a ledger of {} reservations, half of them stale",
            sizes.reconcile_ledger
        );
        results.reconcile = reconcile::run(
            &stores.client,
            &reconcile::Sizes {
                ledger: sizes.reconcile_ledger,
                concurrency: sizes.concurrency,
            },
        )
        .await?;
    }
    if want("memory") {
        results.memory = measure_memory(sizes, &mut stores.admin).await;
    }
    if want("binaries") {
        results.binaries = measure_binaries(sizes).await;
    }
    Ok(results)
}

async fn measure_strategies(
    sizes: &Sizes,
    stores: &Stores,
) -> anyhow::Result<Vec<strategies::Row>> {
    eprintln!(
        "== strategies ({} tasks, one ConnectionManager)",
        sizes.concurrency
    );
    let Stores {
        client,
        admin,
        pool,
        database_url,
        users,
        ..
    } = stores;
    let mut env = strategies::Env {
        client: client.clone(),
        admin: admin.clone(),
        pool: pool.clone(),
        database_url: database_url.clone(),
        users: users.clone(),
        concurrency: sizes.concurrency,
        db_pool_size: sizes.db_pool,
    };
    let mut rows = Vec::new();
    for wl in [
        strategies::Workload::success_heavy(sizes.attempts),
        strategies::Workload::failure_heavy(sizes.attempts),
    ] {
        rows.extend(strategies::run_workload(&mut env, wl, sizes.kill_attempts).await?);
    }
    Ok(rows)
}

async fn measure_buckets(
    sizes: &Sizes,
    stores: &Stores,
) -> anyhow::Result<Vec<buckets::BucketRow>> {
    eprintln!(
        "== stock buckets on the cluster ({} tasks, one cluster connection)",
        sizes.concurrency
    );
    let bucket_sizes = buckets::Sizes {
        stock: sizes.bucket_stock,
        attempts: sizes.bucket_attempts,
        concurrency: sizes.concurrency,
        counts: sizes.bucket_counts.clone(),
    };
    buckets::run(&stores.database_url, &stores.pool, &bucket_sizes).await
}

async fn measure_entry(sizes: &Sizes, stores: &Stores) -> anyhow::Result<entry::EntryResults> {
    eprintln!("== entry handler");
    entry::run(
        &stores.client,
        &stores.database_url,
        &stores.pool,
        stores.users.clone(),
        &entry::Sizes {
            concurrency: sizes.concurrency,
            rejections: sizes.rejections,
            sold_out: sizes.sold_out,
            http: sizes.http,
            sqs_sends: sizes.sqs_sends,
            sqs_concurrency: sizes.sqs_concurrency,
        },
    )
    .await
}

async fn measure_consumer(
    sizes: &Sizes,
    stores: &Stores,
) -> anyhow::Result<consumer::ConsumerResults> {
    eprintln!(
        "== order consumer ({} orders, {} instances x {} connections, batches of 10)",
        sizes.consumer_orders, sizes.consumer_instances, sizes.consumer_connections
    );
    consumer::run(
        &stores.database_url,
        &stores.pool,
        sizes.consumer_orders,
        sizes.consumer_instances,
        sizes.consumer_connections,
    )
    .await
}

/// A size that fails is reported on stderr and left out; the others still run.
async fn measure_memory(
    sizes: &Sizes,
    admin: &mut redis::aio::MultiplexedConnection,
) -> Vec<memory::MemoryRow> {
    eprintln!("== Redis memory per participant");
    let mut rows = Vec::new();
    for &n in &sizes.memory_users {
        for uuid_ids in [false, true] {
            match memory::measure(admin, n, uuid_ids).await {
                Ok(row) => rows.push(row),
                Err(e) => eprintln!("  ! memory for {n} users failed: {e:#}"),
            }
        }
    }
    rows
}

async fn measure_binaries(sizes: &Sizes) -> Vec<binaries::BinaryRow> {
    eprintln!("== Lambda binaries ({})", binaries::release_dir().display());
    let mut rows = Vec::new();
    for name in binaries::FUNCTIONS {
        rows.push(binaries::measure(name, sizes.init_repeats).await);
    }
    rows
}

/// Writes RESULTS.md and results.json to `--out`, else to `bench/` (`target/bench/` for
/// `--quick`).
fn write(args: &Args, doc: &report::Document) -> anyhow::Result<()> {
    let out = args.out.clone().unwrap_or_else(|| {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        if args.quick {
            root.join("../target/bench")
        } else {
            root.to_path_buf()
        }
    });
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("RESULTS.md"), doc.markdown())?;
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&doc.json())?,
    )?;
    eprintln!(
        "wrote {} and {}",
        out.join("RESULTS.md").display(),
        out.join("results.json").display()
    );
    Ok(())
}

/// Points fd 1 at /dev/null until dropped.
struct QuietStdout {
    saved: Option<libc::c_int>,
}

// Redirecting fd 1 takes libc's fd calls (the workspace denies unsafe code elsewhere).
#[allow(unsafe_code)]
impl QuietStdout {
    fn new() -> Self {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        // SAFETY: plain fd calls on fds this process owns; fd 1 is restored on drop.
        let saved = unsafe {
            let saved = libc::dup(1);
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY);
            if saved < 0 || null < 0 || libc::dup2(null, 1) < 0 {
                None
            } else {
                libc::close(null);
                Some(saved)
            }
        };
        Self { saved }
    }
}

#[allow(unsafe_code)]
impl Drop for QuietStdout {
    fn drop(&mut self) {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        if let Some(fd) = self.saved {
            // SAFETY: `fd` is the duplicate of the original stdout taken in `new`.
            unsafe {
                libc::dup2(fd, 1);
                libc::close(fd);
            }
        }
    }
}
