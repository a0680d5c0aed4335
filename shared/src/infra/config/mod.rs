//! Settings, parsed once per process into one typed struct (clap, every field from its
//! environment variable; a command-line flag of the same name wins).
//!
//! # Where values come from
//!
//! - **Where the services are** (`DATABASE_URL`, `REDIS_URL`, `ORDER_QUEUE_URL`) has no default
//!   here: these are required, and parsing fails with a message naming the missing variable. In
//!   AWS the SAM template sets them (the database through `DATABASE_SECRET_ARN` +
//!   `DATABASE_HOST` instead of `DATABASE_URL`, see [`crate::infra::aws_secrets`]), so a
//!   function whose template lost one fails its cold start instead of serving every request
//!   against localhost.
//!   For the local stack, `scripts/env.sh` is the one place that names them; the Makefile sources
//!   it before every recipe, and so must anything else that runs a binary or the tests.
//! - **Tuning** (timeouts, pool size, lead times, key prefix) has its default here, the value
//!   production runs with unless the template overrides it; `--help` shows each one.
//!
//! Durations are parsed once, into [`Duration`], by the unit their variable names
//! (`REDIS_TIMEOUT_MS`, `PREHEAT_LEAD_SECS`). A malformed or blank value is an error, never a
//! silent default.
//!
//! `--help` on every binary lists every setting with its variable and default; the values of
//! variables that may carry a password (`DATABASE_URL`, `REDIS_URL`) are never printed, neither
//! there nor by `Debug` (they are [`SecretUrl`]s).

use crate::infra::aws_secrets::{self, DatabaseSecret};
use crate::infra::db::{self, CaBundle};
use crate::infra::payments::PaymentSettings;
use crate::infra::secret::SecretUrl;
use sqlx::PgPool;
use std::time::Duration;
pub use topology::RedisTopology;
use values::{
    at_least_one, empty_or_non_blank_url, positive_millis, secs, user_db_rate, view_cache_millis,
    whole,
};

mod edge;
mod secret_refs;
#[cfg(test)]
mod tests;
mod topology;
mod values;

pub use edge::{EdgeOrigin, OriginValue};
pub use secret_refs::SecretRefs;
pub use values::{millis, non_blank, MAX_PUBLIC_VIEW_CACHE, USER_DB_RATE_WINDOW};

