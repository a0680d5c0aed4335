//! The helpers every test file shares: the functions' handles built from a [`TestEnv`], the
//! reads tests assert on, and the few statements only tests run (setting a row to a state the
//! protocol reaches by a crash). Each test file has `mod common;`.
//!
//! They live here rather than on `TestEnv` because most need the function crates
//! (`order-consumer`, `reconcile`, `seckill-entry`, ...), which depend on `seckill-shared`
//! and so cannot be reached from `shared::testing`. Where a test sets up a state production
//! reaches (an order committed, stock taken, a cancel committed), it calls the production
//! function, so it runs the statement, guards included, that production runs.

// Each test binary uses some of these.
#![allow(dead_code)]

use axum::Router;
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use order_consumer::Consumer;
use preheat::Preheat;
use reconcile::Reconcile;
use seckill_entry::{router, EntryState};
use seckill_shared::domain::activity;
use seckill_shared::store::ledger;
use seckill_shared::store::purchase;
use seckill_shared::store::values::{EntryKind, LedgerEntry};
use seckill_shared::store::view;
use seckill_shared::testing;

use seckill_shared::domain::order;
use seckill_shared::domain::order::Order;
use seckill_shared::domain::purchase::{Attempt, MessageKind, OrderMessage};
use seckill_shared::infra::sqs::OrderQueue;
use seckill_shared::store::ledger::Snapshot;
use seckill_shared::store::purchase::Reservation;
use seckill_shared::testing::TestEnv;
use seckill_shared::Config;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

pub fn consumer(env: &TestEnv) -> Consumer {
    Consumer::new(env.context())
}

pub fn reconcile(env: &TestEnv) -> Reconcile {
    Reconcile::new(env.context())
}

pub fn preheat(env: &TestEnv) -> Preheat {
    Preheat::new(env.context())
}

/// The entry function's router on the test's queue.
pub fn entry_router(env: &TestEnv) -> Router {
    entry_router_with_queue(env, env.queue.clone())
}

pub fn entry_router_with_queue(env: &TestEnv, queue: OrderQueue) -> Router {
    router(EntryState::new(env.context(), queue))
}

/// A moment past a reconcile grace period of `grace` for anything done before now.
pub fn after_grace(grace: Duration) -> DateTime<Utc> {
    Utc::now() + ChronoDuration::from_std(grace).unwrap() + ChronoDuration::seconds(1)
}

/// Makes a reservation the way the entry function does (the purchase script must accept it)
/// and returns the order message it would send.
pub async fn reserve(env: &TestEnv, activity_id: i64, user: &str, quantity: i64) -> OrderMessage {
    let request_id = Uuid::new_v4();
    let decision = testing::purchase(
        &env.redis,
        activity_id,
        user,
        quantity,
        request_id,
        purchase::far_deadline(),
    )
    .await
    .expect("redis answers");
    let Ok(Reservation {
        now_ms,
        epoch,
        buckets,
        ..
    }) = decision
    else {
        panic!("reservation for {user} refused: {decision:?}");
    };
    OrderMessage {
        attempt: Attempt {
            request_id,
            activity_id,
            user_id: user.to_string(),
            quantity,
            buckets,
        },
        reserved_at_ms: now_ms,
        load_epoch: Some(epoch),
        kind: MessageKind::Order,
    }
}

/// The consumer's order transaction for a reservation, on the consumer's own statements: the
/// order row, then the conditional stock decrement (no epoch check). Returns the order id.
/// The ledger entry is left alone (as if the consumer crashed before settling).
pub async fn commit_order(
    env: &TestEnv,
    activity_id: i64,
    user: &str,
    request_id: Uuid,
    quantity: i64,
) -> anyhow::Result<i64> {
    let attempt = Attempt {
        request_id,
        activity_id,
        user_id: user.to_string(),
        quantity,
        buckets: 1,
    };
    let mut tx = env.pool.begin().await?;
    let order_id = order::insert_confirmed(&mut tx, &attempt).await?;
    let taken = activity::take_stock(&mut tx, activity_id, quantity, None).await?;
    anyhow::ensure!(taken.is_some(), "DB sold out");
    tx.commit().await?;
    Ok(order_id)
}

