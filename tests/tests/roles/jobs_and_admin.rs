//! The scheduled jobs and the admin on their roles: preheat loads and rebuilds a lost sale,
//! reconcile repairs, releases and records, the admin creates, changes and reads sales.

use crate::{login_as, new_env, pool_as, refused, ADMIN};
use axum::http::StatusCode;
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use seckill_shared::domain::activity;
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::order;
use seckill_shared::domain::settings::NewActivity;
use seckill_shared::domain::status::OrderStatus;
use serde_json::json;
use std::time::Duration;
use testkit::call;
use testkit::request;
use testkit::TestEnv;
use testkit::{after_grace, consume, db_remaining, reserve, set_db_stock_by_hand};

/// Preheat as `seckill_preheat`: loads a sale it finds due (fencing token and load epoch
/// recorded), and rebuilds a lost sale's buyers from the live orders.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_preheat_role_loads_sales_and_rebuilds_a_lost_one() -> anyhow::Result<()> {
    let env = new_env().await;
    let now = Utc::now();
    let due = insert(
        &env,
        now + ChronoDuration::minutes(5),
        now + ChronoDuration::hours(1),
    )
    .await;
    let running = env.open_activity(5, 1).await?;
    let rid = reserve(&env, running.id, "alice", 1)
        .await
        .attempt
        .request_id;
    consume(&env, running.id, "alice", rid, 1).await?;
    testkit::lose_activity(&env.redis, running.id).await?;
    let login = login_as(&env, "seckill_preheat").await;
    let preheat = env.preheat_with(|c| login.on(c));

    let report = preheat.run(Utc::now()).await?;

    assert!(
        report.errors.is_empty() && report.busy_ids.is_empty(),
        "{report:?}"
    );
    assert!(report.loaded_ids.contains(&due.id), "{report:?}");
    assert!(report.loaded_ids.contains(&running.id), "{report:?}");
    assert!(
        testkit::is_participant(&env, running.id, "alice").await,
        "alice's order came back as her quota"
    );
    let preheat = pool_as(&env, "seckill_preheat").await;
    refused(
        &preheat,
        "insert into orders (request_id, activity_id, user_id, quantity, status) \
         select gen_random_uuid(), id, 'mallory', 1, 'confirmed' from activities",
    )
    .await;
    refused(&preheat, "update orders set status = 'cancelled'").await;
    refused(&preheat, "update activities set remaining_stock = 0").await;
    refused(&preheat, "select failure_reason from orders").await;
    Ok(())
}

/// An activity in the database only (not loaded into Redis), written as the admin does; the
/// body as the admin API takes it, so a field added later keeps its default.
pub async fn insert(env: &TestEnv, start_at: DateTime<Utc>, end_at: DateTime<Utc>) -> Activity {
    let new: NewActivity = serde_json::from_value(json!({
        "title": "roles test",
        "totalStock": 5,
        "perOrderLimit": 1,
        "priceMinor": 1999,
        "currency": "usd",
        "startAt": start_at,
        "endAt": end_at,
    }))
    .unwrap();
    activity::insert(&env.pool, &new.settings().unwrap())
        .await
        .unwrap()
}

