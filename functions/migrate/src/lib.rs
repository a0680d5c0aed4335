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

use seckill_shared::{db, secrets, Config};
use serde_json::{json, Value};

/// Connects, migrates, reports which migrations are now applied.
pub async fn migrate(mut config: Config) -> anyhow::Result<Value> {
    // Only the database secret: this function may not read the Redis one (least privilege).
    config.secrets.redis_auth_secret_arn = None;
    secrets::resolve(&mut config).await?;
    // One connection is enough and keeps this off the functions' connection budget.
    config.db_max_connections = 1;
    let target = secrets::redacted(&config.database_url);
    let pool = db::connect(&config).await?;
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