/// The consumer's whole happy path: [`commit_order`], then the ledger entry dropped.
pub async fn consume(
    env: &TestEnv,
    activity_id: i64,
    user: &str,
    request_id: Uuid,
    quantity: i64,
) -> anyhow::Result<i64> {
    let order_id = commit_order(env, activity_id, user, request_id, quantity).await?;
    assert!(ledger::settle(&env.redis, activity_id, user, &request_id.to_string()).await?);
    Ok(order_id)
}

pub async fn snapshot(env: &TestEnv, activity_id: i64) -> Snapshot {
    ledger::snapshot(&env.redis, activity_id).await.unwrap()
}

pub async fn redis_stock(env: &TestEnv, activity_id: i64) -> Option<i64> {
    view::stock(&env.redis, activity_id).await.unwrap()
}

pub async fn is_participant(env: &TestEnv, activity_id: i64, user: &str) -> bool {
    let k = env.redis.keys(activity_id);
    env.redis
        .cmd(redis::cmd("HEXISTS").arg(&k.users).arg(user))
        .await
        .unwrap()
}

pub async fn db_remaining(env: &TestEnv, activity_id: i64) -> i64 {
    activity::remaining_stock(&env.pool, activity_id)
        .await
        .unwrap()
        .expect("the activity exists")
}

/// Drift by hand: the database's remaining stock set behind every actor's back (reconcile's
/// own repair statement).
pub async fn set_db_stock(env: &TestEnv, activity_id: i64, remaining: i64) {
    activity::set_remaining_stock(&env.pool, activity_id, remaining)
        .await
        .unwrap();
}

/// Every orders row of the sale, oldest first.
pub async fn order_rows(env: &TestEnv, activity_id: i64) -> Vec<Order> {
    order::of_activity(&env.pool, activity_id).await.unwrap()
}

/// The draw entries the database keeps of the sale.
pub async fn draw_entry_rows(env: &TestEnv, activity_id: i64) -> i64 {
    sqlx::query_scalar!(
        r#"select count(*) as "count!" from draw_entries where activity_id = $1"#,
        activity_id
    )
    .fetch_one(&env.pool)
    .await
    .unwrap()
}

/// Orders rows in the test's database, of every sale.
pub async fn orders_in_db(env: &TestEnv) -> i64 {
    sqlx::query_scalar!(r#"select count(*) as "count!" from orders"#)
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

/// Moves the sale's window into the past (an hour ago it ended), in the database only.
pub async fn end_sale_in_db(env: &TestEnv, activity_id: i64) {
    sqlx::query!(
        "update activities set start_at = now() - interval '2 hours',
             end_at = now() - interval '1 hour' where id = $1",
        activity_id
    )
    .execute(&env.pool)
    .await
    .unwrap();
}

/// Calls a router in-process (as Lambda does) and returns the status, the response headers and
/// the JSON body (`Value::Null` for an empty body).
pub async fn call_with_headers(
    router: &Router,
    req: axum::http::Request<axum::body::Body>,
) -> (
    axum::http::StatusCode,
    axum::http::HeaderMap,
    serde_json::Value,
) {
    use tower::ServiceExt;
    let resp = router
        .clone()
        .oneshot(req)
        .await
        .expect("infallible router");
    let (parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .expect("readable body");
    let json = if bytes.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&bytes).into()))
    };
    (parts.status, parts.headers, json)
}

/// A pool on the test's database that counts every connection it hands out (a new one or an
/// idle one): each database step of a request takes one, so an unchanged count is a request
/// that did no database work.
pub fn counting_pool(env: &TestEnv) -> (sqlx::PgPool, Arc<AtomicUsize>) {
    let taken = Arc::new(AtomicUsize::new(0));
    let (on_connect, on_acquire) = (taken.clone(), taken.clone());
    let pool = seckill_shared::infra::db::pool_options()
        .max_connections(4)
        .after_connect(move |_, _| {
            on_connect.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(()) })
        })
        .before_acquire(move |_, _| {
            on_acquire.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(true) })
        })
        .connect_lazy(env.config.database_url.expose())
        .expect("a well-formed URL");
    (pool, taken)
}

/// The entry function's router on the test's queue and the given pool, with `config`.
pub fn entry_router_on(env: &TestEnv, config: Config, pool: sqlx::PgPool) -> Router {
    let context = seckill_shared::Context::new(config, pool, env.redis.clone());
    router(EntryState::new(context, env.queue.clone()))
}

