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
    // Other tests migrate their databases at the same moment; these do as well, at once. (The
    // master users other tests make, `seckill_test_master_…`, are theirs.)
    let envs = futures::future::join_all((0..4).map(|_| new_env())).await;
    for env in &envs {
        db::migrate(&env.pool).await?;
        let roles: Vec<String> = sqlx::query_scalar(
            "select rolname::text from pg_roles where rolname like 'seckill\\_%' and rolcanlogin \
             and rolname not like 'seckill\\_test\\_%' order by 1",
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

/// The migrations apply as a managed database's master user does: a login with CREATEROLE and
/// CREATEDB, no superuser (a superuser passes every privilege check, so only this catches a
/// step only it may take). Once migrated, that owner sees no order row: `orders` forces its
/// row-level security on it too, and it keeps no membership that would pass a policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_migrations_apply_as_a_master_user_who_is_no_superuser() -> anyhow::Result<()> {
    let env = new_env().await;
    let master = format!(
        "seckill_test_master_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let database = format!("seckill_test_{}", uuid::Uuid::new_v4().simple());
    // Names of ours (UUIDs), never input: built into the statements, which take no binds.
    for sql in [
        format!("create role {master} login createrole createdb"),
        format!("create database {database} owner {master}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&env.pool)
            .await?;
    }
    let options: sqlx::postgres::PgConnectOptions = env.config.database_url.expose().parse()?;
    let owner = db::pool_options()
        .max_connections(2)
        .connect_with(options.username(&master).database(&database))
        .await?;

    let migrated = db::migrate(&owner).await;
    let seen: Result<i64, _> = sqlx::query_scalar("select count(*) from orders")
        .fetch_one(&owner)
        .await;
    let inserted = sqlx::raw_sql(
        "insert into activities (title, total_stock, remaining_stock, per_order_limit, start_at, \
             end_at, price_minor, currency) values ('t', 1, 1, 1, now(), now() + interval '1 h', \
             1, 'usd');
         insert into orders (request_id, activity_id, user_id, quantity, status)
             select gen_random_uuid(), id, 'u', 1, 'failed' from activities",
    )
    .execute(&owner)
    .await;
    owner.close().await;
    for sql in [
        format!("drop database {database} with (force)"),
        format!("drop owned by {master}"),
        format!("drop role {master}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&env.pool)
            .await?;
    }

    migrated?;
    assert_eq!(seen?, 0);
    match inserted {
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42501") => {}
        other => {
            panic!("the owner's insert of an order is refused by the table's policies: {other:?}")
        }
    }
    Ok(())
}

/// The migrations from 0022 on, applied as a managed database's master user over a database
/// that already holds orders (made by a superuser, as the functions' roles would have made
/// them): 0022's backfill reaches them although `orders` forces its row-level security on its
/// owner, so every live order gets its sale's price and the migration's constraint holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_price_backfill_reaches_every_order_as_the_master_user() -> anyhow::Result<()> {
    let env = new_env().await;
    let master = format!(
        "seckill_test_master_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let database = format!("seckill_test_{}", uuid::Uuid::new_v4().simple());
    for sql in [
        format!("create role {master} login createrole createdb"),
        format!("create database {database} owner {master}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&env.pool)
            .await?;
    }
    let options: sqlx::postgres::PgConnectOptions = env.config.database_url.expose().parse()?;
    let owner = db::pool_options()
        .max_connections(2)
        .connect_with(options.clone().username(&master).database(&database))
        .await?;
    let superuser = db::pool_options()
        .max_connections(1)
        .connect_with(options.database(&database))
        .await?;
    let outcome = async {
        db::MIGRATOR.run_to(21, &owner).await?;
        sqlx::raw_sql(
            "insert into activities (title, total_stock, remaining_stock, per_order_limit, \
                 start_at, end_at, price_minor, currency) \
                 values ('t', 9, 7, 3, now(), now() + interval '1 h', 1999, 'eur');
             insert into orders (request_id, activity_id, user_id, quantity, status)
                 select gen_random_uuid(), id, 'paid-buyer', 1, 'paid' from activities;
             insert into orders (request_id, activity_id, user_id, quantity, status)
                 select gen_random_uuid(), id, 'confirmed-buyer', 1, 'confirmed' from activities;
             insert into orders (request_id, activity_id, user_id, quantity, status, failure_reason)
                 select gen_random_uuid(), id, 'refused-buyer', 1, 'failed', 'sold_out'
                 from activities",
        )
        .execute(&superuser)
        .await?;
        db::migrate(&owner).await?;
        let prices: Vec<(String, Option<i64>, Option<String>)> = sqlx::query_as(
            "select status, unit_price_minor, currency from orders order by user_id",
        )
        .fetch_all(&superuser)
        .await?;
        let forced: bool =
            sqlx::query_scalar("select relforcerowsecurity from pg_class where relname = 'orders'")
                .fetch_one(&superuser)
                .await?;
        anyhow::Ok((prices, forced))
    }
    .await;
    owner.close().await;
    superuser.close().await;
    for sql in [
        format!("drop database {database} with (force)"),
        format!("drop owned by {master}"),
        format!("drop role {master}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&env.pool)
            .await?;
    }

    let (prices, forced) = outcome?;
    assert_eq!(
        prices,
        vec![
            ("confirmed".to_string(), Some(1999), Some("eur".to_string())),
            ("paid".to_string(), Some(1999), Some("eur".to_string())),
            ("failed".to_string(), None, None),
        ]
    );
    assert!(forced, "the table forces its row-level security again");
    Ok(())
}
