//! The public view (`GET /activities/{id}`) and the health routes of the entry function,
//! against real Redis (both topologies), PostgreSQL and the SQS emulator.
//!
//! The view of a loaded sale must not touch the database: the tests that say so give the
//! entry a pool on a port nobody listens on, so a single database read would be a 503. Where
//! the database must answer (before preheat, unknown ids), the tests count its transactions
//! or close its pool between two requests to show the answer came from the container's cache.

use axum::http::StatusCode;
use axum::Router;
use seckill_entry::view::{CACHE_ERROR, CACHE_NOT_FOUND, CACHE_SHOWN};
use seckill_shared::domain::activity;
use seckill_shared::http::auth::ADMIN_SCOPE;
use seckill_shared::infra::sqs::{OrderQueue, Queues};
use seckill_shared::store::conn::Redis;
use serde_json::Value;
use sqlx::PgPool;
use std::time::{Duration, Instant};
use testkit::call;
use testkit::on_every_redis;
use testkit::request;
use testkit::PrivateRedis;
use testkit::RedisKind;
use testkit::TestEnv;
use testkit::{call_with_headers, dead_pool};

/// The entry function on the test's Redis and queue, with `pool` as its database.
fn entry_with_pool(env: &TestEnv, pool: PgPool) -> Router {
    env.entry_router_with(|c| c.pool = pool)
}

/// `GET /activities/{id}`: status, `Cache-Control`, body.
async fn view(app: &Router, id: i64) -> (StatusCode, String, Value) {
    let path = format!("/activities/{id}");
    let (status, headers, body) = call_with_headers(app, request("GET", &path, None, None)).await;
    let cache_control = headers
        .get("cache-control")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    (status, cache_control, body)
}

/// Longer than the container's view cache keeps an answer.
async fn past_the_cache(env: &TestEnv) {
    tokio::time::sleep(env.config.public_view_cache_ttl + Duration::from_millis(50)).await;
}

