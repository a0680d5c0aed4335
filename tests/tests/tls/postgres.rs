//! PostgreSQL over TLS (`verify-full`): a connection only with the right CA and host name, the
//! migration setting a role's password over it, a borrower cancelled mid-statement giving its
//! connection back, and many databases migrated at once on a new server sharing one set of roles.

use crate::{
    assert_refused_certificate, connect, make_certs, temp_dir, TlsPostgres, MASTER_PASSWORD,
};
use seckill_migrate::MigrateConfig;
use seckill_shared::infra::aws_secrets::RoleSecret;
use seckill_shared::infra::config::SecretRefs;
use seckill_shared::infra::db;
use seckill_shared::infra::db::CaBundle;
use sqlx::Connection;
use std::time::Duration;

#[tokio::test]
async fn verify_full_connects_only_with_the_right_ca_and_host_name() -> anyhow::Result<()> {
    let pg = TlsPostgres::start();
    let url = pg.url("localhost", "seckill", MASTER_PASSWORD, "postgres");
    assert!(url.ends_with("sslmode=verify-full"), "{url}");

    let mut conn = connect(&url, &pg.ca()).await?;
    let (ssl, me): (bool, String) = sqlx::query_as(
        "select ssl, current_user::text from pg_stat_ssl where pid = pg_backend_pid()",
    )
    .fetch_one(&mut conn)
    .await?;
    assert_eq!((ssl, me.as_str()), (true, "seckill"));
    conn.close().await?;

    // Another CA of the same name (an impostor's), and the bundle compiled in (AWS's roots),
    // do not vouch for this server.
    let other = temp_dir("tls-other-ca");
    make_certs(&other, "DNS:localhost");
    for (what, ca, why) in [
        (
            "another CA",
            CaBundle::file(other.join("ca.pem")),
            "BadSignature",
        ),
        (
            "the compiled-in bundle",
            CaBundle::default(),
            "UnknownIssuer",
        ),
    ] {
        let err = connect(&url, &ca).await.expect_err(what);
        assert_refused_certificate(&err, why);
    }
    std::fs::remove_dir_all(&other).ok();

    // The right CA, but a name the certificate does not carry: an address, not `localhost`.
    let by_address = pg.url("127.0.0.1", "seckill", MASTER_PASSWORD, "postgres");
    let err = connect(&by_address, &pg.ca())
        .await
        .expect_err("wrong host name");
    assert_refused_certificate(&err, "NotValidForName");

    // What `sslmode=require` (the URL before) accepted: any certificate at all.
    let unchecked = by_address.replace("sslmode=verify-full", "sslmode=require");
    connect(&unchecked, &CaBundle::default())
        .await?
        .close()
        .await?;
    Ok(())
}

/// What `seckill-migrate` does in AWS, over verify-full as the master: the database `seckill`
/// created on `pg` and migrated, and the entry role's password set to `entry_password`.
/// Returns the master's URL of that database and the migration's report.
async fn migrate_with_entry_password(
    pg: &TlsPostgres,
    entry_password: &str,
) -> anyhow::Result<(String, serde_json::Value)> {
    let admin = pg.url("localhost", "seckill", MASTER_PASSWORD, "postgres");
    let mut conn = connect(&admin, &pg.ca()).await?;
    sqlx::raw_sql("create database seckill")
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    let master = pg.url("localhost", "seckill", MASTER_PASSWORD, "seckill");
    let config = MigrateConfig {
        database_url: Some(master.clone().into()),
        secrets: SecretRefs::default(),
        redis_url: None,
        redis_cluster: false,
        database_ca: pg.ca(),
        db_acquire_timeout: Duration::from_secs(10),
    };
    let report = seckill_migrate::migrate(&config).await?;
    let secret = RoleSecret::parse(
        &serde_json::json!({"username": "seckill_entry", "password": entry_password}).to_string(),
    )?;
    let options = db::connect_options(&master, &pg.ca())?;
    let set = seckill_migrate::set_role_passwords(options, &[secret]).await?;
    assert_eq!(set, ["seckill_entry"]);
    Ok((master, report))
}

#[tokio::test]
async fn migrate_over_verify_full_sets_a_role_password_that_logs_the_role_in() -> anyhow::Result<()>
{
    let pg = TlsPostgres::start();
    let password = "an-entry-password-from-its-secret";
    let (master, report) = migrate_with_entry_password(&pg, password).await?;
    assert!(report["latest"].as_i64() >= Some(6), "{report}");

    let entry = pg.url("localhost", "seckill_entry", password, "seckill");
    let mut conn = connect(&entry, &pg.ca()).await?;
    let me: String = sqlx::query_scalar("select current_user::text")
        .fetch_one(&mut conn)
        .await?;
    assert_eq!(me, "seckill_entry");
    conn.close().await?;
    let wrong = pg.url("localhost", "seckill_entry", "not-its-password", "seckill");
    match connect(&wrong, &pg.ca()).await {
        Err(sqlx::Error::Database(e)) => assert_eq!(e.code().as_deref(), Some("28P01")),
        other => panic!("a wrong password logged in: {other:?}"),
    }
    // The server holds a verifier, never the password.
    let mut conn = connect(&master, &pg.ca()).await?;
    let stored: String =
        sqlx::query_scalar("select rolpassword from pg_authid where rolname = 'seckill_entry'")
            .fetch_one(&mut conn)
            .await?;
    assert!(stored.starts_with("SCRAM-SHA-256$4096:") && !stored.contains(password));
    Ok(())
}

