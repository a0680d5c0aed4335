//! The functions' least-privilege database roles (`migrations/0006_roles.sql`): each function's
//! real code paths run with a pool logged in as its role, so a grant its statements need and
//! the migration lacks fails here; and statements outside the role are refused with SQLSTATE
//! 42501 (insufficient_privilege, which row-level security's refusals share).
//!
//! The same runs log in to Redis as each function's ACL user (scripts/redis_acl.py; the
//! scripts' commands, keys under `seckill:`), so a command a function's path sends and its user
//! lacks fails here too; and each user is refused what its function does not run (NOPERM).
//!
//! Locally the roles log in without a password (trust auth on 127.0.0.1), the Redis users with
//! `local-<user>` (scripts/stack.sh creates them); the test database is migrated, and the sales
//! are set up, as the master user and the default Redis user, as in AWS.

use aws_lambda_events::event::sqs::SqsEvent;
use axum::http::StatusCode;
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use seckill_shared::domain::activity;
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::order;
use seckill_shared::domain::order::reason;
use seckill_shared::domain::purchase::OrderMessage;
use seckill_shared::domain::settings::NewActivity;
use seckill_shared::infra::config::RedisTopology;
use seckill_shared::infra::db;
use seckill_shared::infra::sqs::OrderQueue;
use seckill_shared::store::conn::Redis;
use seckill_shared::Context;
use serde_json::json;
use sqlx::postgres::PgConnectOptions;
use sqlx::PgPool;
use std::collections::BTreeSet;
use std::time::Duration;
use testkit::call;
use testkit::request;
use testkit::RedisKind;
use testkit::TestEnv;
use testkit::{after_grace, consume, db_remaining, reserve, set_db_stock};
use uuid::Uuid;

const ADMIN: (&str, &str) = ("ops", "seckill:admin");

/// A pool on the test's database logged in as `role`.
async fn pool_as(env: &TestEnv, role: &str) -> PgPool {
    let options: PgConnectOptions = env
        .config
        .database_url
        .expose()
        .parse()
        .expect("a PostgreSQL URL");
    db::pool_options()
        .max_connections(4)
        .connect_with(options.username(role))
        .await
        .unwrap_or_else(|e| panic!("{role} logs in: {e}"))
}

/// The function's Redis ACL user of the database role `role` (`seckill_entry` ->
/// `seckill-entry`, scripts/redis_acl.py), on the test's Redis with the test's key prefix.
async fn redis_as(env: &TestEnv, role: &str) -> Redis {
    let user = role.replace('_', "-");
    let mut config = env.config.clone();
    config.redis = config
        .redis
        .with_login(&testkit::local_redis_login(&user))
        .unwrap();
    Redis::connect(&config).await.unwrap_or_else(|e| {
        panic!("{user} logs in to Redis ({e}): bash scripts/stack.sh creates the users")
    })
}

/// A function's logins: its database pool logged in as a role, its Redis connection as the
/// function's ACL user.
struct Login {
    pool: PgPool,
    redis: Redis,
}

/// The logins of the function whose database role is `role`.
async fn login_as(env: &TestEnv, role: &str) -> Login {
    Login {
        pool: pool_as(env, role).await,
        redis: redis_as(env, role).await,
    }
}

impl Login {
    /// A function's context on these logins (what its handle is built on).
    fn on(&self, context: &mut Context) {
        context.pool = self.pool.clone();
        context.redis = self.redis.clone();
    }
}

/// `sql` is refused for lack of privilege (SQLSTATE 42501).
async fn refused(pool: &PgPool, sql: &'static str) {
    match sqlx::raw_sql(sql).execute(pool).await {
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42501") => {}
        other => panic!("expected 42501 for {sql:?}, got {other:?}"),
    }
}

/// The messages on the test's queue as the SQS event the consumer's Lambda gets.
async fn queued_event(env: &TestEnv) -> SqsEvent {
    let mut event: SqsEvent =
        serde_json::from_str(include_str!("../../events/order-consumer-batch.json")).unwrap();
    let template = event.records.remove(0);
    event.records = env
        .drain_messages(10)
        .await
        .unwrap()
        .into_iter()
        .map(|m| {
            let mut record = template.clone();
            record.message_id = Some(Uuid::new_v4().to_string());
            record.body = m.body;
            record
        })
        .collect();
    event
}

/// The consumer, logged in as its role, takes everything queued; nothing may fail. Returns how
/// many messages it took and how many of them went through the batch path.
async fn consume_queue_as_consumer(env: &TestEnv) -> (usize, u32) {
    let event = queued_event(env).await;
    let n = event.records.len();
    let login = login_as(env, "seckill_consumer").await;
    let consumer = env.consumer_with(|c| login.on(c));
    let (resp, stats) = consumer.handle_batch_with_stats(event).await;
    assert!(resp.batch_item_failures.is_empty(), "{resp:?}");
    (n, stats.batched)
}

