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
//!
//! Here the logins of a role and the helpers every part shares; the roles as the [`migration`]
//! makes them, the [`buyers_path`], the [`jobs_and_admin`], and the [`redis_users`]' refusals.

mod buyers_path;
mod jobs_and_admin;
mod migration;
mod redis_users;

use aws_lambda_events::event::sqs::SqsEvent;
use seckill_shared::infra::db;
use seckill_shared::store::conn::Redis;
use seckill_shared::Context;
use sqlx::postgres::PgConnectOptions;
use sqlx::PgPool;
use testkit::RedisKind;
use testkit::TestEnv;
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
        serde_json::from_str(include_str!("../../../events/order-consumer-batch.json")).unwrap();
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
