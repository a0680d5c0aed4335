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
pub use crate::infra::redis_topology::RedisTopology;
use crate::infra::secret::{SecretString, SecretUrl};
use sqlx::PgPool;
use std::time::Duration;

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
    /// How long one reconcile run spends on the due sales: each gets an even share of what is
    /// left (at least 1 s, or the whole budget when it is shorter), and the sales past it are
    /// checked first by the next run. Below the function's Timeout (60 s), with room for the
    /// payment timeout's batch before it.
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
}

/// The values `x-origin-verify` may carry: with the edge on, CloudFront adds the origin
/// secret to every request it sends the HTTP API, and `http::origin` refuses the others.
/// Nothing set: every request is let through (the edge off, and local runs).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct EdgeOrigin {
    /// AWS, the edge on: the Secrets Manager secret (JSON {"value": ...}) CloudFront sends in
    /// x-origin-verify. Its current and previous values are accepted (a rotation refuses
    /// nobody).
    #[arg(
        id = "edge_origin_secret_arn",
        long = "edge-origin-secret-arn",
        env = "EDGE_ORIGIN_SECRET_ARN",
        value_name = "EDGE_ORIGIN_SECRET_ARN"
    )]
    pub secret_arn: Option<String>,
    /// The origin secret itself, for a run outside AWS that stands behind a proxy adding it.
    #[arg(id = "edge_origin_secret", long = "edge-origin-secret", env = "EDGE_ORIGIN_SECRET",
          value_name = "EDGE_ORIGIN_SECRET", value_parser = secret_text, hide_env_values = true)]
    pub secret: Option<SecretString>,
    /// The values read from EDGE_ORIGIN_SECRET_ARN at the cold start.
    #[arg(skip)]
    pub from_arn: Vec<SecretString>,
}

impl EdgeOrigin {
    /// Every value a request may carry; empty: no check.
    pub fn accepted(&self) -> Vec<SecretString> {
        self.secret.iter().chain(&self.from_arn).cloned().collect()
    }

    /// Reads the current and (if any) the previous value of EDGE_ORIGIN_SECRET_ARN.
    pub async fn resolve(&mut self, client: &aws_sdk_secretsmanager::Client) -> anyhow::Result<()> {
        let Some(arn) = &self.secret_arn else {
            return Ok(());
        };
        let value = |json: &str| -> anyhow::Result<SecretString> {
            #[derive(serde::Deserialize)]
            struct Origin {
                value: String,
            }
            let origin: Origin = serde_json::from_str(json)
                .map_err(|_| anyhow::anyhow!("origin secret is not JSON with a \"value\""))?;
            anyhow::ensure!(!origin.value.is_empty(), "origin secret is empty");
            Ok(SecretString::from(origin.value))
        };
        self.from_arn = vec![value(&aws_secrets::read(client, arn).await?)?];
        match aws_secrets::read_stage(client, arn, "AWSPREVIOUS").await {
            Ok(previous) => self.from_arn.push(value(&previous)?),
            // A secret never rotated has no previous version.
            Err(e) => tracing::debug!(error = %e, "no previous origin secret"),
        }
        tracing::info!(
            values = self.from_arn.len(),
            "origin secret read from Secrets Manager"
        );
        Ok(())
    }
}

fn secret_text(value: &str) -> Result<SecretString, String> {
    non_blank(value).map(SecretString::from)
}

/// Which Secrets Manager secrets this process reads at its cold start (AWS only; unset
/// locally, where nothing is read): part of [`Config`], parsed with it.
#[derive(Clone, Debug, Default, PartialEq, Eq, clap::Args)]
pub struct SecretRefs {
    /// Secrets Manager ARN of the database credentials (JSON username, password, host, port,
    /// dbname); replaces DATABASE_URL. Set by the template in AWS; unset (or blank) locally.
    #[arg(
        long = "database-secret-arn",
        env = "DATABASE_SECRET_ARN",
        value_name = "DATABASE_SECRET_ARN"
    )]
    pub database_secret_arn: Option<String>,
    /// Host that overrides the secret's (the RDS Proxy endpoint in AWS).
    #[arg(
        long = "database-host",
        env = "DATABASE_HOST",
        value_name = "DATABASE_HOST"
    )]
    pub database_host: Option<String>,
    /// Secrets Manager ARN of this function's Redis login (JSON username + token: its own
    /// ElastiCache user), put into every REDIS_URL. Unset locally.
    #[arg(
        long = "redis-auth-secret-arn",
        env = "REDIS_AUTH_SECRET_ARN",
        value_name = "REDIS_AUTH_SECRET_ARN"
    )]
    pub redis_auth_secret_arn: Option<String>,
    /// Comma-separated Secrets Manager ARNs of the functions' database roles, each secret JSON
    /// {"username": "seckill_entry", "password": "..."}. Read by seckill-migrate only, which
    /// sets each role's password after migrating; the functions ignore it.
    #[arg(
        long = "database-role-secret-arns",
        env = "DATABASE_ROLE_SECRET_ARNS",
        value_name = "DATABASE_ROLE_SECRET_ARNS",
        value_delimiter = ',',
        value_parser = trimmed
    )]
    pub database_role_secret_arns: Vec<String>,
}

