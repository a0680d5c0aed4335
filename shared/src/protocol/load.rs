//! Loading a sale into Redis, fenced like every admin write: the loader (preheat, reconcile's
//! reload of a running sale, an admin's create or change inside the preheat lead) holds the
//! sale's lock, records its token in the transaction that reads the row, and
//! `lua/preheat.lua` writes only for the lock's owner. A sale Redis does not hold gets its
//! `users` rebuilt from the live orders first, and a new load epoch. docs/invariants.md,
//! "Load".

use crate::domain::activity::{self, Activity};
use crate::domain::draw as kept;
use crate::domain::order;
use crate::infra::config::Config;
use crate::infra::pause;
use crate::protocol::draw::{self, DrawError};
use crate::protocol::lock::{self, LockError, LockGuard};
use crate::store::buckets::{self, all_loaded};
use crate::store::conn::{Redis, StoreError};
use crate::store::keys::Bucket;
use crate::store::meta::{self, PreheatOutcome};
use sqlx::PgPool;
use std::time::{Duration, Instant};

/// How long a loader waits for the sale's lock before leaving the load to its next run.
const LOCK_WAIT: Duration = Duration::from_millis(500);

/// Users added to `users` per script call when it is rebuilt.
const REBUILD_CHUNK: usize = 1000;

/// Why a load did not happen.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    /// The caller's time was spent before the load began: nothing was done, a later run
    /// loads the sale.
    #[error("no time left to load the sale; a later run loads it")]
    OutOfTime,
}

/// Takes the sale's lock, records its token while reading the row, and loads the row into
/// Redis, by `deadline` (the caller's invocation's: a draw sale's pool rebuild stops there and
/// goes on with reconcile's next run; a load is not begun past it, [`LoadError::OutOfTime`]).
/// `Err(LoadError::Lock(LockError::Busy))`: someone is changing the sale; a later run loads it.
pub async fn load_under_lock(
    redis: &Redis,
    pool: &PgPool,
    config: &Config,
    activity_id: i64,
    deadline: Instant,
) -> Result<(PreheatOutcome, Activity), LoadError> {
    load_locked(redis, pool, config, activity_id, false, deadline).await
}

/// [`load_under_lock`] from scratch even when Redis holds the sale: every bucket unloaded and
/// loaded again, as after a loss. For a draw sale whose Redis draw is not the recorded one:
/// the load puts the recorded outcome back.
pub async fn reload_under_lock(
    redis: &Redis,
    pool: &PgPool,
    config: &Config,
    activity_id: i64,
    deadline: Instant,
) -> Result<(PreheatOutcome, Activity), LoadError> {
    load_locked(redis, pool, config, activity_id, true, deadline).await
}

async fn load_locked(
    redis: &Redis,
    pool: &PgPool,
    config: &Config,
    activity_id: i64,
    from_scratch: bool,
    deadline: Instant,
) -> Result<(PreheatOutcome, Activity), LoadError> {
    if Instant::now() >= deadline {
        return Err(LoadError::OutOfTime);
    }
    let wait = LOCK_WAIT.min(config.lock_wait);
    let guard = lock::acquire(redis, pool, activity_id, config.lock_ttl, wait).await?;
    let loaded = async {
        // Under the lock nobody else loads: whether Redis holds the sale cannot change.
        let count = activity::bucket_count(pool, activity_id).await?;
        let fresh = from_scratch || !all_loaded(redis, activity_id, count).await?;
        if fresh && !unload_all(redis, activity_id, count, &guard.owner).await? {
            let row = activity::get(pool, activity_id).await?;
            return Ok((
                PreheatOutcome::NotOwner,
                row.ok_or(sqlx::Error::RowNotFound)?,
            ));
        }
        let row = fence_and_read(pool, &guard, fresh).await?;
        pause::point("preheat.before_load", activity_id).await;
        let buffer = config.expiry_buffer;
        let outcome = load_fenced(redis, pool, &guard.owner, &row, fresh, buffer, deadline).await?;
        Ok::<_, LoadError>((outcome, row))
    };
    let result = match guard.run(loaded).await {
        Ok(result) => result,
        Err(lost) => Err(lost.into()),
    };
    if let Err(e) = guard.release().await {
        tracing::warn!(activity_id, error = %e, "lock release failed; it expires by itself");
    }
    result
}

