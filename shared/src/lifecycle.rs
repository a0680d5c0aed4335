//! An order's life after the consumer confirmed it: payment and cancellation.
//!
//! `confirmed` -> `paid` by its owner ([`pay_order`]), or `confirmed` -> `cancelled` by its
//! owner or by reconcile's payment timeout ([`cancel_order`]). Paid orders are refunds, which
//! are out of scope: they cannot be cancelled here. `cancelled` and `paid` are final, so a pay
//! after a cancel (or after the payment timeout) is refused, and whichever of a racing pay and
//! cancel commits first wins: both are conditional on `status = 'confirmed'`.
//!
//! # Why a cancellation touches Redis before and after the database
//!
//! A cancel changes three places: the order row, the DB stock, and Redis (stock + the user's
//! quota). They cannot change in one step, so each cancel *attempt* gets its own cancel id and
//! is announced first in the Redis ledger (`c|<cancelId>|qty|ms|<orderId>`,
//! `lua/cancel_begin.lua`), then committed in one DB transaction that records the cancel id on
//! the order row, then finished in Redis (`lua/cancel_finish.lua`: stock back, user out of the
//! set, entry dropped) for that id only.
//!
//! The announcement must come first. Between the DB commit and the Redis finish the database
//! is *ahead* of Redis (it already has the units back). Reconcile only corrects Redis stock from
//! the database while the ledger is quiet; with the `c` entry in the ledger it stays away, so it
//! never adds units to Redis that `cancel_finish` then adds a second time.
//!
//! The cancel id is what makes a second canceller harmless. A canceller that read the order
//! as confirmed may get to its announcement only after another attempt has already finished
//! (a double click, overlapping reconcile runs). Its announcement then succeeds (the ledger is
//! empty again) but its commit finds the order cancelled by another id: it drops its own entry
//! and gives nothing back. A finish applies only for the id the row names, so no stale or
//! second attempt can ever apply one. A canceller never adopts another attempt's entry either
//! (it answers `Busy`): the other attempt may still commit, or reconcile may be dropping it.
//!
//! A crash between the steps leaves a stale `c` entry, which reconcile repairs: if the order
//! row names that cancel id it runs `cancel_finish` (at most once: the entry guards it);
//! otherwise that attempt never committed and the entry is dropped with `settle`.
//! The full protocol is in `docs/invariants.md`.

use crate::cache::Redis;
use crate::error::ApiError;
use crate::order::{Order, OrderStatus};
use crate::sale;
use chrono::{DateTime, Utc};
use sale::{CancelAttempt, CancelBegin, EntryKind};
use sqlx::PgPool;
use uuid::Uuid;

/// What [`cancel_order`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CancelOutcome {
    /// This call cancelled the order; `quantity` units went back to the DB (and Redis, when the
    /// activity is still loaded there).
    Cancelled { quantity: i64 },
    /// The order was already cancelled: nothing changed (a double cancel is a no-op).
    AlreadyCancelled,
    /// The order is in a state that cannot be cancelled (`paid`, `failed`); carries the status.
    NotCancellable(String),
    /// Another ledger entry of the user is in flight; retry shortly (HTTP 409 `busy`).
    Busy,
}

