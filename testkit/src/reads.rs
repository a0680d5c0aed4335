//! What tests assert on: a sale's Redis state and database rows, read with the production
//! readers where there is one (`ledger::snapshot`, `view::stock`, `order::of_activity`, ...),
//! and the few reads only tests make (the lock's holder, one user's field, row counts).

use crate::env::TestEnv;
use seckill_shared::domain::activity;
use seckill_shared::domain::order::{self, Order};
use seckill_shared::store::conn::Redis;
use seckill_shared::store::keys::Bucket;
use seckill_shared::store::ledger::{self, Snapshot};
use seckill_shared::store::view;

/// Bucket 0's snapshot (the whole of a sale with one bucket).
pub async fn snapshot(env: &TestEnv, activity_id: i64) -> Snapshot {
    ledger::snapshot(&env.redis, activity_id).await.unwrap()
}

/// Bucket 0's stock in Redis, `None` when the sale is not loaded.
pub async fn redis_stock(env: &TestEnv, activity_id: i64) -> Option<i64> {
    view::stock(&env.redis, activity_id).await.unwrap()
}

/// Whether `user` holds a field in bucket 0's `users`.
pub async fn is_participant(env: &TestEnv, activity_id: i64, user: &str) -> bool {
    let k = env.redis.keys(activity_id);
    env.redis
        .cmd(redis::cmd("HEXISTS").arg(&k.users).arg(user))
        .await
        .unwrap()
}

/// What `user`'s field in `users` holds (the request id that holds her quota), if any.
pub async fn field(
    redis: &Redis,
    at: impl Into<Bucket>,
    user: &str,
) -> anyhow::Result<Option<String>> {
    let k = redis.bucket_keys(at.into());
    Ok(redis
        .cmd(redis::cmd("HGET").arg(&k.users).arg(user))
        .await?)
}

pub async fn db_remaining(env: &TestEnv, activity_id: i64) -> i64 {
    activity::remaining_stock(&env.pool, activity_id)
        .await
        .unwrap()
        .expect("the activity exists")
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

/// The activity's lock as Redis holds it (`lua/lock_acquire.lua`): who holds it, how many
/// holds they have, and the fencing token of their outermost acquisition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockHold {
    pub owner: String,
    pub holds: i64,
    pub token: i64,
}

/// Reads the activity's lock; `None` when nobody holds it.
pub async fn lock_hold(redis: &Redis, activity_id: i64) -> anyhow::Result<Option<LockHold>> {
    let lock = redis.keys(activity_id).lock;
    let fields: std::collections::HashMap<String, i64> =
        redis.cmd(redis::cmd("HGETALL").arg(&lock)).await?;
    if fields.is_empty() {
        return Ok(None);
    }
    let token = *fields
        .get("token")
        .ok_or_else(|| anyhow::anyhow!("{lock} has no token"))?;
    let mut owners = fields.into_iter().filter(|(field, _)| field != "token");
    let (owner, holds) = owners
        .next()
        .ok_or_else(|| anyhow::anyhow!("{lock} has no owner"))?;
    anyhow::ensure!(owners.next().is_none(), "{lock} has two owners");
    Ok(Some(LockHold {
        owner,
        holds,
        token,
    }))
}
