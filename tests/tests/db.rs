//! The database pool against a session left inside a transaction sqlx does not know about
//! (what a future cancelled during `Pool::begin`'s BEGIN round trip leaves behind), and the
//! bounds the server keeps on each function's role (`migrations/0011_role_timeouts.sql`): its
//! statement timeout, its idle-in-transaction timeout and its connection limit.
//!
//! Roles are cluster-wide: the settings read here are the ones the test database's migration
//! wrote (or found already written by another database's). Locally the roles log in without a
//! password (trust auth on 127.0.0.1).

use seckill_shared::infra::db;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, PgConnection, Row};
use std::time::{Duration, Instant};

/// A connection goes back to the pool while the server has a transaction open on it: the
/// pool closes it, so the next borrower gets a clean session, and the rows the stale
/// transaction locked are free for everyone else.
#[tokio::test]
async fn a_connection_returned_inside_a_transaction_is_closed_not_lent_again() -> anyhow::Result<()>
{
    let (url, setup) = testkit::fresh_database().await?;
    sqlx::raw_sql("create table t (id int primary key, n int); insert into t values (1, 0)")
        .execute(&setup)
        .await?;
    let pool = db::pool_options()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&url)
        .await?;

    let mut conn = pool.acquire().await?;
    // BEGIN sent outside sqlx's transaction tracking, then a row lock taken inside it.
    sqlx::raw_sql("begin; update t set n = 1 where id = 1")
        .execute(&mut *conn)
        .await?;
    drop(conn);

    let mut next = pool.acquire().await?;
    let in_transaction: bool = sqlx::raw_sql("select now() <> statement_timestamp()")
        .fetch_one(&mut *next)
        .await?
        .try_get(0)?;
    assert!(
        !in_transaction,
        "the pool lent out the session of the stale transaction"
    );
    drop(next);
    // Nobody committed the stale update, and nothing waits on its lock.
    let n: i32 = tokio::time::timeout(
        Duration::from_secs(5),
        sqlx::query_scalar("update t set n = n + 10 where id = 1 returning n").fetch_one(&setup),
    )
    .await??;
    assert_eq!(n, 10);
    Ok(())
}

/// One role's row of `migrations/0011_role_timeouts.sql`.
#[derive(Debug, PartialEq, Eq)]
struct RoleBounds {
    role: String,
    statement_timeout: Duration,
    idle_in_transaction_timeout: Duration,
    connection_limit: i32,
}

/// The rows of the migration's `values` list, as the file says them: what the server must hold.
fn migration_bounds() -> Vec<RoleBounds> {
    let sql = include_str!("../../migrations/0011_role_timeouts.sql");
    let millis = |v: &str| -> Duration {
        let v = v.trim().trim_matches('\'');
        Duration::from_millis(v.strip_suffix("ms").expect("in ms").parse().unwrap())
    };
    sql.lines()
        .map(str::trim)
        .filter(|l| l.starts_with("('seckill_"))
        .map(|l| {
            let fields: Vec<&str> = l
                .trim_start_matches('(')
                .trim_end_matches(',')
                .trim_end_matches(')')
                .split(',')
                .map(str::trim)
                .collect();
            RoleBounds {
                role: fields[0].trim_matches('\'').to_string(),
                statement_timeout: millis(fields[1]),
                idle_in_transaction_timeout: millis(fields[2]),
                connection_limit: fields[3].parse().unwrap(),
            }
        })
        .collect()
}

/// A session on the test's database logged in as `role`.
async fn connect_as(url: &str, role: &str) -> PgConnection {
    let options: PgConnectOptions = url.parse().expect("a PostgreSQL URL");
    options
        .username(role)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("{role} logs in: {e}"))
}

/// The bound `role`'s migration row gives, by name.
fn bounds_of<'a>(all: &'a [RoleBounds], role: &str) -> &'a RoleBounds {
    all.iter()
        .find(|b| b.role == role)
        .unwrap_or_else(|| panic!("no row for {role}"))
}

