//! The `seckill-migrate` function: applies `migrations/` (embedded in `seckill_shared::infra::db`) to
//! the database, sets the passwords of the functions' login roles, and reports what it did.
//!
//! Never run on a function's cold start (many containers would race on the schema). Two ways
//! (`main.rs`):
//!
//! - from a machine that reaches the database:
//!   `cargo run -p seckill-migrate` with `DATABASE_URL`, or with
//!   `DATABASE_SECRET_ARN` (+ `DATABASE_HOST`) to read the credentials from Secrets Manager;
//! - in AWS, as the template's `MigrateFunction` (same binary: it notices the Lambda runtime
//!   API and answers one invocation per migration run):
//!   `aws lambda invoke --function-name <MigrateFunctionName> /dev/stdout`.
//!
//! It connects as the master user. `migrations/0006_roles.sql` creates the functions' roles
//! ([`db::ROLES`]) without passwords; with `DATABASE_ROLE_SECRET_ARNS` set, each run reads
//! those secrets before migrating (so a bad one changes nothing) and afterwards gives each
//! role the password of its secret ([`set_role_passwords`]).

mod scram;

use anyhow::Context as _;
pub use scram::verifier as scram_verifier;
use seckill_shared::infra::aws_secrets::{self, RoleSecret};
use seckill_shared::infra::config::{millis, RedisTopology, SecretRefs};
use seckill_shared::infra::db;
use seckill_shared::infra::secret::{ExposeSecret, SecretUrl};
use seckill_shared::store::conn::Redis;
use seckill_shared::store::scripts;
use serde_json::{json, Value};
use sqlx::{ConnectOptions, Connection};
use std::time::Duration;

/// What migrating needs to know: where the database is and which role secrets to apply.
/// (The functions' `Config` also requires Redis and the queue, which a migration run from a
/// bastion has no use for.)
#[derive(Clone, Debug, clap::Parser)]
#[command(
    name = "seckill-migrate",
    about = "Applies the schema migrations to the database and sets the functions' role \
             passwords. Every setting is read from its environment variable; a flag of the \
             same name wins.",
    long_about = None
)]
pub struct MigrateConfig {
    /// PostgreSQL URL. Required unless DATABASE_SECRET_ARN names the credentials (as in AWS).
    #[arg(
        long = "database-url",
        env = "DATABASE_URL",
        value_name = "DATABASE_URL",
        value_parser = secret_url,
        required_unless_present = "database_secret_arn",
        hide_env_values = true
    )]
    pub database_url: Option<SecretUrl>,
    /// The master secret, the role secrets, and the script loader's Redis login
    /// (REDIS_AUTH_SECRET_ARN is not read here).
    #[command(flatten)]
    pub secrets: SecretRefs,
    /// Where Redis is (one URL, or a cluster's nodes): with REDIS_LOADER_SECRET_ARN set too
    /// (as in AWS), the run loads this build's scripts on every node after migrating, logged
    /// in as the loader. Not needed to migrate alone.
    #[arg(
        long = "redis-url",
        env = "REDIS_URL",
        value_name = "REDIS_URL",
        hide_env_values = true
    )]
    pub redis_url: Option<String>,
    /// The one REDIS_URL is a cluster's configuration endpoint.
    #[arg(
        long = "redis-cluster",
        env = "REDIS_CLUSTER",
        value_name = "REDIS_CLUSTER",
        default_value = "false",
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub redis_cluster: bool,
    #[command(flatten)]
    pub database_ca: db::CaBundle,
    /// How long the run waits for its one database connection.
    #[arg(
        long = "db-acquire-timeout-ms",
        env = "DB_ACQUIRE_TIMEOUT_MS",
        value_name = "DB_ACQUIRE_TIMEOUT_MS",
        value_parser = millis,
        default_value = "3000"
    )]
    pub db_acquire_timeout: Duration,
}

impl MigrateConfig {
    /// The command line and the environment; blank references are no references (a blank
    /// `DATABASE_URL` as the template declares it, the ARNs `events/env.json` blanks for
    /// `sam local invoke`).
    pub fn load() -> anyhow::Result<Self> {
        <Self as clap::Parser>::parse().without_blanks()
    }