/// Everything a function needs to know about its surroundings.
#[derive(Clone, Debug, clap::Parser)]
#[command(
    about = "A seckill process. Every setting is read from its environment variable; a flag of the same name wins.",
    long_about = None
)]
pub struct Config {
    /// PostgreSQL URL. Required unless DATABASE_SECRET_ARN names the credentials (as in AWS);
    /// the local stack's is in scripts/env.sh.
    #[arg(
        long = "database-url",
        env = "DATABASE_URL",
        value_name = "DATABASE_URL",
        value_parser = empty_or_non_blank_url,
        required_unless_present = "database_secret_arn",
        default_value = "",
        hide_default_value = true,
        hide_env_values = true
    )]
    pub database_url: SecretUrl,
    #[command(flatten)]
    pub redis: RedisTopology,
    /// Prefix of every Redis key (`<prefix>:{<activityId>}:meta`); tests use a fresh one.
    #[arg(
        long = "key-prefix",
        env = "SECKILL_KEY_PREFIX",
        value_name = "SECKILL_KEY_PREFIX",
        value_parser = non_blank,
        default_value = "seckill"
    )]
    pub key_prefix: String,
    /// SQS queue URL of accepted reservations. Required; the local stack's is in scripts/env.sh.
    #[arg(
        long = "order-queue-url",
        env = "ORDER_QUEUE_URL",
        value_name = "ORDER_QUEUE_URL",
        value_parser = non_blank
    )]
    pub order_queue_url: String,
    /// SQS URL of the order queue's dead-letter queue: the operator page shows its depth
    /// (unset: not shown).
    #[arg(
        long = "order-dlq-url",
        env = "ORDER_DLQ_URL",
        value_name = "ORDER_DLQ_URL",
        value_parser = non_blank
    )]
    pub order_dlq_url: Option<String>,
    /// SQS queue URL of the draw entries (each answered 202 `queued`; the consumer keeps them):
    /// a queue of their own, so that orders never wait behind a crowd's entries and a draw
    /// rebuilt after a loss waits for entries only ([`Config::entry_queue`]). It redrives into
    /// the order queue's dead-letter queue. Unset: the entries share the order queue.
    #[arg(
        long = "entry-queue-url",
        env = "ENTRY_QUEUE_URL",
        value_name = "ENTRY_QUEUE_URL",
        value_parser = non_blank
    )]
    pub entry_queue_url: Option<String>,
    /// Bound on one Redis call; past it the caller answers 503 instead of hanging.
    #[arg(long = "redis-timeout-ms", env = "REDIS_TIMEOUT_MS", value_name = "REDIS_TIMEOUT_MS",
          value_parser = millis, default_value = "300")]
    pub redis_timeout: Duration,
    /// Bound on one SQS send; past it the reservation is compensated and the caller gets 503.
    #[arg(long = "sqs-timeout-ms", env = "SQS_TIMEOUT_MS", value_name = "SQS_TIMEOUT_MS",
          value_parser = millis, default_value = "2000")]
    pub sqs_timeout: Duration,
    /// How long a container answers `sold_out` from memory after Redis said so.
    #[arg(long = "sold-out-cache-ms", env = "SOLD_OUT_CACHE_MS", value_name = "SOLD_OUT_CACHE_MS",
          value_parser = millis, default_value = "1000")]
    pub sold_out_cache_ttl: Duration,
    /// How long a container reuses its answer to `GET /activities/{id}` (0 = not at all).
    /// At most 250: a view older than that would lag the purchases by more than a click.
    #[arg(long = "public-view-cache-ms", env = "PUBLIC_VIEW_CACHE_MS",
          value_name = "PUBLIC_VIEW_CACHE_MS", value_parser = view_cache_millis,
          default_value = "250")]
    pub public_view_cache_ttl: Duration,
    /// Requests per second one user may send the entry's routes that reach the database (the
    /// order status when Redis holds nothing of theirs, pay, cancel, a purchase of a sale Redis
    /// does not hold), counted in Redis over windows of [`USER_DB_RATE_WINDOW`], so a burst of
    /// twice this passes; past it 429 `rate_limited`. At most 1000; 0 turns the limit off.
    #[arg(long = "user-db-rate-per-sec", env = "USER_DB_RATE_PER_SEC",
          value_name = "USER_DB_RATE_PER_SEC", value_parser = user_db_rate, default_value = "5")]
    pub user_db_rate_per_sec: u32,
    /// Connections per container; `MaximumConcurrency × this` is what the database sees.
    #[arg(long = "db-max-connections", env = "DB_MAX_CONNECTIONS", value_name = "DB_MAX_CONNECTIONS",
          value_parser = whole::<u32>, default_value = "4")]
    pub db_max_connections: u32,
    /// How long a query waits for a pooled connection.
    #[arg(long = "db-acquire-timeout-ms", env = "DB_ACQUIRE_TIMEOUT_MS",
          value_name = "DB_ACQUIRE_TIMEOUT_MS", value_parser = millis, default_value = "3000")]
    pub db_acquire_timeout: Duration,
    /// Preheat loads activities starting within this lead time.
    #[arg(long = "preheat-lead-secs", env = "PREHEAT_LEAD_SECS", value_name = "PREHEAT_LEAD_SECS",
          value_parser = secs, default_value = "3600")]
    pub preheat_lead: Duration,
    /// Redis keys expire this long after the sale ends.
    #[arg(long = "key-expiry-buffer-secs", env = "KEY_EXPIRY_BUFFER_SECS",
          value_name = "KEY_EXPIRY_BUFFER_SECS", value_parser = secs, default_value = "7200")]
    pub expiry_buffer: Duration,
    /// Ledger entries older than this with no order are compensated by reconcile.
    #[arg(long = "reconcile-grace-secs", env = "RECONCILE_GRACE_SECS",
          value_name = "RECONCILE_GRACE_SECS", value_parser = secs, default_value = "300")]
    pub reconcile_grace: Duration,
    /// After a draw sale was loaded from scratch, how long past the window's close the draw
    /// may wait for the entries still on the order queue (answered 202, not yet written back
    /// into the pool); an entry written after the draw ran reads `entered_late`.
    #[arg(long = "draw-entry-wait-secs", env = "DRAW_ENTRY_WAIT_SECS",
          value_name = "DRAW_ENTRY_WAIT_SECS", value_parser = secs, default_value = "300")]
    pub draw_entry_wait: Duration,
    /// How long one reconcile run spends, counted from the invocation's start (and ending
    /// before the invocation's deadline less a margin, whatever this says): the release of
    /// unpaid orders takes up to a quarter, the due sales an even share each of what is left
    /// (at least 1 s, or the whole budget when it is shorter), and the sales past it are
    /// checked first by the next run. Below the function's Timeout (60 s).
    #[arg(long = "reconcile-budget-ms", env = "RECONCILE_BUDGET_MS",
          value_name = "RECONCILE_BUDGET_MS", value_parser = positive_millis, default_value = "40000")]
    pub reconcile_budget: Duration,
    /// Confirmed orders not paid within this are cancelled by reconcile.
    #[arg(long = "payment-timeout-secs", env = "PAYMENT_TIMEOUT_SECS",
          value_name = "PAYMENT_TIMEOUT_SECS", value_parser = secs, default_value = "900")]
    pub payment_timeout: Duration,
    /// Unpaid orders the payment timeout releases per reconcile run at most; the next run goes
    /// on where this one stopped.
    #[arg(long = "release-batch", env = "RELEASE_BATCH", value_name = "RELEASE_BATCH",
          value_parser = at_least_one, default_value = "500")]
    pub release_batch: i64,
    /// Lease of the admin lock; the watchdog renews it every third of it.
    #[arg(long = "lock-ttl-ms", env = "LOCK_TTL_MS", value_name = "LOCK_TTL_MS",
          value_parser = millis, default_value = "5000")]
    pub lock_ttl: Duration,
    /// How long an admin waits for the lock before answering 409 `busy`.
    #[arg(long = "lock-wait-ms", env = "LOCK_WAIT_MS", value_name = "LOCK_WAIT_MS",
          value_parser = millis, default_value = "2000")]
    pub lock_wait: Duration,
    /// Which CA certificates the database's TLS certificate must chain to.
    #[command(flatten)]
    pub database_ca: CaBundle,
    /// Which Secrets Manager secrets hold the connection credentials (AWS only).
    #[command(flatten)]
    pub secrets: SecretRefs,
    /// The payment provider and its webhook's secret.
    #[command(flatten)]
    pub payments: PaymentSettings,
    /// The origin secret CloudFront sends (the edge on): requests without it are refused.
    #[command(flatten)]
    pub edge_origin: EdgeOrigin,
    /// Redis logged in as the script loader, for the processes that load the scripts
    /// (preheat, seckill-migrate, the local dev server); `None`: this process loads none.
    #[arg(skip)]
    pub redis_loader: Option<RedisTopology>,
}

