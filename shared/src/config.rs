//! Settings, read once per cold start from conventional environment variables.
//!
//! Every value has a local default matching `scripts/env.sh`, so `cargo test` and `make serve`
//! work with no configuration; in AWS the SAM template sets them.

use std::time::Duration;

/// Where Redis is: one server, or the seed nodes of a cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisTopology {
    Standalone(String),
    Cluster(Vec<String>),
}

/// Everything a function needs to know about its surroundings.
#[derive(Clone, Debug)]
pub struct Config {
    pub database_url: String,
    pub redis: RedisTopology,
    /// Prefix of every Redis key (`<prefix>:{<activityId>}:stock`); tests use a fresh one.
    pub key_prefix: String,
    pub order_queue_url: String,
    /// Bound on one Redis call; past it the caller answers 503 instead of hanging.
    pub redis_timeout: Duration,
    /// Bound on one SQS send; past it the reservation is compensated and the caller gets 503.
    pub sqs_timeout: Duration,
    /// How long a container answers `sold_out` from memory after Redis said so.
    pub sold_out_cache_ttl: Duration,
    /// Connections per container; `MaximumConcurrency × this` is what the database sees.
    pub db_max_connections: u32,
    pub db_acquire_timeout: Duration,
    /// Preheat loads activities starting within this lead time.
    pub preheat_lead: Duration,
    /// Redis keys expire this long after the sale ends.
    pub expiry_buffer: Duration,
    /// Ledger entries older than this with no order are compensated by reconcile.
    pub reconcile_grace: Duration,
    /// Confirmed orders not paid within this are cancelled by reconcile.
    pub payment_timeout: Duration,
    /// Lease of the admin lock; the watchdog renews it every third of it.
    pub lock_ttl: Duration,
    /// How long an admin waits for the lock before answering 409 `busy`.
    pub lock_wait: Duration,
}

fn var(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| default.to_string())
}

fn number(name: &str, default: u64) -> anyhow::Result<u64> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("{name} must be a non-negative integer, got {v:?}")),
        _ => Ok(default),
    }
}

impl Config {
    /// Reads the environment. Fails on a malformed number rather than guessing.
    pub fn from_env() -> anyhow::Result<Self> {
        let redis_url = var("REDIS_URL", "redis://127.0.0.1:6379");
        let nodes: Vec<String> = redis_url
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        let cluster = var("REDIS_CLUSTER", "false");
        let redis = if nodes.len() > 1 || matches!(cluster.as_str(), "1" | "true" | "yes") {
            RedisTopology::Cluster(nodes)
        } else {
            RedisTopology::Standalone(redis_url)
        };
        Ok(Self {
            database_url: var("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/seckill"),
            redis,
            key_prefix: var("SECKILL_KEY_PREFIX", "seckill"),
            order_queue_url: var(
                "ORDER_QUEUE_URL",
                "http://127.0.0.1:4566/123456789012/seckill-orders",
            ),
            redis_timeout: Duration::from_millis(number("REDIS_TIMEOUT_MS", 300)?),
            sqs_timeout: Duration::from_millis(number("SQS_TIMEOUT_MS", 2000)?),
            sold_out_cache_ttl: Duration::from_millis(number("SOLD_OUT_CACHE_MS", 1000)?),
            db_max_connections: number("DB_MAX_CONNECTIONS", 4)? as u32,
            db_acquire_timeout: Duration::from_millis(number("DB_ACQUIRE_TIMEOUT_MS", 3000)?),
            preheat_lead: Duration::from_secs(number("PREHEAT_LEAD_SECS", 3600)?),
            expiry_buffer: Duration::from_secs(number("KEY_EXPIRY_BUFFER_SECS", 7200)?),
            reconcile_grace: Duration::from_secs(number("RECONCILE_GRACE_SECS", 300)?),
            payment_timeout: Duration::from_secs(number("PAYMENT_TIMEOUT_SECS", 900)?),
            lock_ttl: Duration::from_millis(number("LOCK_TTL_MS", 5000)?),
            lock_wait: Duration::from_millis(number("LOCK_WAIT_MS", 2000)?),
        })
    }

    /// What a Lambda `main.rs` calls once per cold start: [`Config::from_env`], then the
    /// database and Redis credentials from Secrets Manager when `DATABASE_SECRET_ARN` /
    /// `REDIS_AUTH_SECRET_ARN` are set (see [`crate::secrets`]). Without them it is exactly
    /// `from_env` and makes no AWS call.
    pub async fn load() -> anyhow::Result<Self> {
        let mut config = Self::from_env()?;
        crate::secrets::resolve(&mut config).await?;
        Ok(config)
    }
}