    fn without_blanks(mut self) -> anyhow::Result<Self> {
        self.secrets.drop_blank();
        self.secrets.check()?;
        if self
            .database_url
            .as_ref()
            .is_some_and(|u| u.expose().trim().is_empty())
        {
            self.database_url = None;
        }
        Ok(self)
    }

    /// The database URL: from the secret when one is named (read per run, so a rotated
    /// password is picked up), else DATABASE_URL.
    async fn database_url(&self) -> anyhow::Result<SecretUrl> {
        match &self.secrets.database_secret_arn {
            Some(arn) => {
                aws_secrets::database_url_from_secret(arn, self.secrets.database_host.as_deref())
                    .await
            }
            None => self
                .database_url
                .clone()
                .ok_or_else(|| anyhow::anyhow!("DATABASE_URL or DATABASE_SECRET_ARN must be set")),
        }
    }
}

/// Reads the role secrets, connects, migrates, sets the role passwords, reports which
/// migrations are now applied and which roles got their password.
pub async fn migrate(config: &MigrateConfig) -> anyhow::Result<Value> {
    let roles = aws_secrets::role_secrets(&config.secrets.database_role_secret_arns).await?;
    let url = config.database_url().await?;
    let target = url.redacted();
    let options = db::connect_options(url.expose(), &config.database_ca)?;
    // One connection is enough and keeps this off the functions' connection budget.
    let pool = db::connect_to(options.clone(), 1, config.db_acquire_timeout).await?;
    let before: Vec<i64> = applied(&pool).await.unwrap_or_default();
    db::migrate(&pool).await?;
    let after = applied(&pool).await?;
    let newly: Vec<i64> = after
        .iter()
        .copied()
        .filter(|v| !before.contains(v))
        .collect();
    pool.close().await;
    let with_password = set_role_passwords(options, &roles).await?;
    tracing::info!(database = %target, ?newly, roles = ?with_password, "migrations applied");
    // The migrations are committed whatever comes of the load: its failure is reported, not
    // the run's (the next preheat run loads them as well).
    let scripts = match load_scripts(config).await {
        Ok(n) => json!(n),
        Err(e) => {
            tracing::error!(
                error = format!("{e:#}"),
                "failed to load the scripts into redis"
            );
            json!({ "error": format!("{e:#}") })
        }
    };
    Ok(json!({
        "database": target,
        "applied": newly,
        "latest": after.last(),
        "known": db::MIGRATOR.iter().map(|m| m.version).collect::<Vec<_>>(),
        "rolePasswordsSet": with_password,
        "scriptsLoaded": scripts,
    }))
}

/// This build's scripts on every Redis node, loaded as the loader user, when
/// REDIS_LOADER_SECRET_ARN names its login: a deploy's new scripts are there as soon as the
/// migration ran (no function may load one itself). Answers how many; bounded by
/// `SCRIPT_LOAD_BUDGET` in all.
pub async fn load_scripts(config: &MigrateConfig) -> anyhow::Result<usize> {
    let Some(arn) = &config.secrets.redis_loader_secret_arn else {
        return Ok(0);
    };
    let url = config
        .redis_url
        .as_deref()
        .filter(|u| !u.trim().is_empty())
        .context("REDIS_LOADER_SECRET_ARN is set but REDIS_URL is not")?;
    let client = aws_secrets::client().await;
    let login = aws_secrets::RedisLogin::parse(&aws_secrets::read(&client, arn).await?)?;
    let topology = RedisTopology::from_urls(url, config.redis_cluster).with_login(&login)?;
    let loader = Redis::connect_with(&topology, SCRIPT_LOAD_TIMEOUT, "seckill")
        .await
        .context("failed to connect to redis as the script loader")?;
    let loaded = tokio::time::timeout(SCRIPT_LOAD_BUDGET, scripts::load_all(&loader))
        .await
        .map_err(|_| anyhow::anyhow!("loading the scripts took over {SCRIPT_LOAD_BUDGET:?}"))??;
    tracing::info!(scripts = loaded, "scripts loaded into redis");
    Ok(loaded)
}

