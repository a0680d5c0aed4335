//! The five ways to take one unit: each strategy's attempt, on the clients and counters of
//! its run ([`Ctx`]).

use crate::util::{dies, Counter, Outcome};
use redis::aio::ConnectionManager;
use seckill_shared::domain::activity;
use seckill_shared::domain::order;
use seckill_shared::domain::purchase::Attempt;
use seckill_shared::store::conn::Redis;
use seckill_shared::store::keys::Keys;
use seckill_shared::store::purchase;
use seckill_shared::store::scripts;
use sqlx::PgPool;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// Lease of the `lock` strategy's lock: 200 ms, not seconds, so a holder that dies in the kill
/// run stalls the others only briefly (generous to the lock).
pub const LOCK_LEASE_MS: u64 = 200;
/// How long a `lock` attempt waits for the lock before answering busy.
pub const LOCK_WAIT: Duration = Duration::from_secs(1);
/// Sleep between two lock tries.
pub const LOCK_RETRY: Duration = Duration::from_millis(1);
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    Lua,
    Hincrby,
    Lock,
    DbOnly,
    Limit,
}

impl Strategy {
    pub const ALL: [Strategy; 5] = [
        Strategy::Lua,
        Strategy::Hincrby,
        Strategy::Lock,
        Strategy::DbOnly,
        Strategy::Limit,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Strategy::Lua => "lua",
            Strategy::Hincrby => "hincrby",
            Strategy::Lock => "lock",
            Strategy::DbOnly => "db-only",
            Strategy::Limit => "limit",
        }
    }

    pub(super) fn killable(self) -> bool {
        matches!(self, Strategy::Lua | Strategy::Hincrby | Strategy::Lock)
    }
}

/// One strategy run's clients, keys and counters.
pub(super) struct Ctx {
    pub(super) redis: Redis,
    pub(super) cm: ConnectionManager,
    pub(super) keys: Keys,
    /// `hincrby`: the goods hash, whose stock field HINCRBY decrements.
    pub(super) goods: String,
    pub(super) users: Arc<Vec<String>>,
    pub(super) request_ids: Arc<Vec<String>>,
    pub(super) purchase_sha: String,
    /// `limit`: the bucket count and the sale's terms, as the entry carries them.
    pub(super) carried: Vec<String>,
    pub(super) die_permille: u64,
    pub(super) negative: Counter,
    pub(super) calls: Counter,
    pub(super) pool: Option<PgPool>,
    pub(super) activity_id: i64,
}

pub(super) async fn attempt(c: Arc<Ctx>, s: Strategy, i: usize) -> Outcome {
    let die = c.die_permille > 0 && dies(i, c.die_permille);
    let result = match s {
        Strategy::Lua => lua(&c, i, die).await,
        Strategy::Hincrby => hincrby(&c, i, die).await,
        Strategy::Lock => lock(&c, i, die).await,
        Strategy::DbOnly => db_only(&c, i).await,
        Strategy::Limit => limit(&c, i).await,
    };
    result.unwrap_or_else(|e| Outcome::Error(format!("{e:#}")))
}

async fn lua(c: &Ctx, i: usize, die: bool) -> anyhow::Result<Outcome> {
    c.calls.fetch_add(1, Ordering::Relaxed);
    let d = testkit::purchase(
        &c.redis,
        c.activity_id,
        &c.users[i],
        1,
        Uuid::now_v7(),
        purchase::far_deadline(),
    )
    .await?;
    Ok(match d {
        // The script is one step: the only place to die is after it (with the reservation,
        // if any, already in the ledger).
        _ if die => Outcome::Died,
        Ok(_) => Outcome::Sold,
        _ => Outcome::Refused,
    })
}