/// Records the guard's token and reads the row, in one transaction: an admin write with an
/// older token is refused from here on, and one that committed before is in the row. With
/// `new_epoch` (a load from scratch) the row's load epoch is bumped in the same transaction:
/// an order or a cancel made under the old epoch either committed before (and is in the row
/// read here) or is refused after.
pub async fn fence_and_read(
    pool: &PgPool,
    guard: &LockGuard,
    new_epoch: bool,
) -> Result<Activity, LoadError> {
    let mut tx = pool.begin().await?;
    lock::fenced_update(&mut tx, guard.activity_id, guard.token).await?;
    if new_epoch {
        activity::bump_load_epoch(&mut tx, guard.activity_id).await?;
    }
    let row = activity::get(&mut *tx, guard.activity_id)
        .await?
        .ok_or(sqlx::Error::RowNotFound)?;
    tx.commit().await?;
    Ok(row)
}

/// Loads `row` for the lock `owner`: when the sale is not wholly in Redis (a bucket missing,
/// or loaded with another bucket count), every bucket is unloaded and gets its `users` rebuilt
/// from the live orders of its users (what a lost sale left of its set and ledger goes); then
/// `lua/preheat.lua` writes stock, meta and expiry in every bucket. A load from scratch needs
/// a `row` read with a new epoch (`new_epoch`, by [`fence_and_read`]): a bucket that went
/// missing after a row was read under the old epoch (evicted, expired) is left to the next
/// load, which bumps it (`LockError::Busy`), since reservations of that epoch could still
/// commit against the stock this load would write.
pub async fn load_fenced(
    redis: &Redis,
    pool: &PgPool,
    owner: &str,
    row: &Activity,
    new_epoch: bool,
    buffer: Duration,
    deadline: Instant,
) -> Result<PreheatOutcome, LoadError> {
    let count = row.bucket_count();
    if !all_loaded(redis, row.id, count).await? {
        if !new_epoch {
            tracing::warn!(
                activity_id = row.id,
                "a bucket went missing during the load; next run loads it from scratch"
            );
            return Err(LockError::Busy.into());
        }
        if !unload_all(redis, row.id, count, owner).await? {
            return Ok(PreheatOutcome::NotOwner);
        }
        let holders = order::live_holders(pool, row.id).await?;
        for bucket in Bucket::all(row.id, count) {
            let mine: Vec<(String, uuid::Uuid)> = holders
                .iter()
                .filter(|(user, _)| Bucket::home(row.id, count, user) == bucket)
                .cloned()
                .collect();
            if !rebuild_bucket(redis, bucket, owner, &mine).await? {
                return Ok(PreheatOutcome::NotOwner);
            }
        }
        if !holders.is_empty() {
            tracing::info!(
                activity_id = row.id,
                holders = holders.len(),
                "users rebuilt from the live orders"
            );
        }
        if row.draw_end_ms() > 0 {
            // A draw sale's recorded winners without an order hold their units: the stock
            // loaded leaves them out, and the rebuild below puts their reservations back.
            let stock = kept::stock_to_load(pool, row.id)
                .await?
                .ok_or(sqlx::Error::RowNotFound)?;
            let row = Activity {
                remaining_stock: stock,
                ..row.clone()
            };
            let outcome = meta::preheat(redis, &row, buffer, owner).await?;
            rebuild_pool(redis, pool, row.id, deadline).await?;
            return Ok(outcome);
        }
    }
    let outcome = meta::preheat(redis, row, buffer, owner).await?;
    if row.draw_end_ms() > 0 {
        // A rebuild an earlier load did not finish goes on (one read when none is due).
        rebuild_pool(redis, pool, row.id, deadline).await?;
    }
    Ok(outcome)
}