/// The whole load's bound: well inside the function's 60 s Timeout with the migrations.
const SCRIPT_LOAD_BUDGET: Duration = Duration::from_secs(20);

/// Each SCRIPT LOAD's bound (on a cluster, one per node at once).
const SCRIPT_LOAD_TIMEOUT: Duration = Duration::from_secs(5);

/// Gives each role the password of its secret, on one connection of `options` that logs no
/// statement. What is sent is the password's SCRAM-SHA-256 verifier ([`scram_verifier`]),
/// quoted by the server (`format('%I', '%L')`), never the password: so no statement log, and
/// no error the server logs with its statement, holds it. Returns the roles set, in order.
pub async fn set_role_passwords(
    options: sqlx::postgres::PgConnectOptions,
    roles: &[RoleSecret],
) -> anyhow::Result<Vec<&'static str>> {
    aws_secrets::distinct_roles(roles)?;
    if roles.is_empty() {
        return Ok(Vec::new());
    }
    let mut conn = options
        .disable_statement_logging()
        .connect()
        .await
        .map_err(|e| anyhow::anyhow!("failed to connect to set the role passwords: {e}"))?;
    let mut set = Vec::with_capacity(roles.len());
    for secret in roles {
        let verifier = scram::verifier(secret.password.expose_secret())
            .map_err(|e| anyhow::anyhow!("role {}: {e}", secret.role))?;
        let statement: String =
            sqlx::query_scalar("select format('alter role %I with login password %L', $1, $2)")
                .bind(secret.role)
                .bind(&verifier)
                .fetch_one(&mut conn)
                .await?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut conn)
            .await
            .map_err(|e| anyhow::anyhow!("failed to set the password of {}: {e}", secret.role))?;
        tracing::info!(role = secret.role, "role password set");
        set.push(secret.role);
    }
    conn.close().await?;
    Ok(set)
}

/// A non-blank URL, which may carry a password.
fn secret_url(value: &str) -> Result<SecretUrl, String> {
    Ok(SecretUrl::from(value))
}

async fn applied(pool: &sqlx::PgPool) -> anyhow::Result<Vec<i64>> {
    Ok(
        sqlx::query_scalar("select version from _sqlx_migrations where success order by version")
            .fetch_all(pool)
            .await?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn the_role_secrets_and_the_ca_bundle_are_read_from_their_variables() {
        let config = MigrateConfig::try_parse_from([
            "seckill-migrate",
            "--database-secret-arn=arn:db",
            "--database-role-secret-arns=arn:entry, arn:admin",
            "--database-ca-bundle=/opt/ca.pem",
        ])
        .unwrap();
        assert_eq!(
            config.secrets.database_role_secret_arns,
            ["arn:entry", "arn:admin"]
        );
        assert_eq!(config.database_ca.path, Some("/opt/ca.pem".into()));
    }

    #[test]
    fn blank_references_are_none_as_sam_local_sets_them() {
        let config = MigrateConfig::try_parse_from([
            "seckill-migrate",
            "--database-url=postgres://postgres@127.0.0.1:5432/seckill",
            "--database-secret-arn=",
            "--database-role-secret-arns=",
        ])
        .unwrap()
        .without_blanks()
        .unwrap();
        assert_eq!(config.secrets.database_secret_arn, None);
        assert!(config.secrets.database_role_secret_arns.is_empty());
        assert!(config.database_url.is_some());
        let config = MigrateConfig::try_parse_from([
            "seckill-migrate",
            "--database-url=",
            "--database-secret-arn=arn:db",
        ])
        .unwrap()
        .without_blanks()
        .unwrap();
        assert_eq!(
            config.database_url, None,
            "the template's blank DATABASE_URL"
        );
        assert_eq!(
            config.secrets.database_secret_arn.as_deref(),
            Some("arn:db")
        );
    }

    #[test]
    fn debug_shows_no_password() {
        let config = MigrateConfig::try_parse_from([
            "seckill-migrate",
            "--database-url=postgres://seckill:hunter2@db/seckill",
        ])
        .unwrap();
        let debug = format!("{config:?}");
        assert!(
            !debug.contains("hunter2") && debug.contains("seckill:***@db"),
            "{debug}"
        );
    }
}