async fn a_loaded_sale_is_viewed_with_its_live_stock_and_no_database(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let activity = env.open_activity(7, 2).await?;
    let app = entry_with_pool(&env, dead_pool());

    let (status, cache_control, shown) = view(&app, activity.id).await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert_eq!(cache_control, CACHE_SHOWN);
    assert_eq!(shown["id"], activity.id);
    assert_eq!(shown["title"], "test sale");
    assert_eq!(shown["remainingStock"], 7);
    assert_eq!(shown["state"], "running");
    assert_eq!(
        shown["startAt"]
            .as_str()
            .map(|t| parse_time(t).timestamp_millis()),
        Some(activity.start_at.timestamp_millis())
    );

    // A purchase (which needs no database either) moves Redis's stock; the view follows it
    // once the container's copy lapsed.
    let buy = request(
        "POST",
        &format!("/activities/{}/orders", activity.id),
        Some(("alice", "")),
        Some(r#"{"quantity":2}"#),
    );
    let (status, _, body) = call_with_headers(&app, buy).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    past_the_cache(&env).await;
    let answers = futures::future::join_all((0..200).map(|_| view(&app, activity.id))).await;
    for (status, cache_control, shown) in answers {
        assert_eq!(status, StatusCode::OK, "{shown}");
        assert_eq!(cache_control, CACHE_SHOWN);
        assert_eq!(shown["remainingStock"], 5, "Redis's stock, not the DB's 7");
    }
    Ok(())
}
on_every_redis!(a_loaded_sale_is_viewed_with_its_live_stock_and_no_database);

async fn an_admin_change_of_title_and_window_reaches_the_view(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let activity = env.open_activity(5, 1).await?;
    // The viewer never reaches the database: what it shows after the change came from Redis.
    let viewer = entry_with_pool(&env, dead_pool());
    let admin = env.admin_router();
    assert_eq!(view(&viewer, activity.id).await.2["title"], "test sale");

    let now = chrono::Utc::now();
    let start_at = now + chrono::Duration::minutes(10);
    let end_at = now + chrono::Duration::hours(3);
    let patch = serde_json::json!({
        "title": "renamed sale",
        "startAt": start_at.to_rfc3339(),
        "endAt": end_at.to_rfc3339(),
    })
    .to_string();
    let put = request(
        "PUT",
        &format!("/admin/activities/{}", activity.id),
        Some(("root", ADMIN_SCOPE)),
        Some(&patch),
    );
    let (status, _, body) = call_with_headers(&admin, put).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    past_the_cache(&env).await;
    let (status, _, shown) = view(&viewer, activity.id).await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert_eq!(shown["title"], "renamed sale");
    assert_eq!(shown["state"], "upcoming", "the new window, from the meta");
    let millis = |t: chrono::DateTime<chrono::Utc>| t.timestamp_millis();
    assert_eq!(
        shown["startAt"].as_str().map(|t| millis(parse_time(t))),
        Some(millis(start_at))
    );
    assert_eq!(
        shown["endAt"].as_str().map(|t| millis(parse_time(t))),
        Some(millis(end_at))
    );
    assert_eq!(shown["remainingStock"], 5);
    Ok(())
}
on_every_redis!(an_admin_change_of_title_and_window_reaches_the_view);

async fn before_preheat_the_view_comes_from_the_database_and_is_cached(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let now = chrono::Utc::now();
    let later = activity::insert(
        &env.pool,
        &testkit::new_activity()
            .title("next week's sale")
            .stock(30)
            .limit(1)
            .window(
                now + chrono::Duration::days(7),
                now + chrono::Duration::days(8),
            )
            .build()
            .settings()?,
    )
    .await?;
    let pool = own_pool(&env)?;
    let app = entry_with_pool(&env, pool.clone());

    let (status, cache_control, shown) = view(&app, later.id).await;
    let first_answer = Instant::now();
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert_eq!(cache_control, CACHE_SHOWN);
    assert_eq!(shown["title"], "next week's sale");
    assert_eq!(shown["remainingStock"], 30);
    assert_eq!(shown["state"], "upcoming");

    // The database goes away: the container's copy answers while it is fresh...
    pool.close().await;
    let (status, _, cached) = view(&app, later.id).await;
    anyhow::ensure!(
        first_answer.elapsed() < env.config.public_view_cache_ttl,
        "too slow to see the cached copy ({:?}); nothing was shown",
        first_answer.elapsed()
    );
    assert_eq!(status, StatusCode::OK, "{cached}");
    assert_eq!(cached, shown);

    // ...and only then does the next request find the database gone.
    past_the_cache(&env).await;
    let (status, cache_control, body) = view(&app, later.id).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(cache_control, CACHE_ERROR);
    Ok(())
}
on_every_redis!(before_preheat_the_view_comes_from_the_database_and_is_cached);

async fn a_burst_for_an_unknown_id_costs_one_database_read_per_cache_period(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let database = env.config.database_url.expose().to_string();
    // Only the entry's own pool works on the test's database from here on.
    env.pool.close().await;
    let before = activity_reads(&database).await?;
    let pool = own_pool(&env)?;
    let app = entry_with_pool(&env, pool.clone());
    let unknown = 424_242;

    let ttl = env.config.public_view_cache_ttl;
    let mut periods = 0;
    for burst in 0..2 {
        if burst > 0 {
            past_the_cache(&env).await;
        }
        let started = Instant::now();
        let answers = futures::future::join_all((0..100).map(|_| view(&app, unknown))).await;
        // A burst that outlasted the cache period may rightly read once more.
        periods += 1 + (started.elapsed().as_millis() / ttl.as_millis()) as i64;
        for (status, cache_control, body) in answers {
            assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
            assert_eq!(body["error"], "not_found");
            assert_eq!(cache_control, CACHE_NOT_FOUND);
        }
    }
    pool.close().await;

    let reads = activity_reads(&database).await? - before;
    assert!(
        (1..=periods).contains(&reads),
        "{reads} database reads for 200 requests in {periods} cache period(s)"
    );
    Ok(())
}
on_every_redis!(a_burst_for_an_unknown_id_costs_one_database_read_per_cache_period);

/// Which dependency a row of [`DEEP_HEALTH`] breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Broken {
    Nothing,
    Redis,
    Database,
    Queue,
    Everything,
}