/// Cancels a `confirmed` order exactly once: stock back to the DB and to Redis, the user's
/// quota freed so they may buy again. The caller has checked who may cancel (owner, or
/// reconcile's payment timeout); `order` is a recent read of the row, the database decides.
///
/// Steps (see the module docs for why in this order), under a fresh cancel id:
/// 1. `sale::cancel_begin` announces the attempt in the ledger (`Busy` ->
///    [`CancelOutcome::Busy`]; not loaded in Redis -> only the database changes);
/// 2. one DB transaction: the order `confirmed` -> `cancelled` with this cancel id, its
///    quantity back to `activities.remaining_stock`;
/// 3. `sale::cancel_finish` for this cancel id gives the units and the quota back in Redis.
///
/// If the database says the order was no longer `confirmed`, this attempt drops its own entry
/// and changes nothing else: already cancelled -> `AlreadyCancelled`; paid / failed ->
/// `NotCancellable`.
#[tracing::instrument(skip_all, fields(order_id = order.id, activity_id = order.activity_id))]
pub async fn cancel_order(
    pool: &PgPool,
    redis: &Redis,
    order: &Order,
    now: DateTime<Utc>,
) -> Result<CancelOutcome, ApiError> {
    if let Some(outcome) = already_final(redis, order).await? {
        return Ok(outcome);
    }
    let attempt = CancelAttempt {
        activity_id: order.activity_id,
        buckets: order.home().count,
        user_id: order.user_id.as_str(),
        order_id: order.id,
        request_id: order.request_id,
        quantity: i64::from(order.quantity),
        cancel_id: Uuid::now_v7(),
    };
    let epoch = match announce(pool, redis, order, &attempt, now).await? {
        Ok(epoch) => epoch,
        Err(answer) => return Ok(answer),
    };
    // If this fails the `c` entry stays: the commit may or may not have happened, and only
    // reconcile (reading the order row's cancel id later, or aborting this attempt) decides.
    let committed = commit_cancel(pool, order.id, attempt.cancel_id, epoch, now).await?;
    match committed {
        Committed::Cancelled(quantity) => {
            if epoch.is_some() {
                // The database is the system of record and holds the cancel now: a Redis hiccup
                // here leaves the `c` entry for reconcile, it does not undo the cancel.
                let finished =
                    sale::cancel_finish(redis, attempt.home(), attempt.user_id, attempt.cancel_id);
                if let Err(e) = finished.await {
                    tracing::warn!(error = %e, "cancel committed; redis half left to reconcile");
                }
            }
            tracing::info!(quantity, outcome = "cancelled", "order cancelled");
            Ok(CancelOutcome::Cancelled { quantity })
        }
        Committed::NotConfirmed => decided_first(pool, redis, &attempt, epoch).await,
        Committed::EpochMoved => {
            // Redis lost the sale (and this attempt's entry) and reloaded it meanwhile: the
            // reloaded stock was read without this cancel. Nothing changed; retry.
            Ok(CancelOutcome::Busy)
        }
    }
}

/// The answer for an order already in a final state (final states never change again, so a
/// stale read of one is still the truth); `None` for a confirmed order, which may be cancelled.
async fn already_final(redis: &Redis, order: &Order) -> Result<Option<CancelOutcome>, ApiError> {
    match OrderStatus::parse(&order.status) {
        Some(OrderStatus::Confirmed) => Ok(None),
        Some(OrderStatus::Cancelled) => {
            // Finishes the committed attempt's Redis half if a crash left it (guarded by its id).
            if let Some(cancel_id) = order.cancel_id {
                sale::cancel_finish(redis, order.home(), &order.user_id, cancel_id).await?;
            }
            Ok(Some(CancelOutcome::AlreadyCancelled))
        }
        _ => Ok(Some(CancelOutcome::NotCancellable(order.status.clone()))),
    }
}

/// Step 1: announces the attempt in the ledger. `Ok(epoch)` to go on and commit (the load
/// epoch the commit must still find, `None` for a sale only the database holds); `Err` with
/// the answer when this attempt stops here.
async fn announce(
    pool: &PgPool,
    redis: &Redis,
    order: &Order,
    attempt: &CancelAttempt<'_>,
    now: DateTime<Utc>,
) -> Result<Result<Option<i64>, CancelOutcome>, ApiError> {
    let activity_id = attempt.activity_id;
    crate::pause::point("cancel.before_begin", activity_id).await;
    let (begin, epoch) = sale::cancel_begin(redis, attempt, now.timestamp_millis()).await?;
    crate::pause::point("cancel.after_begin", activity_id).await;
    match begin {
        CancelBegin::Busy => Ok(Err(other_attempt(pool, redis, order).await?)),
        CancelBegin::Recorded => Ok(Ok(Some(epoch))),
        CancelBegin::NotHeld => Ok(Err(not_held(pool, order).await?)),
        CancelBegin::NotLoaded => {
            // Only a sale no loader will load again may change in the database alone: a load
            // in progress would write a stock read before this commit, and the unit would be
            // lost to Redis. A running sale missing from Redis is reloaded within a reconcile
            // run; until then the cancel is retried.
            if !sale_is_over(pool, activity_id, now).await? {
                return Ok(Err(CancelOutcome::Busy));
            }
            Ok(Ok(None))
        }
    }
}