impl Config {
    /// The queue the draw entries go on: their own, or the order queue when none is set.
    pub fn entry_queue(&self) -> &str {
        self.entry_queue_url
            .as_deref()
            .unwrap_or(&self.order_queue_url)
    }

    /// The environment alone (no command line): what tests and tools that parse their own
    /// arguments call. Fails on a missing required variable or a malformed value, naming it.
    pub fn from_env() -> anyhow::Result<Self> {
        use clap::Parser;
        Self::try_parse_from(["seckill"])
            .map_err(|e| anyhow::anyhow!("{}", e.render()))?
            .check()
    }

    /// What clap cannot say: a blank secret reference is no reference
    /// ([`SecretRefs::drop_blank`]), and the database URL was given, or a secret supplies it.
    pub fn check(mut self) -> anyhow::Result<Self> {
        self.secrets.drop_blank();
        self.secrets.check()?;
        self.payments.drop_blank();
        self.payments.check()?;
        if self
            .edge_origin
            .secret_arn
            .as_deref()
            .is_some_and(|v| v.trim().is_empty())
        {
            self.edge_origin.secret_arn = None;
        }
        anyhow::ensure!(
            !self.database_url.is_empty() || self.secrets.database_secret_arn.is_some(),
            "DATABASE_URL is empty and DATABASE_SECRET_ARN is not set: one of them must say \
             where the database is"
        );
        Ok(self)
    }