impl SecretRefs {
    /// A blank reference is no reference: `sam local invoke` can only override variables the
    /// template declares, so `events/env.json` blanks the template's ARNs to run without AWS.
    pub fn drop_blank(&mut self) {
        for reference in [
            &mut self.database_secret_arn,
            &mut self.database_host,
            &mut self.redis_auth_secret_arn,
        ] {
            if reference.as_deref().is_some_and(|v| v.trim().is_empty()) {
                *reference = None;
            }
        }
        if self
            .database_role_secret_arns
            .iter()
            .all(|arn| arn.is_empty())
        {
            self.database_role_secret_arns.clear();
        }
    }

    /// A list with a blank item (`a,,b`) is a mistake; a blank list is none
    /// ([`SecretRefs::drop_blank`]).
    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.database_role_secret_arns
                .iter()
                .all(|arn| !arn.is_empty()),
            "DATABASE_ROLE_SECRET_ARNS has a blank item: {:?}",
            self.database_role_secret_arns
        );
        Ok(())
    }

    /// Whether [`Config::resolve_secrets`] has nothing to read (the role secrets are not its
    /// to read).
    pub fn is_empty(&self) -> bool {
        self.database_secret_arn.is_none() && self.redis_auth_secret_arn.is_none()
    }
}

/// Any text but a blank one: a variable set to nothing is a mistake, not a default.
pub fn non_blank(value: &str) -> Result<String, String> {
    if value.trim().is_empty() {
        Err("must not be blank".into())
    } else {
        Ok(value.to_string())
    }
}

/// One item of a comma-separated list (`a, b`), trimmed.
fn trimmed(value: &str) -> Result<String, String> {
    Ok(value.trim().to_string())
}

/// [`non_blank`] as a [`SecretUrl`], but the empty string stands for "not given" (the default
/// of a setting that another one may supply); [`Config::check`] refuses it when nothing else
/// did.
fn empty_or_non_blank_url(value: &str) -> Result<SecretUrl, String> {
    if value.is_empty() {
        Ok(SecretUrl::default())
    } else {
        non_blank(value).map(SecretUrl::from)
    }
}

fn whole<T: std::str::FromStr>(value: &str) -> Result<T, String> {
    value
        .trim()
        .parse()
        .map_err(|_| "must be a non-negative whole number".into())
}

/// A whole number, 1 or more.
fn at_least_one(value: &str) -> Result<i64, String> {
    match whole::<u32>(value)? {
        0 => Err("must be at least 1".into()),
        n => Ok(i64::from(n)),
    }
}

/// A whole number of milliseconds.
pub fn millis(value: &str) -> Result<Duration, String> {
    whole(value).map(Duration::from_millis)
}

/// The longest [`Config::public_view_cache_ttl`]: the view's stock may lag Redis by this.
pub const MAX_PUBLIC_VIEW_CACHE: Duration = Duration::from_millis(250);

/// [`millis`], at most [`MAX_PUBLIC_VIEW_CACHE`]: a longer value is refused, not clamped.
fn view_cache_millis(value: &str) -> Result<Duration, String> {
    let ttl = millis(value)?;
    if ttl > MAX_PUBLIC_VIEW_CACHE {
        return Err(format!(
            "must be at most {} ms",
            MAX_PUBLIC_VIEW_CACHE.as_millis()
        ));
    }
    Ok(ttl)
}

