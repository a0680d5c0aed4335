//! The PostgreSQL pool, how it verifies the server, the functions' roles, and the migrations
//! embedded from `migrations/`.
//!
//! Migrations run from the dev server, the tests and a one-shot deploy step, never on a Lambda
//! cold start: many containers starting at once must not race on the schema.
//!
//! # TLS
//!
//! In AWS the URL comes from [`crate::infra::aws_secrets`] with `sslmode=verify-full`: the server's
//! certificate must chain to a trusted CA and name the host connected to (the RDS Proxy
//! endpoint). [`connect_options`] hands sqlx the CA certificates of [`CaBundle`]: the bundle
//! compiled in from `shared/certs/aws-db-ca.pem` (the Amazon Trust Services roots of RDS Proxy's
//! ACM certificates, and the RDS root CAs for a direct Aurora connection), or the file
//! `DATABASE_CA_BUNDLE` names. sqlx's rustls backend adds them to the Mozilla roots it always
//! trusts (`webpki-roots`); it has no switch to trust the bundle alone. `sslmode=require`, what
//! the URL said before, encrypts but checks neither the certificate nor the name.

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgSslMode};
use sqlx::Row;
use std::borrow::Cow;
use std::path::PathBuf;

/// The schema, compiled into the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// Every pool's options: each connection handed back goes through `release_check` before
/// it is lent again.
pub fn pool_options() -> PgPoolOptions {
    PgPoolOptions::new()
        .after_release(|conn, _meta| Box::pin(async move { Ok(release_check(conn).await) }))
}

/// How many times [`release_check`] asks: the first answers may still be those of
/// statements the borrower abandoned (its own statement, then a transaction's ROLLBACK).
const RELEASE_CHECK_ASKS: usize = 3;

/// Whether a connection handed back to the pool may be lent again; `false` closes it.
///
/// A connection handed back while the server still has a transaction open on it is closed,
/// never pooled again: a future cancelled during `Pool::begin`'s BEGIN round trip leaves the
/// session inside a transaction that sqlx does not know about (sqlx 0.8 and 0.9 do), and the
/// next borrower's statements would run inside it, holding their locks with nobody to commit
/// them. Outside a transaction block every statement is its own transaction, so `now()` (the
/// transaction's start) equals the statement's start; inside one it does not. Closing the
/// session is what releases the locks.
///
/// A borrower cancelled mid-statement (a timeout around its call, a Lambda killed) hands back
/// a connection whose statement still runs: sqlx reads that statement's answer before it
/// sends the check, so the check waits until the statement ends, which the role's
/// `statement_timeout` bounds (migrations/0011_role_timeouts.sql). An error answer of the
/// abandoned statement (57014 when the server cancelled it) arrives here as the check's error
/// and leaves the connection healthy: the check asks again. Any other failure closes the
/// connection, and never by returning `Err`: sqlx would close it *hard* then, which over
/// rustls first waits for the server to send a byte, and an idle server sends none, so the
/// pool slot would be lost. Closed gracefully, the connection sends Terminate and the server
/// hangs up.
async fn release_check(conn: &mut sqlx::PgConnection) -> bool {
    for _ in 0..RELEASE_CHECK_ASKS {
        // One simple-protocol message, so outside a transaction block the statement is the
        // whole implicit transaction (with Parse/Bind/Execute the statement's start comes
        // after the transaction's). Reads no table: nothing for `query!` to check.
        let asked = sqlx::raw_sql("select now() <> statement_timestamp()")
            .fetch_one(&mut *conn)
            .await;
        let row = match asked {
            Ok(row) => row,
            // The server's answer to an abandoned statement: read, ask again.
            Err(sqlx::Error::Database(_)) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "a connection handed back failed its check; closed");
                return false;
            }
        };
        let in_transaction = row.try_get::<bool, _>(0).unwrap_or(true);
        if in_transaction {
            tracing::warn!("a connection came back inside a transaction; closed");
        }
        return !in_transaction;
    }
    tracing::warn!("a connection handed back kept answering with errors; closed");
    false
}

