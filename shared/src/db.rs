//! The PostgreSQL pool and the migrations embedded from `migrations/`.
//!
//! Migrations run from the dev server, the tests and a one-shot deploy step, never on a Lambda
//! cold start: many containers starting at once must not race on the schema.

use crate::config::Config;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::Row;

/// The schema, compiled into the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// Every pool's options. A connection handed back while the server still has a transaction
/// open on it is closed, never pooled again: a future cancelled during `Pool::begin`'s BEGIN
/// round trip leaves the session inside a transaction that sqlx does not know about (sqlx
/// 0.8 and 0.9 do), and the next borrower's statements would run inside it,
/// holding their locks with nobody to commit them. Outside a transaction block every statement
/// is its own transaction, so `now()` (the transaction's start) equals the statement's start;
/// inside one it does not. Closing the session is what releases the locks.
pub fn pool_options() -> PgPoolOptions {
    PgPoolOptions::new().after_release(|conn, _meta| {
        Box::pin(async move {
            // One simple-protocol message, so outside a transaction block the statement is the
            // whole implicit transaction (with Parse/Bind/Execute the statement's start comes
            // after the transaction's). Reads no table: nothing for `query!` to check.
            let row = sqlx::raw_sql("select now() <> statement_timestamp()")
                .fetch_one(&mut *conn)
                .await?;
            let in_transaction: bool = row.try_get(0)?;
            if in_transaction {
                tracing::warn!("a connection came back inside a transaction; closed");
            }
            Ok(!in_transaction)
        })
    })
}

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
    pool_options()
        .max_connections(max_connections)
        .acquire_timeout(acquire_timeout)
        .connect(url)
        .await
        .map_err(|e| anyhow::anyhow!("failed to connect to the database: {e}"))
}

/// Same as [`connect`], but does not touch the network until the first query: a Lambda
/// container whose database is briefly unreachable still starts and reports per message.
pub fn connect_lazy(config: &Config) -> anyhow::Result<PgPool> {
    Ok(pool_options()
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
