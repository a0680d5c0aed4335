//! States production reaches by a crash, a loss or time passing, made by hand: Redis losing a
//! sale or one buyer's field, the database's stock drifting, a window closing, reservations
//! ageing, and the pools a test swaps in to break or watch the database.

use crate::env::TestEnv;
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use seckill_shared::domain::activity;
use seckill_shared::store::conn::Redis;
use seckill_shared::store::keys::Bucket;
use seckill_shared::store::scripts::with_prelude;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

/// Redis loses a sale, as after a restart with no data: its meta (with the stock), users,
/// ledger and a draw sale's pool, tickets and winners go (the lock and the fencing counter
/// stay).
pub async fn lose_activity(redis: &Redis, activity_id: i64) -> anyhow::Result<()> {
    let k = redis.keys(activity_id);
    let _: i64 = redis
        .cmd(
            redis::cmd("DEL")
                .arg(&k.meta)
                .arg(&k.users)
                .arg(&k.ledger)
                .arg(&k.pool)
                .arg(&k.winners)
                .arg(&k.tickets),
        )
        .await?;
    Ok(())
}

/// Redis loses one buyer's field in `users` while the sale stays loaded, as a failover that
/// dropped the last writes can leave it: only a field with no ledger entry of the user (every
/// script writes an entry together with the field, so a lost suffix of writes never leaves
/// an entry without its field). Returns whether a field went.
pub async fn lose_field(redis: &Redis, at: impl Into<Bucket>, user: &str) -> anyhow::Result<bool> {
    let k = redis.bucket_keys(at.into());
    let script = redis::Script::new(
        "if redis.call('EXISTS', KEYS[1]) == 1 and redis.call('HEXISTS', KEYS[3], ARGV[1]) == 0 \
         then return redis.call('HDEL', KEYS[2], ARGV[1]) end return 0",
    );
    let mut inv = script.prepare_invoke();
    inv.key(&k.meta).key(&k.users).key(&k.ledger).arg(user);
    let lost: i64 = redis.script(&inv).await?;
    Ok(lost == 1)
}

/// Drift by hand: the database's remaining stock set behind every actor's back (reconcile's
/// own repair statement).
pub async fn set_db_stock_by_hand(env: &TestEnv, activity_id: i64, remaining: i64) {
    activity::set_remaining_stock(&env.pool, activity_id, remaining)
        .await
        .unwrap();
}

/// Moves the sale's window into the past (an hour ago it ended), in the database only.
pub async fn end_activity_by_hand(env: &TestEnv, activity_id: i64) {
    sqlx::query!(
        "update activities set start_at = now() - interval '2 hours',
             end_at = now() - interval '1 hour' where id = $1",
        activity_id
    )
    .execute(&env.pool)
    .await
    .unwrap();
}

/// Closes a draw sale's pool now, as the clock reaching `startAt + drawWindowMs` does: the
/// meta's `drawEndMs` set a minute back (the row keeps its window; only Redis decides).
pub async fn close_draw_window(env: &TestEnv, activity_id: i64) {
    let meta = env.redis.keys(activity_id).meta;
    // A minute ago: past the drawer's settle margin for the order queue's backlog.
    let past = Utc::now().timestamp_millis() - 60_000;
    let mut con = env.redis.conn.clone();
    set_term(&mut con, &meta, "drawEndMs", past)
        .await
        .expect("redis answers");
}

/// Sets one of the sale's terms in a loaded meta (`startMs`, `endMs`, `limit`, `drawEndMs` or
/// `rate`), as a test moves the clock or an operator's hand would, and writes the meta's
/// `terms` again from its fields, as preheat and an admin change write them together: a
/// caller's copy of the old terms is then not used.
pub async fn set_term(
    con: &mut impl redis::aio::ConnectionLike,
    meta: &str,
    field: &str,
    value: i64,
) -> redis::RedisResult<()> {
    static SET_TERM: LazyLock<redis::Script> = LazyLock::new(|| {
        redis::Script::new(&with_prelude(
            "redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])\n\
             redis.call('HSET', KEYS[1], 'terms', terms_of_fields(KEYS[1]))\n\
             return 0\n",
        ))
    });
    SET_TERM
        .key(meta)
        .arg(field)
        .arg(value)
        .invoke_async::<i64>(con)
        .await
        .map(drop)
}

/// A moment past a reconcile grace period of `grace` for anything done before now.
pub fn after_grace(grace: Duration) -> DateTime<Utc> {
    Utc::now() + ChronoDuration::from_std(grace).unwrap() + ChronoDuration::seconds(1)
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
        let parts: Vec<&str> = value.split('|').collect();
        if parts.first() != Some(&"r") || parts.len() < 4 {
            continue;
        }
        let ms: i64 = parts[3].parse().expect("a reservation's ms");
        let aged = format!("r|{}|{}|{}", parts[1], parts[2], ms - by.as_millis() as i64);
        let _: () = env
            .redis
            .cmd(redis::cmd("HSET").arg(&k.ledger).arg(user).arg(aged))
            .await
            .expect("redis answers");
    }
}

/// A pool whose database is a port nobody listens on: every query fails, fast.
pub fn dead_pool() -> sqlx::PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy("postgres://postgres@127.0.0.1:1/nowhere")
        .expect("a well-formed URL")
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

/// An order queue of `env`'s whose endpoint refuses every connection (a dead port), with a
/// send timeout of a second.
pub fn dead_queue(env: &TestEnv) -> seckill_shared::infra::sqs::OrderQueue {
    let conf = env
        .sqs
        .config()
        .to_builder()
        .endpoint_url("http://127.0.0.1:9")
        .build();
    seckill_shared::infra::sqs::OrderQueue::new(
        aws_sdk_sqs::Client::from_conf(conf),
        env.queue.url.clone(),
        Duration::from_secs(1),
    )
}