/// How long the test's pool waits for its one connection: longer than the entry role's
/// statement timeout (migrations/0011_role_timeouts.sql), which ends an abandoned statement.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// Runs `sql` on `conn` in a task and aborts the task once the server is running it: a
/// borrower cancelled mid-statement (a timeout around its call, a Lambda killed), its
/// connection (or transaction) dropped with the statement still running.
async fn abandon_mid_statement<C>(mut conn: C, sql: &'static str, watch: &mut sqlx::PgConnection)
where
    C: std::ops::DerefMut<Target = sqlx::PgConnection> + Send + 'static,
{
    let borrower = tokio::spawn(async move {
        let _ = sqlx::query(sql).execute(&mut *conn).await;
    });
    let started = std::time::Instant::now();
    loop {
        let running: i64 = sqlx::query_scalar(
            "select count(*) from pg_stat_activity
             where usename = 'seckill_entry' and state = 'active' and query = $1",
        )
        .bind(sql)
        .fetch_one(&mut *watch)
        .await
        .unwrap();
        if running > 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the server never ran {sql}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    borrower.abort();
    assert!(borrower.await.is_err_and(|e| e.is_cancelled()));
}

/// A borrower cancelled in the middle of a long statement, alone or inside a transaction,
/// over TLS (as to RDS Proxy): the pool's only connection is lent again before the pool's
/// acquire timeout, in a session outside any transaction, twenty times in a row. The
/// server's statement timeout for the role ends the abandoned statement, and the release
/// check then hands the connection back or closes it gracefully; it never turns the
/// abandoned statement's error into a hard close, which over rustls waits for a byte the
/// idle server never sends, holding the slot for good.
#[tokio::test]
async fn a_borrower_cancelled_mid_statement_gives_the_tls_connection_back() -> anyhow::Result<()> {
    let pg = TlsPostgres::start();
    let password = "an-entry-password-from-its-secret";
    let (master, _) = migrate_with_entry_password(&pg, password).await?;
    let mut watch = connect(&master, &pg.ca()).await?;
    let entry = pg.url("localhost", "seckill_entry", password, "seckill");
    let pool = db::pool_options()
        .max_connections(1)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(db::connect_options(&entry, &pg.ca())?)
        .await?;
    let lent_again = |what: String| {
        let pool = pool.clone();
        async move {
            let asked = std::time::Instant::now();
            let mut conn = match pool.acquire().await {
                Ok(conn) => conn,
                Err(e) => panic!(
                    "{what}: no connection after {:?} ({e}); the abandoned statement holds \
                     the slot",
                    asked.elapsed()
                ),
            };
            // One simple-protocol statement: outside a transaction block it is the whole
            // implicit transaction, so `now()` (the transaction's start) is its own start.
            let in_transaction: bool = sqlx::raw_sql("select now() <> statement_timestamp()")
                .fetch_one(&mut *conn)
                .await
                .and_then(|row| sqlx::Row::try_get(&row, 0))
                .unwrap_or_else(|e| panic!("{what}: the connection lent again fails: {e}"));
            assert!(!in_transaction, "{what}: lent inside a transaction");
        }
    };
    for round in 1..=20 {
        let conn = pool.acquire().await?;
        abandon_mid_statement(conn, "select pg_sleep(30)", &mut watch).await;
        lent_again(format!("round {round}, a statement")).await;

        let tx = pool.begin().await?;
        abandon_mid_statement(tx, "select pg_sleep(31)", &mut watch).await;
        lent_again(format!("round {round}, a statement in a transaction")).await;
    }
    Ok(())
}

/// A server that has never seen the functions' roles, eight databases migrated at once (as
/// the tests and several stacks' deploys do): every migration succeeds, although each creates
/// the cluster-wide roles and sets their bounds at the same moment, and each role ends with
/// the bounds `migrations/0011_role_timeouts.sql` names.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_databases_migrated_at_once_on_a_new_server_share_one_set_of_role_bounds(
) -> anyhow::Result<()> {
    let pg = TlsPostgres::start();
    let admin = pg.url("localhost", "seckill", MASTER_PASSWORD, "postgres");
    let mut conn = connect(&admin, &pg.ca()).await?;
    let names: Vec<String> = (0..8).map(|i| format!("seckill_{i}")).collect();
    for name in &names {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("create database {name}")))
            .execute(&mut conn)
            .await?;
    }
    let migrations = names.iter().map(|name| {
        let config = MigrateConfig {
            database_url: Some(pg.url("localhost", "seckill", MASTER_PASSWORD, name).into()),
            secrets: SecretRefs::default(),
            redis_url: None,
            redis_cluster: false,
            database_ca: pg.ca(),
            db_acquire_timeout: Duration::from_secs(10),
        };
        async move { seckill_migrate::migrate(&config).await }
    });
    for (name, migrated) in names
        .iter()
        .zip(futures::future::join_all(migrations).await)
    {
        migrated.unwrap_or_else(|e| panic!("{name}: {e:#}"));
    }
    let rows: Vec<(String, i32, Vec<String>)> = sqlx::query_as(
        "select rolname::text, rolconnlimit, coalesce(rolconfig, '{}') from pg_roles
         where rolname like 'seckill\\_%' and rolcanlogin order by 1",
    )
    .fetch_all(&mut conn)
    .await?;
    let mut want = db::ROLES.to_vec();
    want.sort_unstable();
    assert_eq!(
        rows.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
        want,
        "{rows:?}"
    );
    for (role, limit, config) in &rows {
        assert!(*limit > 0, "{role}: no connection limit");
        for setting in ["statement_timeout=", "idle_in_transaction_session_timeout="] {
            assert_eq!(
                config.iter().filter(|c| c.starts_with(setting)).count(),
                1,
                "{role}: {config:?}"
            );
        }
    }
    Ok(())
}