/// A pool whose database is a port nobody listens on: every query fails, fast.
pub fn dead_pool() -> sqlx::PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy("postgres://postgres@127.0.0.1:1/nowhere")
        .expect("a well-formed URL")
}

/// Closes a draw sale's pool now, as the clock reaching `startAt + drawWindowMs` does: the
/// meta's `drawEndMs` set to a moment past (the row keeps its window; only Redis decides).
pub async fn close_draw_window(env: &TestEnv, activity_id: i64) {
    let k = env.redis.keys(activity_id);
    let past = Utc::now().timestamp_millis() - 1;
    let _: () = env
        .redis
        .cmd(redis::cmd("HSET").arg(&k.meta).arg("drawEndMs").arg(past))
        .await
        .expect("redis answers");
}

/// A purchase of `a` by `user` through the entry's router (`body` `None`: one unit).
pub async fn buy(
    app: &Router,
    a: &activity::Activity,
    user: &str,
    body: Option<&str>,
) -> (axum::http::StatusCode, serde_json::Value) {
    let path = format!("/activities/{}/orders", a.id);
    testing::call(app, testing::request("POST", &path, Some((user, "")), body)).await
}

/// `user`'s status in `a` (`GET …/orders/me`), which answered 200.
pub async fn my_status(app: &Router, a: &activity::Activity, user: &str) -> String {
    let path = format!("/activities/{}/orders/me", a.id);
    let (status, body) =
        testing::call(app, testing::request("GET", &path, Some((user, "")), None)).await;
    assert_eq!(status, axum::http::StatusCode::OK, "{body}");
    body["status"].as_str().unwrap_or_default().to_string()
}

/// Every message on the test's queue, read through the consumer as SQS delivers them.
/// Answers how many were order messages (a first-come reservation or a draw's winner): a draw
/// sale's entries are kept in the database and not counted.
pub async fn consume_queue(env: &TestEnv) -> anyhow::Result<usize> {
    let consumer = consumer(env);
    let mut n = 0;
    for m in env.drain_messages(10_000).await? {
        let message = order_consumer::parse(m.body())?;
        consumer.handle_message(&message).await?;
        n += usize::from(message.kind != MessageKind::Entry);
    }
    Ok(n)
}

/// Moves every reservation in the sale's ledger `by` into the past, as time passing does: the
/// entries' `ms` field rewritten (reconcile reads them against the Redis server's clock).
pub async fn age_reservations(env: &TestEnv, activity_id: i64, by: Duration) {
    let k = env.redis.keys(activity_id);
    let flat: Vec<String> = env
        .redis
        .cmd(redis::cmd("HGETALL").arg(&k.ledger))
        .await
        .expect("redis answers");
    for pair in flat.chunks(2) {
        let [user, value] = pair else { continue };
        let Some(mut entry) = LedgerEntry::parse(user, value) else {
            continue;
        };
        if entry.kind != EntryKind::Reservation {
            continue;
        }
        entry.at_ms -= by.as_millis() as i64;
        let _: () = env
            .redis
            .cmd(
                redis::cmd("HSET")
                    .arg(&k.ledger)
                    .arg(user)
                    .arg(entry.to_string()),
            )
            .await
            .expect("redis answers");
    }
}

/// Puts `user` in a draw sale's pool the way the entry function does (the purchase script
/// must answer `queued`) and returns the attempt that entered it.
pub async fn reserve_in_pool(env: &TestEnv, activity_id: i64, user: &str) -> Attempt {
    let attempt = Attempt {
        request_id: Uuid::now_v7(),
        activity_id,
        user_id: user.to_string(),
        quantity: 1,
        buckets: 1,
    };
    let home = activity_id.into();
    let (decision, _) = purchase::run(&env.redis, home, &attempt, purchase::far_deadline(), &[])
        .await
        .expect("redis answers");
    assert!(
        matches!(decision, purchase::Answer::Queued { .. }),
        "{user}: {decision:?}"
    );
    attempt
}

/// Each function's Redis ACL user as scripts/redis_acl.py declares it: binary name ->
/// `{"user", "access", "scripts"}`.
pub fn redis_acl_users() -> serde_json::Value {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::process::Command::new("python3")
        .arg(root.join("scripts/redis_acl.py"))
        .arg("json")
        .output()
        .expect("python3 runs scripts/redis_acl.py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("scripts/redis_acl.py json")
}