/// Redis holds nothing for the order any more: the row, read again, says why. A cancelled or
/// otherwise final order answers as a repeated cancel would. A row still `confirmed` means
/// Redis lost the user's quota without losing the sale (which no protocol step does): the
/// attempt changes nothing and answers `Busy`, loudly.
async fn not_held(pool: &PgPool, order: &Order) -> Result<CancelOutcome, ApiError> {
    let row = crate::order::get(pool, order.id).await?;
    let status = row.map(|o| o.status).unwrap_or_default();
    Ok(match OrderStatus::parse(&status) {
        Some(OrderStatus::Cancelled) => CancelOutcome::AlreadyCancelled,
        Some(OrderStatus::Confirmed) => {
            tracing::error!(
                order_id = order.id,
                "a confirmed order whose user holds no quota in redis"
            );
            CancelOutcome::Busy
        }
        _ => CancelOutcome::NotCancellable(status),
    })
}

/// The order was no longer `confirmed` when this attempt committed: another attempt, a pay,
/// or reconcile on this attempt's behalf decided first. Only the attempt the row names may
/// finish; any other drops its entry.
async fn decided_first(
    pool: &PgPool,
    redis: &Redis,
    attempt: &CancelAttempt<'_>,
    epoch: Option<i64>,
) -> Result<CancelOutcome, ApiError> {
    let (user, cancel_id) = (attempt.user_id, attempt.cancel_id);
    let row = crate::order::get(pool, attempt.order_id).await?;
    let status = row.as_ref().map(|o| o.status.clone()).unwrap_or_default();
    if epoch.is_some() {
        if row.as_ref().and_then(|o| o.cancel_id) == Some(cancel_id) {
            sale::cancel_finish(redis, attempt.home(), user, cancel_id).await?;
        } else {
            sale::settle(redis, attempt.home(), user, &cancel_id.to_string()).await?;
        }
    }
    if status == OrderStatus::Cancelled.as_str() {
        Ok(CancelOutcome::AlreadyCancelled)
    } else if status == OrderStatus::Confirmed.as_str() {
        // Reconcile aborted this attempt (its announcement went stale): try again.
        Ok(CancelOutcome::Busy)
    } else {
        Ok(CancelOutcome::NotCancellable(status))
    }
}

/// Whether the sale has ended: no loader loads it again, so its Redis state is not needed.
async fn sale_is_over(
    pool: &PgPool,
    activity_id: i64,
    now: DateTime<Utc>,
) -> Result<bool, ApiError> {
    let a = crate::activity::get(pool, activity_id).await?;
    Ok(a.is_none_or(|a| a.phase(now) == crate::activity::Phase::Ended))
}

