//! The roles as the migration makes them: each logs in with no attribute and creates nothing, and
//! migrating again, in parallel too, keeps one set of roles.

use crate::{new_env, pool_as, refused};
use seckill_shared::infra::db;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_role_logs_in_with_no_attribute_and_creates_nothing() -> anyhow::Result<()> {
    let env = new_env().await;
    for role in db::ROLES {
        let pool = pool_as(&env, role).await;
        let (me, attributes): (String, bool) = sqlx::query_as(
            "select current_user::text, rolsuper or rolcreatedb or rolcreaterole \
                 or rolreplication or rolbypassrls
             from pg_roles where rolname = current_user",
        )
        .fetch_one(&pool)
        .await?;
        assert_eq!((me.as_str(), attributes), (role, false));
        refused(&pool, "create table t (i int)").await;
        refused(&pool, "create temporary table t (i int)").await;
        refused(
            &pool,
            "create function f() returns int language sql as 'select 1'",
        )
        .await;
        refused(&pool, "drop table orders").await;
        refused(&pool, "truncate activities").await;
        refused(&pool, "delete from activities").await;
        refused(&pool, "delete from orders").await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrating_again_and_in_parallel_keeps_one_set_of_roles() -> anyhow::Result<()> {
    // Other tests migrate their databases at the same moment; these do as well, at once.
    let envs = futures::future::join_all((0..4).map(|_| new_env())).await;
    for env in &envs {
        db::migrate(&env.pool).await?;
        let roles: Vec<String> = sqlx::query_scalar(
            "select rolname::text from pg_roles where rolname like 'seckill\\_%' and rolcanlogin \
             order by 1",
        )
        .fetch_all(&env.pool)
        .await?;
        let mut want: Vec<&str> = db::ROLES.to_vec();
        want.sort();
        assert_eq!(roles, want);
    }
    Ok(())
}

/// The owner of the functions through which the entry changes an order (`seckill_definer`)
/// logs in never and holds no attribute, and `orders` keeps its row-level security for its
/// owner too: a path of the owner that slips into a function is refused its rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_functions_owner_never_logs_in_and_orders_force_their_policies() -> anyhow::Result<()> {
    let env = new_env().await;
    let (login, attributes): (bool, bool) = sqlx::query_as(
        "select rolcanlogin, rolsuper or rolcreatedb or rolcreaterole or rolreplication \
             or rolbypassrls
         from pg_roles where rolname = 'seckill_definer'",
    )
    .fetch_one(&env.pool)
    .await?;
    assert_eq!((login, attributes), (false, false));
    let forced: bool =
        sqlx::query_scalar("select relforcerowsecurity from pg_class where relname = 'orders'")
            .fetch_one(&env.pool)
            .await?;
    assert!(forced);
    Ok(())
}