async fn new_env() -> TestEnv {
    TestEnv::new(RedisKind::Standalone)
        .await
        .expect("test environment")
}

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
            "select rolname::text from pg_roles where rolname like 'seckill\\_%' order by 1",
        )
        .fetch_all(&env.pool)
        .await?;
        let mut want: Vec<&str> = db::ROLES.to_vec();
        want.sort();
        assert_eq!(roles, want);
    }
    Ok(())
}

/// The entry (internet-facing) as `seckill_entry`: a purchase, the buyer's order, a pay, a
/// cancel, the public view, and the `failed` claim after a send that failed; the consumer as
/// `seckill_consumer` confirms the orders in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_entry_role_runs_a_buyers_whole_path() -> anyhow::Result<()> {
    let env = new_env().await;
    let a = env.open_sale(10, 2).await?;
    let login = login_as(&env, "seckill_entry").await;
    let entry = env.entry_router_with(|c| login.on(c));
    let buy = |user: &'static str| {
        let path = format!("/activities/{}/orders", a.id);
        let entry = entry.clone();
        async move {
            call(
                &entry,
                request("POST", &path, Some((user, "")), Some(r#"{"quantity":1}"#)),
            )
            .await
        }
    };

    for user in ["alice", "bob", "dave"] {
        let (status, body) = buy(user).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    }
    assert_eq!(consume_queue_as_consumer(&env).await.0, 3);
    let me = format!("/activities/{}/orders/me", a.id);
    let mine = |user: &'static str| call(&entry, request("GET", &me, Some((user, "")), None));
    let (status, alice) = mine("alice").await;
    assert_eq!(
        (status, alice["status"].as_str()),
        (StatusCode::OK, Some("confirmed")),
        "{alice}"
    );
    let (_, bob) = mine("bob").await;

    let alice_order = alice["orderId"].as_i64().unwrap();
    let (status, paid) =
        testkit::pay_through_provider(&entry, &env.config, alice_order, "alice").await;
    assert_eq!(
        (status, paid["outcome"].as_str()),
        (StatusCode::OK, Some("paid")),
        "{paid}"
    );
    let cancel = format!("/orders/{}/cancel", bob["orderId"]);
    let (status, cancelled) = call(&entry, request("POST", &cancel, Some(("bob", "")), None)).await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    assert_eq!(cancelled["releasedQuantity"], 1);
    assert_eq!(db_remaining(&env, a.id).await, 8, "bob's unit is back");
    // A cancel whose buyer's field Redis lost restores it first.
    let (_, dave) = mine("dave").await;
    assert!(testkit::lose_field(&env.redis, a.id, "dave").await?);
    let cancel = format!("/orders/{}/cancel", dave["orderId"]);
    let (status, cancelled) =
        call(&entry, request("POST", &cancel, Some(("dave", "")), None)).await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    assert_eq!(cancelled["releasedQuantity"], 1);
    assert_eq!(db_remaining(&env, a.id).await, 9, "dave's unit is back");
    let (status, view) = call(
        &entry,
        request("GET", &format!("/activities/{}", a.id), None, None),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{view}");

    // A send that fails: the entry claims the request with a `failed` row of its own.
    let dead = env
        .sqs
        .config()
        .to_builder()
        .endpoint_url("http://127.0.0.1:9")
        .build();
    let dead = OrderQueue::new(
        aws_sdk_sqs::Client::from_conf(dead),
        env.queue.url.clone(),
        Duration::from_secs(1),
    );
    let broken = env.entry_router_on(dead, |c| login.on(c));
    let (status, body) = call(
        &broken,
        request(
            "POST",
            &format!("/activities/{}/orders", a.id),
            Some(("carol", "")),
            Some(r#"{"quantity":1}"#),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let carol = order::latest_for_user(&env.pool, a.id, "carol")
        .await?
        .unwrap();
    assert_eq!(
        (carol.status.as_str(), carol.failure_reason.as_deref()),
        ("failed", Some(reason::SEND_FAILED))
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_entry_role_may_write_no_more_than_its_path() -> anyhow::Result<()> {
    let env = new_env().await;
    let a = env.open_sale(10, 2).await?;
    let paid = reserve(&env, a.id, "alice", 1).await.attempt.request_id;
    let paid = consume(&env, a.id, "alice", paid, 1).await?;
    testkit::pay(&env.pool, paid, env.config.payment_timeout)
        .await?
        .map_err(anyhow::Error::msg)?;
    let rid = reserve(&env, a.id, "bob", 1).await.attempt.request_id;
    consume(&env, a.id, "bob", rid, 1).await?;
    let entry = pool_as(&env, "seckill_entry").await;

    refused(&entry, "update activities set title = 'mine'").await;
    refused(
        &entry,
        "update activities set total_stock = total_stock + 100",
    )
    .await;
    refused(&entry, "update activities set last_fence_token = 1 << 40").await;
    // Units go back only through a cancel of a confirmed order (cancel_confirmed_order).
    refused(
        &entry,
        "update activities set remaining_stock = remaining_stock + 100",
    )
    .await;
    refused(
        &entry,
        "insert into activities (title, total_stock, remaining_stock, per_order_limit, \
             start_at, end_at) values ('x', 1, 1, 1, now(), now() + interval '1 hour')",
    )
    .await;
    refused(&entry, "update orders set quantity = 5").await;
    refused(&entry, "update orders set user_id = 'mallory'").await;
    refused(&entry, "select * from activity_stats").await;
    // Row-level security: no order but a `failed` claim, no settled order but a confirmed
    // one paid or cancelled.
    refused(
        &entry,
        "insert into orders (request_id, activity_id, user_id, quantity, status) \
         select gen_random_uuid(), id, 'mallory', 1, 'confirmed' from activities",
    )
    .await;
    refused(
        &entry,
        "update orders set status = 'failed' where status = 'confirmed'",
    )
    .await;
    let reopened = sqlx::raw_sql("update orders set status = 'confirmed' where status = 'paid'")
        .execute(&entry)
        .await?;
    assert_eq!(
        reopened.rows_affected(),
        0,
        "a paid order is not the entry's to change"
    );
    assert_eq!(order::get(&env.pool, paid).await?.unwrap().status, "paid");
    Ok(())
}

/// The consumer as `seckill_consumer`: orders confirmed (the batched insert and stock
/// decrement), and a refusal recorded as `failed` with its units given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_consumer_role_confirms_orders_and_records_refusals() -> anyhow::Result<()> {
    let env = new_env().await;
    let a = env.open_sale(3, 1).await?;
    let messages: Vec<OrderMessage> =
        futures::future::join_all(["alice", "bob", "carol"].map(|u| reserve(&env, a.id, u, 1)))
            .await;
    // The database has one unit fewer than Redis: the third order is refused there.
    set_db_stock(&env, a.id, 2).await;
    for m in &messages {
        env.queue.send(m, m.attempt.activity_id).await?;
    }

    assert_eq!(consume_queue_as_consumer(&env).await.0, 3);

    let tally = order::tally(&env.pool, a.id).await?;
    assert_eq!((tally.confirmed, tally.failed), (2, 1), "{tally:?}");

    // Two orders of one sale that both fit go through the batch path, which reads their
    // ledger entries in one HMGET: a user without it would fall back one by one, silently.
    let b = env.open_sale(2, 1).await?;
    for user in ["dave", "erin"] {
        let m = reserve(&env, b.id, user, 1).await;
        env.queue.send(&m, b.id).await?;
    }
    assert_eq!(consume_queue_as_consumer(&env).await, (2, 2));
    assert_eq!(db_remaining(&env, a.id).await, 0);
    let consumer = pool_as(&env, "seckill_consumer").await;
    refused(&consumer, "update orders set status = 'paid'").await;
    refused(&consumer, "update activities set total_stock = 1000").await;
    refused(
        &consumer,
        "insert into activities (title, total_stock, remaining_stock, per_order_limit, \
             start_at, end_at) values ('x', 1, 1, 1, now(), now() + interval '1 hour')",
    )
    .await;
    refused(
        &consumer,
        "insert into activity_stats (activity_id, participants, sold, \
             db_remaining, pending_qty, drift) values (1, 0, 0, 0, 0, 0)",
    )
    .await;
    Ok(())
}

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
    let running = env.open_sale(5, 1).await?;
    let rid = reserve(&env, running.id, "alice", 1)
        .await
        .attempt
        .request_id;
    consume(&env, running.id, "alice", rid, 1).await?;
    testkit::lose_sale(&env.redis, running.id).await?;
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
async fn insert(env: &TestEnv, start_at: DateTime<Utc>, end_at: DateTime<Utc>) -> Activity {
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
    let a = env.open_sale(10, 5).await?;
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
    assert_eq!(bob.status, "failed");

    set_db_stock(&env, a.id, 3).await;
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
        "cancelled"
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
    refused(
        &admin,
        "insert into activity_stats (activity_id, participants, sold, \
             db_remaining, pending_qty, drift) values (1, 0, 0, 0, 0, 0)",
    )
    .await;
    Ok(())
}

/// Each function's Redis user as scripts/redis_acl.py declares it: (binary, user, the commands
/// it may send, lowercase).
fn declared_redis_users() -> Vec<(String, String, BTreeSet<String>)> {
    let users = testkit::redis_acl_users();
    let users = users.as_object().expect("a JSON object").clone();
    users
        .into_iter()
        .map(|(binary, spec)| {
            let allowed = spec["access"]
                .as_str()
                .unwrap()
                .split(' ')
                .filter_map(|rule| rule.strip_prefix('+'))
                .map(str::to_string)
                .collect();
            (binary, spec["user"].as_str().unwrap().to_string(), allowed)
        })
        .collect()
}

/// Refused by the ACL: NOPERM for a command or key, the script error for a command a script
/// called.
fn assert_refused<T: std::fmt::Debug>(user: &str, what: &str, result: redis::RedisResult<T>) {
    match result {
        Err(e)
            if e.code() == Some("NOPERM") || e.to_string().contains("can't run this command") => {}
        other => panic!("{user}: {what} should be refused by its ACL, got {other:?}"),
    }
}

/// Every function's Redis user is refused what its function does not run: the server's
/// administration, keys outside `seckill:`, each data command its scripts do not call, also
/// from inside a script. The users are
/// the ones scripts/stack.sh created from scripts/redis_acl.py; the runs above prove each one
/// is enough for its function's path.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_redis_user_is_refused_what_its_function_does_not_run() -> anyhow::Result<()> {
    let env = new_env().await;
    let key = format!("{}:acl-probe", env.config.key_prefix);
    let users = declared_redis_users();
    assert_eq!(
        users.len(),
        5,
        "one user per function that uses Redis: {users:?}"
    );
    // Commands some function's scripts call; each user must be refused those its own do not.
    let data_commands: [(&str, &[&str]); 14] = [
        ("del", &[]),
        ("set", &["1"]),
        ("zrange", &["0", "-1"]),
        ("zscore", &["u"]),
        ("hsetnx", &["f", "1"]),
        ("hlen", &[]),
        ("pttl", &[]),
        ("decr", &[]),
        ("incr", &[]),
        ("pexpire", &["1000"]),
        ("pexpireat", &["1"]),
        ("hgetall", &[]),
        ("hkeys", &[]),
        ("hscan", &["0"]),
    ];
    let mut refused_somewhere = BTreeSet::new();
    for (binary, user, allowed) in &users {
        let mut config = env.config.clone();
        config.redis = config.redis.with_login(&testkit::local_redis_login(user))?;
        let RedisTopology::Standalone(url) = &config.redis else {
            unreachable!("the role tests run on standalone Redis")
        };
        let client = redis::Client::open(url.expose())?;
        let mut con = client
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("{user} logs in ({e}): bash scripts/stack.sh creates it"));
        let pong: String = redis::cmd("PING").query_async(&mut con).await?;
        assert_eq!(pong, "PONG", "{user}");

        for (name, args) in [
            ("FLUSHALL", vec![]),
            ("KEYS", vec!["*"]),
            ("CONFIG", vec!["GET", "maxmemory"]),
            ("SCRIPT", vec!["FLUSH"]),
            ("ACL", vec!["LIST"]),
            ("EVAL", vec!["return 1", "0"]),
            ("CLIENT", vec!["LIST"]),
            ("INFO", vec!["server"]),
            ("SCAN", vec!["0"]),
        ] {
            let result: redis::RedisResult<redis::Value> =
                redis::cmd(name).arg(&args).query_async(&mut con).await;
            assert_refused(user, &format!("{name} {args:?}"), result);
        }
        let outside: redis::RedisResult<Option<String>> = redis::cmd("HGET")
            .arg("other:{1}:meta")
            .arg("stock")
            .query_async(&mut con)
            .await;
        assert_refused(user, "a key outside seckill:", outside);

        for (command, args) in data_commands {
            if allowed.contains(command) {
                continue;
            }
            refused_somewhere.insert(command);
            let result: redis::RedisResult<redis::Value> = redis::cmd(command)
                .arg(&key)
                .arg(args)
                .query_async(&mut con)
                .await;
            assert_refused(user, command, result);
        }

        // EVALSHA is no way around the ACL: a script's commands are checked as the user's.
        if !allowed.contains("del") {
            let result: redis::RedisResult<redis::Value> =
                redis::Script::new("return redis.call('DEL', KEYS[1])")
                    .key(&key)
                    .invoke_async(&mut con)
                    .await;
            assert_refused(user, &format!("{binary}: DEL inside a script"), result);
        }
    }
    // The list above is not vacuous: every one of its commands is some user's refusal.
    assert_eq!(
        refused_somewhere.len(),
        data_commands.len(),
        "{refused_somewhere:?}"
    );
    Ok(())
}