    /// What a function's `main.rs` calls once per cold start: the command line and the
    /// environment (Lambda passes no arguments; `--help` prints every setting and exits, a
    /// missing or malformed one exits non-zero naming its variable), then the database and Redis
    /// credentials from Secrets Manager when `DATABASE_SECRET_ARN` / `REDIS_AUTH_SECRET_ARN` are
    /// set (see [`crate::infra::aws_secrets`]). Without them it makes no AWS call.
    pub async fn load() -> anyhow::Result<Self> {
        use clap::Parser;
        let mut config = Self::parse().check()?;
        let refs = config.secrets.clone();
        config.resolve_secrets(&refs).await?;
        if config.payments.secret_arn.is_some() || config.edge_origin.secret_arn.is_some() {
            let client = aws_secrets::client().await;
            config.payments.resolve_secret(&client).await?;
            config.edge_origin.resolve(&client).await?;
        }
        Ok(config)
    }

    /// Reads the secrets `refs` names and rewrites the database URL and the Redis URLs with
    /// them. Does nothing (and calls nothing) when no ARN is set.
    pub async fn resolve_secrets(&mut self, refs: &SecretRefs) -> anyhow::Result<()> {
        if refs.is_empty() {
            return Ok(());
        }
        let client = aws_secrets::client().await;
        self.resolve_secrets_with(refs, &client).await
    }

    /// [`Config::resolve_secrets`] with a given Secrets Manager client.
    pub async fn resolve_secrets_with(
        &mut self,
        refs: &SecretRefs,
        client: &aws_sdk_secretsmanager::Client,
    ) -> anyhow::Result<()> {
        if let Some(arn) = &refs.database_secret_arn {
            let secret = DatabaseSecret::parse(&aws_secrets::read(client, arn).await?)?;
            self.database_url = secret.database_url(refs.database_host.as_deref())?;
            tracing::info!(database = ?self.database_url, "database credentials read from Secrets Manager");
        }
        if let Some(arn) = &refs.redis_auth_secret_arn {
            let login = aws_secrets::RedisLogin::parse(&aws_secrets::read(client, arn).await?)?;
            self.redis = self.redis.with_login(&login)?;
            tracing::info!(user = ?login.username, "redis login read from Secrets Manager");
        }
        if let Some(arn) = &refs.redis_loader_secret_arn {
            let login = aws_secrets::RedisLogin::parse(&aws_secrets::read(client, arn).await?)?;
            self.redis_loader = Some(self.redis.with_login(&login)?);
            tracing::info!(user = ?login.username, "script loader's redis login read from Secrets Manager");
        }
        Ok(())
    }

    /// The database pool this config names, connecting lazily: a container whose database is
    /// briefly out of reach still starts and reports the failure per request.
    /// `MaximumConcurrency × db_max_connections` is the most the database sees.
    pub fn database_pool_lazy(&self) -> anyhow::Result<PgPool> {
        let options = db::connect_options(self.database_url.expose(), &self.database_ca)?;
        Ok(db::pool_options()
            .max_connections(self.db_max_connections)
            .acquire_timeout(self.db_acquire_timeout)
            .connect_lazy_with(options))
    }

    /// [`Config::database_pool_lazy`], connected now.
    pub async fn database_pool(&self) -> anyhow::Result<PgPool> {
        let options = db::connect_options(self.database_url.expose(), &self.database_ca)?;
        db::connect_to(options, self.db_max_connections, self.db_acquire_timeout).await
    }
}