/// One row per case: what is broken, the deep check's status, the dependencies it names.
#[rustfmt::skip]
const DEEP_HEALTH: &[(Broken, StatusCode, &[&str])] = &[
    (Broken::Nothing, StatusCode::OK, &[]),
    (Broken::Redis, StatusCode::SERVICE_UNAVAILABLE, &["redis"]),
    (Broken::Database, StatusCode::SERVICE_UNAVAILABLE, &["database"]),
    (Broken::Queue, StatusCode::SERVICE_UNAVAILABLE, &["queue"]),
    (Broken::Everything, StatusCode::SERVICE_UNAVAILABLE, &["redis", "database", "queue"]),
];

async fn health_needs_no_dependency_and_the_deep_check_names_nothing_it_found_dead(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    for &(broken, deep_status, named) in DEEP_HEALTH {
        let breaks = |what: Broken| broken == what || broken == Broken::Everything;
        // A Redis that answered once and then died (a cold start needs Redis to connect).
        let (redis, dead) = if breaks(Broken::Redis) {
            let private = PrivateRedis::start().await;
            let mut config = env.config.clone();
            config.redis =
                seckill_shared::infra::config::RedisTopology::Standalone(private.url().into());
            (Redis::connect(&config).await?, Some(private))
        } else {
            (env.redis.clone(), None)
        };
        drop(dead);
        let pool = if breaks(Broken::Database) {
            dead_pool()
        } else {
            env.pool.clone()
        };
        let queue = if breaks(Broken::Queue) {
            let url = format!("{}-never-created", env.queue.url);
            Queues::one(OrderQueue::new(
                env.sqs.clone(),
                url,
                env.config.sqs_timeout,
            ))
        } else {
            env.queues()
        };
        let app = env.entry_router_on(queue, |c| {
            c.pool = pool;
            c.redis = redis;
        });

        let (status, headers, body) =
            call_with_headers(&app, request("GET", "/health", None, None)).await;
        assert_eq!(
            (status, &body["status"]),
            (StatusCode::OK, &serde_json::json!("ok")),
            "{broken:?} broken: /health"
        );
        // The clock, from no dependency either, and never cached.
        assert!(body["serverTime"].is_string(), "{body}");
        assert_eq!(headers[axum::http::header::CACHE_CONTROL], "no-store");
        let (status, _, body) =
            call_with_headers(&app, request("GET", "/health/deep", None, None)).await;
        assert_eq!(status, deep_status, "{broken:?} broken: {body}");
        if deep_status == StatusCode::OK {
            assert_eq!(body["status"], "ok", "{body}");
            for dependency in ["redis", "database", "queue"] {
                assert_eq!(body[dependency]["status"], "ok", "{body}");
            }
            continue;
        }
        assert_eq!(body["error"], "unavailable", "{body}");
        assert!(!named.is_empty());
        let message = body["message"].as_str().unwrap_or_default();
        for dependency in ["redis", "database", "queue"] {
            assert!(
                !message.contains(dependency),
                "{broken:?} broken: the answer names nothing behind the API: {message}"
            );
        }
    }
    Ok(())
}
on_every_redis!(health_needs_no_dependency_and_the_deep_check_names_nothing_it_found_dead);

fn parse_time(text: &str) -> chrono::DateTime<chrono::Utc> {
    text.parse().expect("an RFC 3339 time")
}

/// A pool of the entry's own on the test's database, so closing it leaves the test's alone.
fn own_pool(env: &TestEnv) -> anyhow::Result<PgPool> {
    Ok(sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_lazy(env.config.database_url.expose())?)
}