/// The CA certificates compiled into every binary: what a verifying connection trusts unless
/// `DATABASE_CA_BUNDLE` names others. The file's header says where each one comes from.
pub static SHIPPED_CA_BUNDLE: &[u8] = include_bytes!("../../certs/aws-db-ca.pem");

/// Which CA certificates a verifying connection (`sslmode=verify-ca` or `verify-full`) trusts:
/// part of [`crate::infra::config::Config`] and of the migrate function's settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, clap::Args)]
pub struct CaBundle {
    /// PEM file of the CA certificates the database's certificate must chain to when the URL
    /// says sslmode=verify-full or verify-ca (as the one built from DATABASE_SECRET_ARN does).
    /// Replaces the bundle compiled in (the Amazon Trust Services roots of RDS Proxy and the
    /// RDS root CAs); unset, that bundle is used.
    #[arg(
        long = "database-ca-bundle",
        env = "DATABASE_CA_BUNDLE",
        value_name = "DATABASE_CA_BUNDLE"
    )]
    pub path: Option<PathBuf>,
}

impl CaBundle {
    /// A bundle read from `path`.
    pub fn file(path: impl Into<PathBuf>) -> Self {
        Self {
            path: Some(path.into()),
        }
    }

    /// The PEM text, checked to hold at least one certificate: a wrong path or an empty file
    /// fails the cold start naming the variable, not every connection later.
    pub fn pem(&self) -> anyhow::Result<Cow<'static, [u8]>> {
        let pem = match &self.path {
            None => Cow::Borrowed(SHIPPED_CA_BUNDLE),
            Some(path) => Cow::Owned(std::fs::read(path).map_err(|e| {
                anyhow::anyhow!("DATABASE_CA_BUNDLE {} cannot be read: {e}", path.display())
            })?),
        };
        use rustls::pki_types::{pem::PemObject, CertificateDer};
        let mut count = 0;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            cert.map_err(|e| anyhow::anyhow!("{} is not PEM: {e}", self.describe()))?;
            count += 1;
        }
        anyhow::ensure!(count > 0, "{} holds no certificate", self.describe());
        Ok(pem)
    }

    fn describe(&self) -> String {
        match &self.path {
            None => "the compiled-in CA bundle".into(),
            Some(path) => format!("DATABASE_CA_BUNDLE {}", path.display()),
        }
    }
}

/// `url` as connect options. In the verifying sslmodes the server must chain to `ca` (unless
/// the URL names its own `sslrootcert`); the other modes verify nothing, so `ca` is not read.
pub fn connect_options(url: &str, ca: &CaBundle) -> anyhow::Result<PgConnectOptions> {
    // sqlx's error could quote the URL, password and all: keep it out of the message.
    let options: PgConnectOptions = url.parse().map_err(|_| {
        anyhow::anyhow!(
            "the database URL is not a PostgreSQL URL: {}",
            crate::infra::secret::redacted(url)
        )
    })?;
    let verifying = matches!(
        options.get_ssl_mode(),
        PgSslMode::VerifyCa | PgSslMode::VerifyFull
    );
    if !verifying || names_root_cert(url) {
        return Ok(options);
    }
    Ok(options.ssl_root_cert_from_pem(ca.pem()?.into_owned()))
}

/// Whether the URL's query sets the CA file itself (`sslrootcert` or sqlx's aliases of it).
fn names_root_cert(url: &str) -> bool {
    let query = url.split_once('?').map(|(_, q)| q).unwrap_or("");
    let query = query.split('#').next().unwrap_or("");
    query.split('&').any(|pair| {
        let key = pair.split('=').next().unwrap_or("");
        matches!(key, "sslrootcert" | "ssl-root-cert" | "ssl-ca")
    })
}

/// A pool of at most `max_connections` with `options` (see [`connect_options`]), connected now.
pub async fn connect_to(
    options: PgConnectOptions,
    max_connections: u32,
    acquire_timeout: std::time::Duration,
) -> anyhow::Result<PgPool> {
    pool_options()
        .max_connections(max_connections)
        .acquire_timeout(acquire_timeout)
        .connect_with(options)
        .await
        .map_err(|e| anyhow::anyhow!("failed to connect to the database: {e}"))
}