/// How long one load gives a draw sale's pool rebuild; what is left reconcile's next run
/// finishes (before it runs the draw).
const REBUILD_BUDGET: Duration = Duration::from_secs(10);

/// The rebuild of a draw sale's pool from the database ([`draw::rebuild`]), within
/// [`REBUILD_BUDGET`] and the caller's `deadline`.
async fn rebuild_pool(
    redis: &Redis,
    pool: &PgPool,
    activity_id: i64,
    deadline: Instant,
) -> Result<(), LoadError> {
    let deadline = deadline.min(Instant::now() + REBUILD_BUDGET);
    match draw::rebuild(redis, pool, activity_id, deadline).await {
        Ok(r) if r.winners > 0 || r.entries > 0 || !r.done => tracing::warn!(
            activity_id,
            winners = r.winners,
            entries = r.entries,
            done = r.done,
            repair = "pool_rebuilt",
            "draw pool rebuilt from the database"
        ),
        Ok(_) => {}
        Err(DrawError::Store(e)) => return Err(e.into()),
        Err(DrawError::Db(e)) => return Err(e.into()),
        Err(e) => tracing::warn!(activity_id, error = %e, "draw pool rebuild stopped"),
    }
    Ok(())
}

/// Rebuilds one bucket's `users` from `holders` (its users' live orders), in chunks.
async fn rebuild_bucket(
    redis: &Redis,
    bucket: Bucket,
    owner: &str,
    holders: &[(String, uuid::Uuid)],
) -> Result<bool, StoreError> {
    if holders.is_empty() {
        return meta::rebuild_users(redis, bucket, owner, true, &[]).await;
    }
    for (i, chunk) in holders.chunks(REBUILD_CHUNK).enumerate() {
        if !meta::rebuild_users(redis, bucket, owner, i == 0, chunk).await? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Unloads every bucket of the layout with `count` buckets (`lua/unload.lua`), so that no
/// purchase runs in any of them until the load from scratch has rebuilt them all: a bucketed
/// sale is loaded whole. False: not the lock's owner.
async fn unload_all(
    redis: &Redis,
    activity_id: i64,
    count: u32,
    owner: &str,
) -> Result<bool, StoreError> {
    for bucket in Bucket::all(activity_id, count) {
        if !buckets::unload(redis, bucket, owner).await? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The sale's layout in Redis is about to change from `old` buckets: unloads all of them (an
/// admin changing the bucket count, before the database commits the new count). False: not
/// the lock's owner.
pub async fn unload_layout(redis: &Redis, guard: &LockGuard, old: u32) -> Result<bool, StoreError> {
    unload_all(redis, guard.activity_id, old, &guard.owner).await
}

/// A load from scratch by a holder whose token the database already recorded (an admin change
/// that found the sale not loaded): the epoch is bumped only while the row still carries the
/// guard's token, i.e. no newer holder wrote since. `None`: one did; the load is theirs.
pub async fn load_after_change(
    redis: &Redis,
    pool: &PgPool,
    guard: &LockGuard,
    buffer: Duration,
    deadline: Instant,
) -> Result<Option<PreheatOutcome>, LoadError> {
    let count = activity::bucket_count(pool, guard.activity_id).await?;
    guard.cover(count).await?;
    if !all_loaded(redis, guard.activity_id, count).await?
        && !unload_all(redis, guard.activity_id, count, &guard.owner).await?
    {
        return Ok(Some(PreheatOutcome::NotOwner));
    }
    let row = activity::bump_load_epoch_if_fenced(pool, guard.activity_id, guard.token).await?;
    match row {
        Some(row) => Ok(Some(
            load_fenced(redis, pool, &guard.owner, &row, true, buffer, deadline).await?,
        )),
        None => Ok(None),
    }
}
