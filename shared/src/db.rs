//! The PostgreSQL pool and the migrations embedded from `migrations/`.
//!
//! Migrations run from the dev server, the tests and a one-shot deploy step, never on a Lambda
//! cold start: many containers starting at once must not race on the schema.

use crate::config::Config;
use sqlx::postgres::{PgPool, PgPoolOptions};

/// The schema, compiled into the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// A small pool: `MaximumConcurrency × db_max_connections` is the most the database sees.
pub async fn connect(config: &Config) -> anyhow::Result<PgPool> {
    connect_to(
        &config.database_url,
        config.db_max_connections,
        config.db_acquire_timeout,
    )
    .await
}

/// A pool of at most `max_connections` on `url`, connected now.
pub async fn connect_to(
    url: &str,
    max_connections: u32,
    acquire_timeout: std::time::Duration,
) -> anyhow::Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(acquire_timeout)
        .connect(url)
        .await
        .map_err(|e| anyhow::anyhow!("failed to connect to the database: {e}"))
}

/// Same as [`connect`], but does not touch the network until the first query: a Lambda
/// container whose database is briefly unreachable still starts and reports per message.
pub fn connect_lazy(config: &Config) -> anyhow::Result<PgPool> {
    Ok(PgPoolOptions::new()
        .max_connections(config.db_max_connections)
        .acquire_timeout(config.db_acquire_timeout)
        .connect_lazy(&config.database_url)?)
}

/// One round trip to the database: the health check's question.
pub async fn ping(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::query_scalar!(r#"select 1 as "one!""#)
        .fetch_one(pool)
        .await?;
    Ok(())
}

/// Applies pending migrations (idempotent).
pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    MIGRATOR
        .run(pool)
        .await
        .map_err(|e| anyhow::anyhow!("failed to run migrations: {e}"))
}

/// True when the error is a unique violation on the named constraint or index.
pub fn is_unique_violation(err: &sqlx::Error, constraint: &str) -> bool {
    match err {
        sqlx::Error::Database(db) => {
            db.code().as_deref() == Some("23505") && db.constraint() == Some(constraint)
        }
        _ => false,
    }
}

/// True when the error is a foreign key violation (e.g. an order naming no activity).
pub fn is_foreign_key_violation(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.is_foreign_key_violation())
}

/// True for errors worth retrying later (connection lost, pool exhausted, I/O), as opposed to
/// a query the database refused.
pub fn is_transient(err: &sqlx::Error) -> bool {
    matches!(
        err,
        sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Tls(_)
    ) || matches!(err, sqlx::Error::Database(db) if db.code().is_some_and(|c| c.starts_with("08") || c.starts_with("57P") || c == "40001" || c == "40P01"))
}