async fn hincrby(c: &Ctx, i: usize, die: bool) -> anyhow::Result<Outcome> {
    let _ = i;
    let mut cm = c.cm.clone();
    c.calls.fetch_add(1, Ordering::Relaxed);
    let left: i64 = redis::cmd("HINCRBY")
        .arg(&c.goods)
        .arg("stock")
        .arg(-1)
        .query_async(&mut cm)
        .await?;
    if die {
        return Ok(Outcome::Died);
    }
    if left < 0 {
        c.negative.fetch_add(1, Ordering::Relaxed);
        c.calls.fetch_add(1, Ordering::Relaxed);
        let _: i64 = redis::cmd("HINCRBY")
            .arg(&c.goods)
            .arg("stock")
            .arg(1)
            .query_async(&mut cm)
            .await?;
        return Ok(Outcome::Refused);
    }
    Ok(Outcome::Sold)
}

async fn lock(c: &Ctx, i: usize, die: bool) -> anyhow::Result<Outcome> {
    let mut cm = c.cm.clone();
    let owner = format!("owner-{i}");
    let deadline = tokio::time::Instant::now() + LOCK_WAIT;
    loop {
        c.calls.fetch_add(1, Ordering::Relaxed);
        let token: i64 = scripts::LOCK_ACQUIRE
            .key(&c.keys.lock)
            .key(&c.keys.fence)
            .arg(&owner)
            .arg(LOCK_LEASE_MS)
            .arg(0)
            .invoke_async(&mut cm)
            .await?;
        if token > 0 {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(Outcome::Busy);
        }
        tokio::time::sleep(LOCK_RETRY).await;
    }
    c.calls.fetch_add(1, Ordering::Relaxed);
    let stock: Option<i64> = redis::cmd("HGET")
        .arg(&c.keys.meta)
        .arg("stock")
        .query_async(&mut cm)
        .await?;
    let outcome = if stock.unwrap_or(0) >= 1 {
        c.calls.fetch_add(1, Ordering::Relaxed);
        let left: i64 = redis::cmd("HINCRBY")
            .arg(&c.keys.meta)
            .arg("stock")
            .arg(-1)
            .query_async(&mut cm)
            .await?;
        if left < 0 {
            c.negative.fetch_add(1, Ordering::Relaxed);
        }
        Outcome::Sold
    } else {
        Outcome::Refused
    };
    if die {
        // Dead inside the critical section, before the release: a unit it took is gone, and
        // the lock stays until its lease runs out.
        return Ok(Outcome::Died);
    }
    c.calls.fetch_add(1, Ordering::Relaxed);
    let _: i64 = scripts::LOCK_RELEASE
        .key(&c.keys.lock)
        .arg(&owner)
        .arg("all")
        .invoke_async(&mut cm)
        .await?;
    Ok(outcome)
}

async fn db_only(c: &Ctx, i: usize) -> anyhow::Result<Outcome> {
    let pool = c.pool.as_ref().expect("db-only has a pool");
    let mut tx = pool.begin().await?;
    // The stock first, then the order: the classic database-only flash sale, on the same
    // statements the consumer runs.
    if activity::take_stock(&mut tx, c.activity_id, 1, None)
        .await?
        .is_none()
    {
        tx.rollback().await?;
        return Ok(Outcome::Refused);
    }
    let attempt = Attempt {
        request_id: Uuid::now_v7(),
        activity_id: c.activity_id,
        user_id: c.users[i].clone(),
        quantity: 1,
        buckets: 1,
    };
    order::insert_confirmed(&mut tx, &attempt).await?;
    tx.commit().await?;
    Ok(Outcome::Sold)
}

async fn limit(c: &Ctx, i: usize) -> anyhow::Result<Outcome> {
    let mut cm = c.cm.clone();
    c.calls.fetch_add(1, Ordering::Relaxed);
    // purchase.lua answers {code, value, nowMs, epoch, credited}, or a bare sold-out code
    // (the terms are the meta's: no sixth element).
    let answer: redis::Value = redis::cmd("EVALSHA")
        .arg(&c.purchase_sha)
        .arg(3)
        .arg(&c.keys.meta)
        .arg(&c.keys.users)
        .arg(&c.keys.ledger)
        .arg(&c.users[i])
        .arg(1)
        .arg(&c.request_ids[i])
        .arg(purchase::far_deadline())
        .arg(&c.carried)
        .query_async(&mut cm)
        .await?;
    Ok(if purchase::reply(answer)?.code == 0 {
        Outcome::Sold
    } else {
        Outcome::Refused
    })
}