/// The login roles `migrations/0006_roles.sql` creates, one per function, each granted what
/// that function's statements need (the file says what and why). `seckill-migrate` sets their
/// passwords and refuses any other name.
pub const ROLES: [&str; 5] = [
    "seckill_entry",
    "seckill_consumer",
    "seckill_preheat",
    "seckill_reconcile",
    "seckill_admin",
];

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

/// True for errors worth retrying later (connection lost, pool exhausted, I/O, the server out
/// of connections, a statement or an idle transaction the server ended for running past the
/// role's timeout), as opposed to a query the database refused.
pub fn is_transient(err: &sqlx::Error) -> bool {
    matches!(
        err,
        sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Tls(_)
    ) || matches!(err, sqlx::Error::Database(db) if db.code().is_some_and(|c| is_transient_code(&c)))
}

/// SQLSTATEs of [`is_transient`]: connection exceptions (08), insufficient resources (53, such
/// as 53300 when a role is at its connection limit), operator intervention (57P),
/// `query_canceled` (57014: the role's `statement_timeout`), the session ended for idling in a
/// transaction (25P03), serialization failures and deadlocks.
fn is_transient_code(code: &str) -> bool {
    code.starts_with("08")
        || code.starts_with("53")
        || code.starts_with("57P")
        || matches!(code, "57014" | "25P03" | "40001" | "40P01")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The DER of a certificate holds its subject's common name as plain text.
    fn names(pem: &[u8], cn: &str) -> bool {
        use rustls::pki_types::{pem::PemObject, CertificateDer};
        CertificateDer::pem_slice_iter(pem).any(|c| {
            c.unwrap()
                .as_ref()
                .windows(cn.len())
                .any(|w| w == cn.as_bytes())
        })
    }

    #[test]
    fn the_shipped_bundle_holds_rds_proxys_roots_and_the_rds_root_cas() {
        let pem = CaBundle::default().pem().unwrap();
        for cn in [
            "Amazon Root CA 1",
            "Amazon Root CA 2",
            "Amazon Root CA 3",
            "Amazon Root CA 4",
            "Starfield Services Root Certificate Authority - G2",
            "Amazon RDS us-east-1 Root CA RSA2048 G1",
            "Amazon RDS eu-west-1 Root CA RSA4096 G1",
            "Amazon RDS ap-northeast-1 Root CA ECC384 G1",
        ] {
            assert!(names(&pem, cn), "{cn} is missing");
        }
        assert!(!names(&pem, "Amazon RDS Root 2019 CA"), "expired in 2024");
    }

    #[test]
    fn the_verifying_modes_take_the_bundle_and_the_others_never_read_it() {
        let missing = CaBundle::file("/nonexistent/ca.pem");
        for mode in ["verify-full", "verify-ca"] {
            let url = format!("postgres://u:pw@proxy.example:5432/seckill?sslmode={mode}");
            let err = connect_options(&url, &missing).unwrap_err().to_string();
            assert!(err.contains("DATABASE_CA_BUNDLE"), "{err}");
            assert!(connect_options(&url, &CaBundle::default()).is_ok());
        }
        for url in [
            "postgres://postgres@127.0.0.1:5432/seckill",
            "postgres://u:pw@db.example/seckill?sslmode=require",
            "postgres://u:pw@db.example/seckill?sslmode=verify-full&sslrootcert=/etc/ca.pem",
        ] {
            assert!(connect_options(url, &missing).is_ok(), "{url}");
        }
    }

    #[test]
    fn a_bundle_without_a_certificate_is_refused() {
        let path = std::env::temp_dir().join(format!("seckill-ca-{}.pem", uuid::Uuid::new_v4()));
        std::fs::write(&path, "not a certificate\n").unwrap();
        let err = CaBundle::file(&path).pem().unwrap_err().to_string();
        std::fs::remove_file(&path).ok();
        assert!(err.contains("holds no certificate"), "{err}");
    }

    #[test]
    fn a_malformed_url_is_refused_without_its_password() {
        let err = connect_options("postgres://u:hunter2@[bad/db", &CaBundle::default())
            .unwrap_err()
            .to_string();
        assert!(!err.contains("hunter2"), "{err}");
    }
}