/// The window [`Config::user_db_rate_per_sec`] is counted over: two seconds, so a page that
/// asks for its order, pays and asks again at once is not refused, while one user's loop is
/// held to the rate on average.
pub const USER_DB_RATE_WINDOW: Duration = Duration::from_secs(2);

/// The most [`Config::user_db_rate_per_sec`] takes: above it the limit would bound nothing a
/// container's connections could serve.
const MAX_USER_DB_RATE: u32 = 1000;

/// A whole number up to [`MAX_USER_DB_RATE`]; a larger one is refused, not clamped.
fn user_db_rate(value: &str) -> Result<u32, String> {
    let rate = whole::<u32>(value)?;
    if rate > MAX_USER_DB_RATE {
        return Err(format!("must be at most {MAX_USER_DB_RATE}"));
    }
    Ok(rate)
}

fn secs(value: &str) -> Result<Duration, String> {
    whole(value).map(Duration::from_secs)
}

/// A whole number of milliseconds, at least 1.
fn positive_millis(value: &str) -> Result<Duration, String> {
    at_least_one(value).map(|n| Duration::from_millis(n.unsigned_abs()))
}

impl Config {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What the SAM template's Globals set, as variables (the lookup stands in for the process
    /// environment, so these tests never touch the real one).
    const TEMPLATE: [(&str, &str); 8] = [
        (
            "DATABASE_SECRET_ARN",
            "arn:aws:secretsmanager:us-east-1:1:secret:db",
        ),
        ("DATABASE_HOST", "proxy.example"),
        (
            "REDIS_AUTH_SECRET_ARN",
            "arn:aws:secretsmanager:us-east-1:1:secret:redis",
        ),
        ("REDIS_URL", "rediss://clustercfg.example:6379"),
        ("REDIS_CLUSTER", "true"),
        (
            "ORDER_QUEUE_URL",
            "https://sqs.us-east-1.amazonaws.com/1/orders",
        ),
        ("PAYMENT_TIMEOUT_SECS", "900"),
        ("DB_MAX_CONNECTIONS", "1"),
    ];

    /// Parses `vars` as if they were the whole environment: each becomes the flag of the
    /// argument that reads it, and every argument's `env` is rebound to a variable nobody sets,
    /// so the real environment (scripts/env.sh under `make test`) plays no part.
    fn parse(vars: &[(&str, &str)]) -> Result<Config, String> {
        use clap::{CommandFactory, FromArgMatches};
        let mut argv = vec!["seckill".to_string()];
        let cmd = Config::command().mut_args(|arg| {
            let Some(name) = arg.get_env().map(|n| n.to_string_lossy().into_owned()) else {
                return arg;
            };
            if let Some((_, value)) = vars.iter().find(|(k, _)| *k == name) {
                let long = arg.get_long().expect("every setting has a flag");
                argv.push(format!("--{long}={value}"));
            }
            arg.env("SECKILL_CONFIG_TEST_NEVER_SET")
        });
        let config = cmd
            .try_get_matches_from(argv)
            .and_then(|m| Config::from_arg_matches(&m))
            .map_err(|e| e.render().to_string())?;
        config.check().map_err(|e| e.to_string())
    }

    fn local() -> Vec<(&'static str, &'static str)> {
        vec![
            ("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/seckill"),
            ("REDIS_URL", "redis://127.0.0.1:6379"),
            (
                "ORDER_QUEUE_URL",
                "http://127.0.0.1:4566/123456789012/seckill-orders",
            ),
        ]
    }

    #[test]
    fn the_template_environment_parses_with_the_database_from_its_secret() {
        let config = parse(&TEMPLATE).unwrap();
        assert_eq!(config.database_url, "", "filled in by resolve_secrets");
        assert_eq!(
            config.redis,
            RedisTopology::Cluster(vec!["rediss://clustercfg.example:6379".into()])
        );
        assert_eq!(config.db_max_connections, 1);
        assert_eq!(config.payment_timeout, Duration::from_secs(900));
        assert_eq!(
            config.secrets.database_host.as_deref(),
            Some("proxy.example")
        );
    }

