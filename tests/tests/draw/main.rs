//! Draw admission against real Redis (standalone and cluster), PostgreSQL and the SQS
//! emulator: the pool and its one entry per user, the draw's fairness against first come,
//! first served, a crash between the draw and its orders, a second drawer, reconcile against a late record, the
//! stock the pool left, and the per-user purchase rate.
//!
//! The [`door`] (a crowd's entries sharing batches), [`fairness`] and a draw anyone can check,
//! the [`pool`], a draw where nothing left [`fits`], the winners' [`orders`] after a draw, an entry
//! answered 503 ([`unavailable`]), and the [`rules`] of admission.

mod door;
mod fairness;
mod fits;
mod orders;
mod pool;
mod rules;
mod unavailable;

use seckill_shared::domain::purchase::Attempt;
use seckill_shared::protocol::purchase::{self, Outcome};
use seckill_shared::store;
use seckill_shared::store::conn::Redis;
use testkit::TestEnv;
use uuid::Uuid;

/// One attempt as the entry makes it, without HTTP: for the crowds of the fairness test.
async fn enter(env: &TestEnv, activity_id: i64, user: &str) -> Outcome {
    enter_units(&env.redis, activity_id, user, 1).await
}

/// [`enter`] for `quantity` units, through `redis` (a function's Redis user).
async fn enter_units(redis: &Redis, activity_id: i64, user: &str, quantity: i64) -> Outcome {
    let mut buy = Attempt {
        request_id: Uuid::now_v7(),
        activity_id,
        user_id: user.to_string(),
        quantity,
        buckets: 1,
    };
    purchase::enter(
        redis,
        &seckill_shared::protocol::buckets::Hints::none(),
        &mut buy,
        store::purchase::far_deadline(),
    )
    .await
    .expect("redis answers")
}

/// Whether any step of the draw of sale `activity_id` ran (the meta's cursor `drawAt`).
async fn draw_started(env: &TestEnv, activity_id: i64) -> anyhow::Result<bool> {
    let k = env.redis.keys(activity_id);
    let at: Option<i64> = env
        .redis
        .cmd(redis::cmd("HGET").arg(&k.meta).arg("drawAt"))
        .await?;
    Ok(at.is_some())
}