/// Another entry of the user was in flight. When it is another attempt to cancel this very
/// order (a double click, the payment timeout racing the owner), its outcome is a moment away:
/// wait for the row to say cancelled and answer `AlreadyCancelled`. Anything else, or an
/// attempt that does not commit in time (it may have crashed; reconcile drops its entry), is
/// `Busy`: never take over another attempt's entry.
async fn other_attempt(
    pool: &PgPool,
    redis: &Redis,
    order: &Order,
) -> Result<CancelOutcome, ApiError> {
    let cancelled = || async {
        let status = crate::order::get(pool, order.id).await?.map(|o| o.status);
        Ok::<_, ApiError>(status.as_deref() == Some(OrderStatus::Cancelled.as_str()))
    };
    // The other attempt may have finished (and its entry gone) since our announcement failed.
    if cancelled().await? {
        return Ok(CancelOutcome::AlreadyCancelled);
    }
    let entry = sale::ledger_entry(redis, order.home(), &order.user_id).await?;
    if !entry.is_some_and(|e| e.kind == EntryKind::Cancel && e.order_id == Some(order.id)) {
        // Gone now, or something else: one last look at the row decides.
        return Ok(if cancelled().await? {
            CancelOutcome::AlreadyCancelled
        } else {
            CancelOutcome::Busy
        });
    }
    let waited = std::time::Instant::now();
    while waited.elapsed() < OTHER_ATTEMPT_WAIT {
        if cancelled().await? {
            return Ok(CancelOutcome::AlreadyCancelled);
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    Ok(CancelOutcome::Busy)
}

/// How long a cancel waits for another attempt at the same order to commit.
const OTHER_ATTEMPT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// What the cancel's transaction did.
#[derive(Debug, PartialEq, Eq)]
pub enum Committed {
    /// This attempt cancelled the order; the quantity went back to the database.
    Cancelled(i64),
    /// The order was not `confirmed` any more, or reconcile aborted this attempt.
    NotConfirmed,
    /// The sale was loaded into Redis from scratch since the announcement.
    EpochMoved,
}

/// Step 2: one transaction, conditional on the order being `confirmed`, on this attempt not
/// being aborted by reconcile, and (when the attempt was announced in Redis) on the sale's load
/// epoch being the one the announcement saw.
pub async fn commit_cancel(
    pool: &PgPool,
    order_id: i64,
    cancel_id: Uuid,
    epoch: Option<i64>,
    now: DateTime<Utc>,
) -> Result<Committed, ApiError> {
    let mut tx = pool.begin().await?;
    let row = sqlx::query!(
        "update orders set status = 'cancelled', cancel_id = $3, cancelled_at = $2,
             updated_at = $2
         where id = $1 and status = 'confirmed' and not ($3 = any(aborted_cancel_ids))
         returning quantity, activity_id",
        order_id,
        now,
        cancel_id
    )
    .fetch_optional(&mut *tx)
    .await?
    .map(|r| (r.quantity, r.activity_id));
    let Some((quantity, activity_id)) = row else {
        tx.rollback().await?;
        return Ok(Committed::NotConfirmed);
    };
    let updated = sqlx::query!(
        "update activities set remaining_stock = remaining_stock + $2, updated_at = $3
         where id = $1 and ($4::bigint is null or load_epoch = $4)",
        activity_id,
        quantity,
        now,
        epoch
    )
    .execute(&mut *tx)
    .await?;
    if updated.rows_affected() != 1 {
        tx.rollback().await?;
        return Ok(Committed::EpochMoved);
    }
    tx.commit().await?;
    Ok(Committed::Cancelled(i64::from(quantity)))
}

/// Reconcile's verdict on a cancel attempt whose announcement went stale: from now on it may
/// not commit. Returns false when the order is no longer `confirmed` (the attempt, or another
/// one, committed first, or it was paid): the row then says what happened.
pub async fn abort_cancel(
    pool: &PgPool,
    order_id: i64,
    cancel_id: Uuid,
) -> Result<bool, sqlx::Error> {
    let aborted = sqlx::query!(
        "update orders set aborted_cancel_ids = array_append(aborted_cancel_ids, $2)
         where id = $1 and status = 'confirmed'",
        order_id,
        cancel_id
    )
    .execute(pool)
    .await?;
    Ok(aborted.rows_affected() == 1)
}

/// Pays a `confirmed` order of `user_id`. Paying a paid order again answers the order (200,
/// idempotent); someone else's or an unknown order is 404; a cancelled or failed order is 409
/// `conflict` (after the payment timeout reconcile has cancelled it, so a late pay is refused).
#[tracing::instrument(skip_all, fields(order_id = order_id))]
pub async fn pay_order(
    pool: &PgPool,
    order_id: i64,
    user_id: &str,
    now: DateTime<Utc>,
) -> Result<Order, ApiError> {
    let paid = sqlx::query_as!(
        Order,
        r#"update orders set status = 'paid', paid_at = $3, updated_at = $3
         where id = $1 and user_id = $2 and status = 'confirmed'
         returning id, request_id, activity_id, user_id, quantity, status, failure_reason,
                   created_at, updated_at, paid_at, cancelled_at, cancel_id,
                   (select buckets from activities a where a.id = orders.activity_id) as "buckets!""#,
        order_id,
        user_id,
        now
    )
    .fetch_optional(pool)
    .await?;
    if let Some(order) = paid {
        tracing::info!(outcome = "paid", "order paid");
        return Ok(order);
    }
    let order = owned_order(pool, order_id, user_id).await?;
    match OrderStatus::parse(&order.status) {
        Some(OrderStatus::Paid) => Ok(order),
        _ => Err(ApiError::Conflict(format!(
            "order {order_id} is {} and cannot be paid",
            order.status
        ))),
    }
}

/// The order if it exists and belongs to `user_id`; otherwise 404, the same answer for both so
/// order ids of other users cannot be probed.
pub async fn owned_order(pool: &PgPool, order_id: i64, user_id: &str) -> Result<Order, ApiError> {
    match crate::order::get(pool, order_id).await? {
        Some(order) if order.user_id == user_id => Ok(order),
        _ => Err(ApiError::NotFound(format!("order {order_id} not found"))),
    }
}
