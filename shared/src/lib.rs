//! The library every seckill function uses.
//!
//! # Layout
//!
//! - [`config`]: the typed settings (clap, each from its environment variable), parsed once.
//! - [`secrets`]: database and Redis credentials from Secrets Manager (AWS only), and URL
//!   redaction for logs.
//! - [`keys`]: the Redis key names of one activity (of one of its stock buckets), each bucket's
//!   keys sharing one hash tag; a user's home bucket.
//! - [`buckets`]: a purchase in a bucketed sale (borrowing from the other buckets when the
//!   home bucket is short), and the reads that add the buckets up.
//! - [`draw`]: a draw sale's draw and the outbox that sends its winners' order messages.
//! - [`scripts`]: every Lua script of `lua/`, compiled in with `include_str!`, run by EVALSHA.
//! - [`cache`]: the Redis connection (standalone or cluster) with bounded timeouts.
//! - [`sale`]: typed wrappers around every script of the sale: purchase, compensation, settle,
//!   cancel, preheat, admin adjust, reconcile's repairs.
//! - [`refusal`]: why a purchase was refused, the one list the script, logs, metrics and HTTP
//!   answers share.
//! - [`giveback`]: the database as the one arbiter of each reservation's fate: whoever gives
//!   units back claims the request id first.
//! - [`load`]: loading a sale into Redis under its fenced lock, rebuilding the user set.
//! - [`lock`]: the per-activity admin lock with an owner-checked release, a watchdog and a
//!   fencing token the database checks.
//! - [`db`]: the PostgreSQL pool and the embedded migrations.
//! - [`deps`]: the config, pool and Redis connection every function's state is built on.
//! - [`activity`], [`order`]: domain types and their database access.
//! - [`lifecycle`]: an order after confirmation: pay, and cancel exactly once (ledger, DB, Redis).
//! - [`queue`]: the SQS order message and its client.
//! - [`auth`]: the caller's identity, read from the API Gateway request context.
//! - [`error`]: the HTTP error enum every API function answers with.
//! - [`http`]: request extractors (bounded JSON body, positive-integer path ids) and the
//!   404 / 405 answers of every router.
//! - [`metrics`]: CloudWatch Embedded Metric Format lines.
//! - [`pause`]: named pause points between protocol steps, for the interleaving tests
//!   (compiled out without the `failpoints` feature).

pub mod activity;
pub mod auth;
pub mod buckets;
pub mod cache;
pub mod config;
pub mod db;
pub mod deps;
pub mod draw;
pub mod error;
pub mod giveback;
pub mod http;
pub mod keys;
pub mod lifecycle;
pub mod load;
pub mod lock;
pub mod metrics;
pub mod order;
pub mod pause;
pub mod queue;
pub mod refusal;
pub mod sale;
pub mod scripts;
pub mod secrets;
#[cfg(feature = "testing")]
pub mod testing;

pub use config::Config;
pub use deps::Deps;
pub use error::ApiError;
pub use refusal::Refusal;

/// Sets up tracing once per process: JSON lines when `AWS_LAMBDA_LOG_FORMAT=JSON` (as Lambda
/// sets it), human-readable text otherwise; the level comes from `RUST_LOG` / `LOG_LEVEL`.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| {
            tracing_subscriber::EnvFilter::try_new(
                std::env::var("LOG_LEVEL").unwrap_or_else(|_| "info".into()),
            )
        })
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let json = std::env::var("AWS_LAMBDA_LOG_FORMAT")
        .map(|v| v.eq_ignore_ascii_case("json"))
        .unwrap_or(false);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    let _ = if json {
        builder.json().with_current_span(false).try_init()
    } else {
        builder.without_time().try_init()
    };
}