#[tokio::test]
async fn every_role_has_the_bounds_its_migration_names() -> anyhow::Result<()> {
    let (_url, pool) = testkit::fresh_database().await?;
    let wanted = migration_bounds();
    let mut roles: Vec<&str> = wanted.iter().map(|b| b.role.as_str()).collect();
    roles.sort_unstable();
    let mut all = db::ROLES.to_vec();
    all.sort_unstable();
    assert_eq!(roles, all, "one row per function's role");
    for b in &wanted {
        let (limit, config): (i32, Vec<String>) = sqlx::query_as(
            "select rolconnlimit, coalesce(rolconfig, '{}') from pg_roles where rolname = $1",
        )
        .bind(&b.role)
        .fetch_one(&pool)
        .await?;
        assert_eq!(limit, b.connection_limit, "{}: connection limit", b.role);
        for setting in [
            format!("statement_timeout={}ms", b.statement_timeout.as_millis()),
            format!(
                "idle_in_transaction_session_timeout={}ms",
                b.idle_in_transaction_timeout.as_millis()
            ),
        ] {
            assert!(
                config.contains(&setting),
                "{}: {setting} not in {config:?}",
                b.role
            );
        }
    }
    Ok(())
}

/// Each role's long statement is cancelled by the server at the role's statement timeout, with
/// SQLSTATE 57014, which the functions answer as "out of reach, retry" (503), never as a 500.
#[tokio::test]
async fn a_roles_long_statement_is_cancelled_by_the_server_at_its_timeout() -> anyhow::Result<()> {
    let (url, _pool) = testkit::fresh_database().await?;
    let bounds = migration_bounds();
    let runs = bounds.iter().map(|b| {
        let url = url.clone();
        async move {
            let mut conn = connect_as(&url, &b.role).await;
            let started = Instant::now();
            let err = sqlx::query("select pg_sleep(60)")
                .execute(&mut conn)
                .await
                .expect_err("a sleep past the statement timeout");
            let took = started.elapsed();
            (b, err, took)
        }
    });
    for (b, err, took) in futures::future::join_all(runs).await {
        let code = match &err {
            sqlx::Error::Database(e) => e.code().map(|c| c.into_owned()),
            _ => None,
        };
        assert_eq!(code.as_deref(), Some("57014"), "{}: {err}", b.role);
        assert!(
            took >= b.statement_timeout && took < b.statement_timeout + Duration::from_secs(2),
            "{}: cancelled after {took:?}, its timeout is {:?}",
            b.role,
            b.statement_timeout
        );
        assert!(db::is_transient(&err), "{}: 57014 must be a 503", b.role);
    }
    Ok(())
}

/// A session of the hot path's roles that stops talking inside a transaction (a Lambda frozen
/// or killed between two statements) is ended by the server at the role's idle-in-transaction
/// timeout, and what the transaction held is free again.
#[tokio::test]
async fn a_session_idle_in_a_transaction_is_ended_by_the_server() -> anyhow::Result<()> {
    let (url, pool) = testkit::fresh_database().await?;
    let bounds = migration_bounds();
    let runs = ["seckill_entry", "seckill_consumer"]
        .into_iter()
        .enumerate()
        .map(|(i, role)| {
            let (url, pool, b) = (url.clone(), pool.clone(), bounds_of(&bounds, role));
            async move {
                let key = 0x5ec_0011_i64 + i as i64;
                let mut conn = connect_as(&url, role).await;
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "begin; select pg_advisory_xact_lock({key})"
                )))
                .execute(&mut conn)
                .await
                .unwrap();
                let free = || async {
                    sqlx::query_scalar::<_, bool>(
                        "select pg_try_advisory_lock($1) and pg_advisory_unlock($1)",
                    )
                    .bind(key)
                    .fetch_one(&pool)
                    .await
                    .unwrap()
                };
                assert!(!free().await, "{role}: the transaction holds its lock");
                tokio::time::sleep(b.idle_in_transaction_timeout + Duration::from_millis(500))
                    .await;
                assert!(
                    free().await,
                    "{role}: the idle transaction's lock was released"
                );
                let after = sqlx::query("select 1").execute(&mut conn).await;
                assert!(after.is_err(), "{role}: the idle session is still open");
                let err = after.unwrap_err();
                let ended = match &err {
                    sqlx::Error::Database(e) => e.code().as_deref() == Some("25P03"),
                    _ => true,
                };
                assert!(ended && db::is_transient(&err), "{role}: {err:?}");
            }
        });
    futures::future::join_all(runs).await;
    Ok(())
}