    /// `sam local invoke` with samconfig's `events/env.json`: its variables for every
    /// function over the template's.
    #[test]
    fn the_sam_local_environment_runs_on_the_local_stack_and_reads_no_secret() {
        let local: serde_json::Value =
            serde_json::from_str(include_str!("../../../events/env.json")).unwrap();
        // The first of a name wins in `parse`: env.json's values, then the template's.
        let vars: Vec<(&str, &str)> = local["Parameters"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str().unwrap()))
            .chain(TEMPLATE)
            .collect();
        let config = parse(&vars).unwrap();
        assert_eq!(config.secrets, SecretRefs::default());
        assert_eq!(
            config.database_url,
            "postgres://postgres@127.0.0.1:5432/seckill"
        );
        assert_eq!(
            config.redis,
            RedisTopology::Standalone("redis://127.0.0.1:6379".into())
        );
    }

    #[test]
    fn a_missing_database_url_is_named() {
        let vars: Vec<_> = local()
            .into_iter()
            .filter(|(k, _)| *k != "DATABASE_URL")
            .collect();
        let err = parse(&vars).unwrap_err();
        assert!(err.contains("DATABASE_URL"), "{err}");
    }

    #[test]
    fn an_empty_database_url_is_refused() {
        let mut vars = local();
        vars[0] = ("DATABASE_URL", "");
        let err = parse(&vars).unwrap_err();
        assert!(err.contains("DATABASE_URL"), "{err}");
        vars[0] = ("DATABASE_URL", "  ");
        let err = parse(&vars).unwrap_err();
        assert!(err.contains("DATABASE_URL"), "{err}");
    }

    #[test]
    fn a_missing_order_queue_url_is_named() {
        let vars: Vec<_> = TEMPLATE
            .into_iter()
            .filter(|(k, _)| *k != "ORDER_QUEUE_URL")
            .collect();
        let err = parse(&vars).unwrap_err();
        assert!(err.contains("ORDER_QUEUE_URL"), "{err}");
    }

    #[test]
    fn durations_are_read_in_the_unit_their_variable_names() {
        let mut vars = local();
        vars.extend([("REDIS_TIMEOUT_MS", " 250 "), ("PREHEAT_LEAD_SECS", "60")]);
        let config = parse(&vars).unwrap();
        assert_eq!(config.redis_timeout, Duration::from_millis(250));
        assert_eq!(config.preheat_lead, Duration::from_secs(60));
        assert_eq!(config.sqs_timeout, Duration::from_millis(2000), "default");
        assert_eq!(config.lock_ttl, Duration::from_millis(5000), "default");
    }

    #[test]
    fn the_public_view_cache_defaults_to_and_stops_at_250_ms() {
        let config = parse(&local()).unwrap();
        assert_eq!(config.public_view_cache_ttl, Duration::from_millis(250));
        let mut vars = local();
        vars.push(("PUBLIC_VIEW_CACHE_MS", "0"));
        assert_eq!(parse(&vars).unwrap().public_view_cache_ttl, Duration::ZERO);
        let mut vars = local();
        vars.push(("PUBLIC_VIEW_CACHE_MS", "251"));
        let err = parse(&vars).unwrap_err();
        assert!(err.contains("PUBLIC_VIEW_CACHE_MS"), "{err}");
    }

    #[test]
    fn the_user_db_rate_defaults_to_5_is_off_at_0_and_stops_at_1000() {
        assert_eq!(parse(&local()).unwrap().user_db_rate_per_sec, 5);
        for (value, want) in [
            ("0", Some(0)),
            ("1000", Some(1000)),
            ("1001", None),
            ("-1", None),
            ("", None),
        ] {
            let mut vars = local();
            vars.push(("USER_DB_RATE_PER_SEC", value));
            match (parse(&vars), want) {
                (Ok(config), Some(want)) => assert_eq!(config.user_db_rate_per_sec, want),
                (Err(err), None) => assert!(err.contains("USER_DB_RATE_PER_SEC"), "{err}"),
                (got, want) => panic!("{value:?}: {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn a_malformed_number_is_an_error_naming_its_variable() {
        let mut vars = local();
        vars.push(("LOCK_WAIT_MS", "2s"));
        let err = parse(&vars).unwrap_err();
        assert!(err.contains("LOCK_WAIT_MS"), "{err}");
    }

    #[test]
    fn a_url_list_is_a_cluster_and_one_url_is_standalone() {
        assert_eq!(
            RedisTopology::from_urls("redis://a:1, redis://b:2", false),
            RedisTopology::Cluster(vec!["redis://a:1".into(), "redis://b:2".into()])
        );
        assert_eq!(
            RedisTopology::from_urls("redis://a:1", false),
            RedisTopology::Standalone("redis://a:1".into())
        );
        let mut vars = local();
        vars.push(("REDIS_CLUSTER", "yes"));
        assert!(matches!(
            parse(&vars).unwrap().redis,
            RedisTopology::Cluster(_)
        ));
    }

    #[test]
    fn the_role_secret_arns_are_a_comma_separated_list() {
        let mut vars = local();
        vars.push((
            "DATABASE_ROLE_SECRET_ARNS",
            "arn:aws:secretsmanager:us-east-1:1:secret:entry, arn:aws:secretsmanager:us-east-1:1:secret:admin",
        ));
        let config = parse(&vars).unwrap();
        assert_eq!(
            config.secrets.database_role_secret_arns,
            [
                "arn:aws:secretsmanager:us-east-1:1:secret:entry",
                "arn:aws:secretsmanager:us-east-1:1:secret:admin"
            ]
        );
        assert!(parse(&local())
            .unwrap()
            .secrets
            .database_role_secret_arns
            .is_empty());
        let mut vars = local();
        vars.push(("DATABASE_ROLE_SECRET_ARNS", "arn:a,,arn:b"));
        let err = parse(&vars).unwrap_err();
        assert!(err.contains("DATABASE_ROLE_SECRET_ARNS"), "{err}");
    }

    #[test]
    fn the_ca_bundle_is_the_compiled_in_one_unless_named() {
        assert_eq!(parse(&local()).unwrap().database_ca.path, None);
        let mut vars = local();
        vars.push(("DATABASE_CA_BUNDLE", "/opt/global-bundle.pem"));
        assert_eq!(
            parse(&vars).unwrap().database_ca.path,
            Some("/opt/global-bundle.pem".into())
        );
    }

    #[test]
    fn debug_of_a_config_full_of_secrets_shows_none_of_them() {
        let mut vars: Vec<(&str, &str)> = TEMPLATE.to_vec();
        vars.retain(|(k, _)| *k != "REDIS_URL");
        vars.extend([
            (
                "DATABASE_URL",
                "postgres://seckill:db-pa55@proxy:5432/seckill?sslmode=verify-full&password=qs-pa55",
            ),
            (
                "REDIS_URL",
                "rediss://:node1-t0ken@n1:6379,rediss://user:node2-t0ken@n2:6379/0?token=qs-t0ken",
            ),
            ("DATABASE_CA_BUNDLE", "/opt/ca.pem"),
        ]);
        let config = parse(&vars).unwrap();
        let debug = format!("{config:?}");
        for secret in [
            "db-pa55",
            "qs-pa55",
            "node1-t0ken",
            "node2-t0ken",
            "qs-t0ken",
        ] {
            assert!(!debug.contains(secret), "{secret} in {debug}");
        }
        for shown in [
            "seckill:***@proxy",
            "user:***@n2",
            "/opt/ca.pem",
            "proxy.example",
        ] {
            assert!(debug.contains(shown), "{shown} not in {debug}");
        }
    }

    #[test]
    fn debug_and_help_show_no_password() {
        let mut vars = local();
        vars[0] = ("DATABASE_URL", "postgres://u:hunter2@db/seckill");
        vars[1] = ("REDIS_URL", "rediss://:t0ken@redis:6379");
        let config = parse(&vars).unwrap();
        let debug = format!("{config:?}");
        assert!(
            !debug.contains("hunter2") && !debug.contains("t0ken"),
            "{debug}"
        );
        assert!(debug.contains("u:***@db"), "{debug}");
        use clap::CommandFactory;
        for arg in Config::command().get_arguments() {
            let name = arg.get_env().map(|n| n.to_string_lossy().into_owned());
            if matches!(name.as_deref(), Some("DATABASE_URL" | "REDIS_URL")) {
                assert!(
                    arg.is_hide_env_values_set(),
                    "{name:?} shows its value in --help"
                );
            }
        }
    }
    #[test]
    fn no_arn_means_no_secret_to_read() {
        assert!(SecretRefs::default().is_empty());
        let roles_only = SecretRefs {
            database_role_secret_arns: vec!["arn:aws:secretsmanager:us-east-1:1:secret:r".into()],
            ..SecretRefs::default()
        };
        assert!(roles_only.is_empty(), "the functions read no role secret");
    }
}