/// Reconcile as `seckill_reconcile`: a stale reservation claimed `failed` and given back, a
/// buyer's lost field restored from her live order, the database's stock repaired under the
/// row lock, an unpaid order cancelled by the payment timeout, its stats row written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_reconcile_role_repairs_releases_and_records() -> anyhow::Result<()> {
    let mut env = new_env().await;
    env.config.reconcile_grace = Duration::from_secs(5);
    env.config.payment_timeout = Duration::from_secs(3600);
    let a = env.open_activity(10, 5).await?;
    let unpaid = reserve(&env, a.id, "alice", 2).await.attempt.request_id;
    let unpaid = consume(&env, a.id, "alice", unpaid, 2).await?;
    let stale = reserve(&env, a.id, "bob", 1).await.attempt.request_id;
    assert!(testkit::lose_field(&env.redis, a.id, "alice").await?);
    let login = login_as(&env, "seckill_reconcile").await;
    let job = env.reconcile_with(|c| login.on(c));

    let report = job.run(after_grace(env.config.reconcile_grace)).await?;
    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(report.activity(a.id).unwrap().compensated, 1, "{report:?}");
    assert_eq!(
        report.activity(a.id).unwrap().fields_restored,
        1,
        "{report:?}"
    );
    let bob = order::by_request(&env.pool, stale).await?.unwrap();
    assert_eq!(bob.status, OrderStatus::Failed);

    set_db_stock_by_hand(&env, a.id, 3).await;
    let report = job.run(Utc::now()).await?;
    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(report.activity(a.id).unwrap().db_stock_fixed_from, Some(3));
    assert_eq!(db_remaining(&env, a.id).await, 8);

    let past_timeout = Utc::now() + ChronoDuration::hours(1) + ChronoDuration::seconds(1);
    let report = job.run(past_timeout).await?;
    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(report.released_unpaid, 1, "{report:?}");
    assert_eq!(
        order::get(&env.pool, unpaid).await?.unwrap().status,
        OrderStatus::Cancelled
    );
    assert_eq!(db_remaining(&env, a.id).await, 10);
    let stats = activity::stats(&env.pool, a.id)
        .await?
        .expect("a stats row");
    assert_eq!(stats.sold, 0);

    let reconcile = pool_as(&env, "seckill_reconcile").await;
    refused(&reconcile, "update orders set quantity = 1").await;
    refused(&reconcile, "update activities set total_stock = 1000").await;
    refused(&reconcile, "update activities set title = 'x'").await;
    refused(
        &reconcile,
        "insert into activities (title, total_stock, remaining_stock, per_order_limit, \
             start_at, end_at) values ('x', 1, 1, 1, now(), now() + interval '1 hour')",
    )
    .await;
    Ok(())
}

/// Admin as `seckill_admin` over its router: create a sale (loaded under the fenced lock, as
/// it starts within the preheat lead), change it, read it back with its sold quantity, list.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_admin_role_creates_changes_and_reads_sales() -> anyhow::Result<()> {
    let env = new_env().await;
    let login = login_as(&env, "seckill_admin").await;
    let app = env.admin_router_with(|c| login.on(c));
    let now = Utc::now();
    let body = json!({
        "title": "roles sale",
        "totalStock": 5,
        "perOrderLimit": 1,
        "priceMinor": 1999,
        "currency": "usd",
        "startAt": now - ChronoDuration::minutes(1),
        "endAt": now + ChronoDuration::hours(1),
    });

    let (status, created) = call(
        &app,
        request(
            "POST",
            "/admin/activities",
            Some(ADMIN),
            Some(&body.to_string()),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["id"].as_i64().unwrap();
    let rid = reserve(&env, id, "alice", 1).await.attempt.request_id;
    consume(&env, id, "alice", rid, 1).await?;
    let path = format!("/admin/activities/{id}");
    let (status, updated) = call(
        &app,
        request(
            "PUT",
            &path,
            Some(ADMIN),
            Some(r#"{"totalStock": 8, "title": "bigger"}"#),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{updated}");
    assert_eq!(updated["totalStock"], 8);
    let (status, shown) = call(&app, request("GET", &path, Some(ADMIN), None)).await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert_eq!(shown["stats"]["confirmedQuantity"], 1, "{shown}");
    let (status, listed) = call(&app, request("GET", "/admin/activities", Some(ADMIN), None)).await;
    assert_eq!(status, StatusCode::OK, "{listed}");

    let admin = pool_as(&env, "seckill_admin").await;
    refused(&admin, "update orders set status = 'cancelled'").await;
    refused(
        &admin,
        "insert into orders (request_id, activity_id, user_id, quantity, status) \
         select gen_random_uuid(), id, 'mallory', 1, 'confirmed' from activities",
    )
    .await;
    refused(&admin, "select failure_reason from orders").await;
    // The operator page reads reconcile's stats; only reconcile writes them.
    let (status, ops) = call(&app, request("GET", "/admin/ops", Some(ADMIN), None)).await;
    assert_eq!(status, StatusCode::OK, "{ops}");
    refused(&admin, "delete from activity_stats").await;
    // It reads the payments it lists, a column each, and changes none.
    refused(&admin, "update payments set refund_state = 'refunded'").await;
    refused(&admin, "select provider, status from payments").await;
    refused(&admin, "select unit_price_minor from orders").await;
    refused(
        &admin,
        "insert into activity_stats (activity_id, participants, sold, \
             db_remaining, pending_qty, drift) values (1, 0, 0, 0, 0, 0)",
    )
    .await;
    Ok(())
}
