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
//! quota). They cannot change in one step, so the cancel is announced first in the Redis ledger
//! (`c|<orderId>|qty|ms`, `lua/cancel_begin.lua`), then committed in one DB transaction, then
//! finished in Redis (`lua/cancel_finish.lua`: stock back, user out of the set, entry dropped).
//!
//! The announcement must come first. Between the DB commit and the Redis finish the database
//! is *ahead* of Redis (it already has the units back). Reconcile only corrects Redis stock from
//! the database while the ledger is quiet; with the `c` entry in the ledger it stays away, so it
//! never adds units to Redis that `cancel_finish` then adds a second time.
//!
//! A crash between the steps leaves a stale `c` entry, which reconcile repairs: if the database
//! says the order is cancelled it runs `cancel_finish` (at most once: the entry guards it);
//! otherwise the transaction never committed and it drops the entry with `settle`.
//! A retried cancel converges too: announcing the same order again is a no-op, and a cancel of
//! an order the database already holds as cancelled runs `cancel_finish` (never `settle`: that
//! would lose a concurrent canceller's units in Redis).

use crate::cache::Redis;
use crate::error::ApiError;
use crate::order::{Order, OrderStatus};
use crate::{order_columns, sale};
use chrono::{DateTime, Utc};
use sale::{CancelBegin, EntryKind};
use sqlx::PgPool;

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
/// Steps (see the module docs for why in this order):
/// 1. `sale::cancel_begin` announces `c|orderId` in the ledger (`Busy` -> [`CancelOutcome::Busy`];
///    not loaded in Redis -> only the database changes);
/// 2. one DB transaction: the order `confirmed` -> `cancelled`, its quantity back to
///    `activities.remaining_stock`;
/// 3. `sale::cancel_finish` gives the units and the quota back in Redis.
///
/// If the database says the order was no longer `confirmed`: already cancelled -> finish the
/// other cancel's Redis half (idempotent) and answer `AlreadyCancelled`; paid / failed -> drop
/// our `c` entry with `sale::settle` and answer `NotCancellable`.
#[tracing::instrument(skip_all, fields(order_id = order.id, activity_id = order.activity_id))]
pub async fn cancel_order(
    pool: &PgPool,
    redis: &Redis,
    order: &Order,
    now: DateTime<Utc>,
) -> Result<CancelOutcome, ApiError> {
    let (activity_id, user, order_id) = (order.activity_id, order.user_id.as_str(), order.id);
    // Final states never change again, so a stale read of one is still the truth.
    match OrderStatus::parse(&order.status) {
        Some(OrderStatus::Confirmed) => {}
        Some(OrderStatus::Cancelled) => {
            // Finishes a cancel that committed but crashed before its Redis half, if any.
            sale::cancel_finish(redis, activity_id, user, order_id).await?;
            return Ok(CancelOutcome::AlreadyCancelled);
        }
        _ => return Ok(CancelOutcome::NotCancellable(order.status.clone())),
    }

    crate::pause::point("cancel.before_begin", activity_id).await;
    let begin = begin_cancel(redis, order, now).await?;
    crate::pause::point("cancel.after_begin", activity_id).await;
    if begin == CancelBegin::Busy {
        return Ok(CancelOutcome::Busy);
    }
    let in_redis = begin == CancelBegin::Recorded;

    // If this fails the `c` entry stays: the commit may or may not have happened, and only
    // reconcile (reading the database later) or a retry of this cancel may decide.
    let quantity = commit_cancel(pool, order_id, now).await?;

    match quantity {
        Some(quantity) => {
            if in_redis {
                // The database is the system of record and holds the cancel now: a Redis hiccup
                // here leaves the `c` entry for reconcile, it does not undo the cancel.
                if let Err(e) = sale::cancel_finish(redis, activity_id, user, order_id).await {
                    tracing::warn!(error = %e, "cancel committed; redis half left to reconcile");
                }
            }
            tracing::info!(quantity, outcome = "cancelled", "order cancelled");
            Ok(CancelOutcome::Cancelled { quantity })
        }
        None => {
            let status = crate::order::get(pool, order_id)
                .await?
                .map(|o| o.status)
                .unwrap_or_default();
            if status == OrderStatus::Cancelled.as_str() {
                if in_redis {
                    sale::cancel_finish(redis, activity_id, user, order_id).await?;
                }
                Ok(CancelOutcome::AlreadyCancelled)
            } else {
                if in_redis {
                    sale::settle(redis, activity_id, user, &order_id.to_string()).await?;
                }
                Ok(CancelOutcome::NotCancellable(status))
            }
        }
    }
}

/// Step 1: the `c` announcement. A leftover reservation entry of this very order (the consumer
/// committed it but had not yet dropped the entry) is settled here rather than answered `Busy`,
/// since the order row proves the database holds it.
async fn begin_cancel(
    redis: &Redis,
    order: &Order,
    now: DateTime<Utc>,
) -> Result<CancelBegin, ApiError> {
    let (activity_id, user) = (order.activity_id, order.user_id.as_str());
    let begin = || {
        sale::cancel_begin(
            redis,
            activity_id,
            user,
            order.id,
            i64::from(order.quantity),
            now.timestamp_millis(),
        )
    };
    let first = begin().await?;
    if first != CancelBegin::Busy {
        return Ok(first);
    }
    match sale::ledger_entry(redis, activity_id, user).await? {
        Some(e) if e.kind == EntryKind::Reservation && e.request_id() == Some(order.request_id) => {
            sale::settle(redis, activity_id, user, &e.id).await?;
            Ok(begin().await?)
        }
        _ => Ok(CancelBegin::Busy),
    }
}

/// Step 2: one transaction. Returns the quantity given back, or `None` when the order was not
/// `confirmed` any more (the condition makes a second cancel, or a cancel racing a pay, a no-op).
async fn commit_cancel(
    pool: &PgPool,
    order_id: i64,
    now: DateTime<Utc>,
) -> Result<Option<i64>, ApiError> {
    let mut tx = pool.begin().await?;
    let row: Option<(i32, i64)> = sqlx::query_as(
        "update orders set status = 'cancelled', cancelled_at = $2, updated_at = $2
         where id = $1 and status = 'confirmed' returning quantity, activity_id",
    )
    .bind(order_id)
    .bind(now)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((quantity, activity_id)) = row else {
        tx.rollback().await?;
        return Ok(None);
    };
    let updated = sqlx::query(
        "update activities set remaining_stock = remaining_stock + $2, updated_at = $3
         where id = $1",
    )
    .bind(activity_id)
    .bind(quantity)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    if updated.rows_affected() != 1 {
        return Err(ApiError::Internal(anyhow::anyhow!(
            "activity {activity_id} of order {order_id} is missing"
        )));
    }
    tx.commit().await?;
    Ok(Some(i64::from(quantity)))
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
    let paid = sqlx::query_as::<_, Order>(concat!(
        "update orders set status = 'paid', paid_at = $3, updated_at = $3
         where id = $1 and user_id = $2 and status = 'confirmed' returning ",
        order_columns!()
    ))
    .bind(order_id)
    .bind(user_id)
    .bind(now)
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