/// Reads of the `activities` table the database has counted (sequential and index scans),
/// once no other session is connected to it (a server process reports its counts when it
/// idles or exits, not at each statement: a pool closed a moment ago may still have a backend
/// on its way out) and the count stopped moving. Scans, not transactions: the autovacuum
/// worker's visits and a connection's statement preparations are transactions of the database
/// too, and scan no table.
async fn activity_reads(database_url: &str) -> anyhow::Result<i64> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(database_url).await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let others: i64 = sqlx::query_scalar(
            "select count(*) from pg_stat_activity
             where datname = current_database() and pid <> pg_backend_pid()",
        )
        .fetch_one(&mut conn)
        .await?;
        if others == 0 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut last = None;
    loop {
        // Not a checked `query!`: the server's statistics view is no part of the schema
        // `.sqlx/` describes, and nothing but this test reads it. The snapshot of the
        // statistics is taken anew after the transaction it was first read in; each read here
        // is its own transaction.
        let count: i64 = sqlx::query_scalar(
            "select (seq_scan + coalesce(idx_scan, 0))::bigint
             from pg_stat_user_tables where relname = 'activities'",
        )
        .fetch_one(&mut conn)
        .await?;
        if last == Some(count) || Instant::now() > deadline {
            conn.close().await?;
            return Ok(count);
        }
        last = Some(count);
        tokio::time::sleep(Duration::from_millis(1200)).await;
    }
}

/// Random ids above the highest sale cost no database read each: the container knows the
/// highest id (read at most once a second), and answers 404 above it. Before, each id cost a
/// read of its own.
async fn random_ids_above_the_highest_sale_cost_no_database_read_each(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let activity = env.open_activity(5, 1).await?;
    let database = env.config.database_url.expose().to_string();
    env.pool.close().await;
    let before = activity_reads(&database).await?;
    let pool = own_pool(&env)?;
    let app = entry_with_pool(&env, pool.clone());

    let ids: Vec<i64> = (1..=300).map(|n| activity.id + 1_000 * n + n % 7).collect();
    let answers = futures::future::join_all(ids.iter().map(|id| view(&app, *id))).await;
    let (status, _, body) = view(&app, activity.id).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the real sale is still shown: {body}"
    );
    pool.close().await;

    for (status, cache_control, body) in answers {
        assert_eq!(
            (status, body["error"].as_str()),
            (StatusCode::NOT_FOUND, Some("not_found"))
        );
        assert_eq!(cache_control, CACHE_NOT_FOUND);
    }
    let reads = activity_reads(&database).await? - before;
    assert!(
        reads <= 3,
        "{reads} database reads for 300 distinct unknown ids"
    );
    Ok(())
}
on_every_redis!(random_ids_above_the_highest_sale_cost_no_database_read_each);

/// An id has one spelling: `+7`, `007` are 404 with no I/O at all (the database here is out
/// of reach, so any read would answer 503); junk stays 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_non_canonical_id_is_not_found_without_any_io() -> anyhow::Result<()> {
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let app = entry_with_pool(&env, dead_pool());
    for path in [
        "/activities/+7",
        "/activities/007",
        "/activities/%2B7",
        "/activities/07/orders/me",
    ] {
        let (status, body) = call(&app, request("GET", path, Some(("alice", "")), None)).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (StatusCode::NOT_FOUND, Some("not_found")),
            "{path}: {body}"
        );
    }
    let (status, _) = call(&app, request("GET", "/activities/7", None, None)).await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "the canonical id is read"
    );
    let (status, _) = call(&app, request("GET", "/activities/7x", None, None)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    Ok(())
}

/// The deep check asks the dependencies at most once per period and container: a Redis that
/// dies right after a check is not asked again until the period is over (before, each call
/// asked all three dependencies).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_deep_check_is_answered_from_the_last_one_for_a_few_seconds() -> anyhow::Result<()> {
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let private = PrivateRedis::start().await;
    let mut config = env.config.clone();
    config.redis = seckill_shared::infra::config::RedisTopology::Standalone(private.url().into());
    let redis = Redis::connect(&config).await?;
    let app = env.entry_router_with(|c| c.redis = redis);
    let deep = || call_with_headers(&app, request("GET", "/health/deep", None, None));
    assert_eq!(deep().await.0, StatusCode::OK);

    drop(private);
    let answers = futures::future::join_all((0..20).map(|_| deep())).await;

    for (status, _, body) in answers {
        assert_eq!(
            status,
            StatusCode::OK,
            "answered from the last check: {body}"
        );
    }
    Ok(())
}
