//! The database pool against a session left inside a transaction sqlx does not know about
//! (what a future cancelled during `Pool::begin`'s BEGIN round trip leaves behind).

use seckill_shared::infra::db;
use seckill_shared::testing;
use sqlx::Row;
use std::time::Duration;

/// A connection goes back to the pool while the server has a transaction open on it: the
/// pool closes it, so the next borrower gets a clean session, and the rows the stale
/// transaction locked are free for everyone else.
#[tokio::test]
async fn a_connection_returned_inside_a_transaction_is_closed_not_lent_again() -> anyhow::Result<()>
{
    let (url, setup) = testing::fresh_database().await?;
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
