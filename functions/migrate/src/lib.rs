//! The `seckill-migrate` function: applies `migrations/` (embedded in `seckill_shared::db`) to
//! the database and reports what it applied.
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

use seckill_shared::config::{millis, non_blank};
use seckill_shared::{db, secrets};
use serde_json::{json, Value};
use std::time::Duration;

/// What migrating needs to know: where the database is, nothing else. (The functions' `Config`
/// also requires Redis and the queue, which a migration run from a bastion has no use for.)
#[derive(Clone, clap::Parser)]
#[command(
    name = "seckill-migrate",
    about = "Applies the schema migrations to the database. Every setting is read from its \
             environment variable; a flag of the same name wins.",
    long_about = None
)]
pub struct MigrateConfig {
    /// PostgreSQL URL. Required unless DATABASE_SECRET_ARN names the credentials (as in AWS).
    #[arg(
        long = "database-url",
        env = "DATABASE_URL",
        value_name = "DATABASE_URL",
        value_parser = non_blank,
        required_unless_present = "database_secret_arn",
        hide_env_values = true
    )]
    pub database_url: Option<String>,
    /// Secrets Manager ARN of the database credentials; replaces DATABASE_URL.
    #[arg(
        long = "database-secret-arn",
        env = "DATABASE_SECRET_ARN",
        value_name = "DATABASE_SECRET_ARN",
        value_parser = non_blank
    )]
    pub database_secret_arn: Option<String>,
    /// Host that overrides the secret's (the RDS Proxy endpoint in AWS).
    #[arg(
        long = "database-host",
        env = "DATABASE_HOST",
        value_name = "DATABASE_HOST",
        value_parser = non_blank
    )]
    pub database_host: Option<String>,
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
    /// The database URL: from the secret when one is named (read per run, so a rotated
    /// password is picked up), else DATABASE_URL.
    async fn database_url(&self) -> anyhow::Result<String> {
        match &self.database_secret_arn {
            Some(arn) => {
                secrets::database_url_from_secret(arn, self.database_host.as_deref()).await
            }
            None => self
                .database_url
                .clone()
                .ok_or_else(|| anyhow::anyhow!("DATABASE_URL or DATABASE_SECRET_ARN must be set")),
        }
    }
}

/// Connects, migrates, reports which migrations are now applied.
pub async fn migrate(config: &MigrateConfig) -> anyhow::Result<Value> {
    let url = config.database_url().await?;
    let target = secrets::redacted(&url);
    // One connection is enough and keeps this off the functions' connection budget.
    let pool = db::connect_to(&url, 1, config.db_acquire_timeout).await?;
    let before: Vec<i64> = applied(&pool).await.unwrap_or_default();
    db::migrate(&pool).await?;
    let after = applied(&pool).await?;
    let newly: Vec<i64> = after
        .iter()
        .copied()
        .filter(|v| !before.contains(v))
        .collect();
    pool.close().await;
    tracing::info!(database = %target, ?newly, "migrations applied");
    Ok(json!({
        "database": target,
        "applied": newly,
        "latest": after.last(),
        "known": db::MIGRATOR.iter().map(|m| m.version).collect::<Vec<_>>(),
    }))
}

async fn applied(pool: &sqlx::PgPool) -> anyhow::Result<Vec<i64>> {
    Ok(
        sqlx::query_scalar("select version from _sqlx_migrations where success order by version")
            .fetch_all(pool)
            .await?,
    )
}
