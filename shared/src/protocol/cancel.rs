//! A confirmed order cancelled exactly once, by its owner or by reconcile's payment timeout:
//! the attempt announced in the ledger under its own cancel id (`lua/cancel_begin.lua`),
//! committed in one transaction that records that id on the row, then finished in Redis for
//! that id only (`lua/give_back.lua`). The announcement keeps reconcile's stock fix away while
//! the database is ahead of Redis; the cancel id makes a second or late canceller harmless.
//! An order whose buyer's field Redis lost gets it back first ([`restore`]), so its cancel
//! completes instead of answering `busy` until reconcile puts the field back.
//! docs/invariants.md, "Cancel", has the steps and what a crash at each leaves.

use crate::domain::activity::{self, Phase};
use crate::domain::order::{self, Order};
use crate::domain::status::OrderStatus;
use crate::infra::pause;
use crate::protocol::restore::{self, RestoreError, Restorer};
use crate::store::cancel::{self, CancelAttempt, CancelBegin};
use crate::store::conn::{Redis, StoreError};
use crate::store::keys::Home;
use crate::store::ledger;
use crate::store::values::EntryKind;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

/// Why a cancel could not finish: the database or Redis was out of reach (or failed). The
/// attempt may be retried: its `c` entry, if written, is finished or aborted by reconcile.
#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<RestoreError> for CancelError {
    fn from(e: RestoreError) -> Self {
        match e {
            RestoreError::Db(e) => CancelError::Db(e),
            RestoreError::Store(e) => CancelError::Store(e),
        }
    }
}

/// What [`cancel_order`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CancelOutcome {
    /// This call cancelled the order; `quantity` units went back to the DB (and Redis, when the
    /// activity is still loaded there).
    Cancelled { quantity: i64 },
    /// The order was already cancelled: nothing changed (a double cancel is a no-op).
    AlreadyCancelled,
    /// The order is in a state that cannot be cancelled (`paid`, `failed`); carries the status.
    NotCancellable(OrderStatus),
    /// Another ledger entry of the user is in flight; retry shortly (HTTP 409 `busy`).
    Busy,
}

/// Who cancels, which sets what the attempt does when another entry of the buyer is in
/// flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Canceller {
    /// The owner's request: another attempt at the same order (a double click, the payment
    /// timeout racing the owner) is a moment from its commit, so the attempt waits up to
    /// [`OTHER_ATTEMPT_WAIT`] for it and answers `AlreadyCancelled`.
    Owner,
    /// The owner's request whose payment it just closed at the provider: the route's time went
    /// there, so it never waits either (another attempt in flight is `Busy`, and the owner
    /// retries).
    OwnerAfterProvider,
    /// Reconcile's payment timeout: never waits. An order whose buyer has another entry in
    /// flight is `Busy` at once and comes back on the release's next lap; a wait here would
    /// spend the run's budget on attempts that crashed (their entries wait for reconcile).
    PaymentTimeout,
}

/// Cancels a `confirmed` order exactly once, as its owner: [`cancel_as`] with
/// [`Canceller::Owner`].
pub async fn cancel_order(
    pool: &PgPool,
    redis: &Redis,
    order: &Order,
    now: DateTime<Utc>,
) -> Result<CancelOutcome, CancelError> {
    cancel_as(pool, redis, order, now, Canceller::Owner).await
}

/// Cancels a `confirmed` order exactly once: stock back to the DB and to Redis, the user's
/// quota freed so they may buy again. The caller has checked who may cancel (owner, or
/// reconcile's payment timeout: `by`); `order` is a recent read of the row, the database
/// decides.
///
/// Steps (see the module docs for why in this order), under a fresh cancel id:
/// 1. `cancel::begin` announces the attempt in the ledger (`Busy` ->
///    [`CancelOutcome::Busy`]; not loaded in Redis -> only the database changes; the user's
///    field lost while the row is still confirmed -> restored first, then announced);
/// 2. one DB transaction: the order `confirmed` -> `cancelled` with this cancel id, its
///    quantity back to `activities.remaining_stock`;
/// 3. `ledger::cancel_finish` for this cancel id gives the units and the quota back in Redis.
///
/// If the database says the order was no longer `confirmed`, this attempt drops its own entry
/// and changes nothing else: already cancelled -> `AlreadyCancelled`; paid / failed ->
/// `NotCancellable`.
#[tracing::instrument(skip_all, fields(order_id = order.id, activity_id = order.activity_id, ?by))]
pub async fn cancel_as(
    pool: &PgPool,
    redis: &Redis,
    order: &Order,
    now: DateTime<Utc>,
    by: Canceller,
) -> Result<CancelOutcome, CancelError> {
    if let Some(outcome) = already_final(redis, order).await? {
        return Ok(outcome);
    }
    let attempt = CancelAttempt {
        activity_id: order.activity_id,
        buckets: order.home().count,
        user_id: order.user_id.as_str(),
        order_id: order.id,
        request_id: order.request_id,
        quantity: order.quantity,
        cancel_id: Uuid::now_v7(),
    };
    let epoch = match announce(pool, redis, order, &attempt, now, by).await? {
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
                let finished = ledger::cancel_finish(
                    redis,
                    attempt.home(),
                    attempt.user_id,
                    attempt.cancel_id,
                );
                if let Err(e) = finished.await {
                    tracing::warn!(error = %e, "cancel committed; redis half left to reconcile");
                }
            }
            tracing::info!(quantity, outcome = "cancelled", "order cancelled");
            Ok(CancelOutcome::Cancelled { quantity })
        }
        Committed::NotConfirmed => decided_first(pool, redis, &attempt, epoch).await,
        Committed::PaymentOpen => {
            // A payment opened since it was closed (its owner pressed Pay meanwhile): nothing
            // changed; the attempt's entry goes, and the canceller closes the payment again.
            if epoch.is_some() {
                let id = attempt.cancel_id.to_string();
                ledger::settle(redis, attempt.home(), attempt.user_id, &id).await?;
            }
            Ok(CancelOutcome::Busy)
        }
        Committed::EpochMoved => {
            // Redis lost the sale (and this attempt's entry) and reloaded it meanwhile: the
            // reloaded stock was read without this cancel. Nothing changed; retry.
            Ok(CancelOutcome::Busy)
        }
    }
}

/// The answer for an order already in a final state (final states never change again, so a
/// stale read of one is still the truth); `None` for a confirmed order, which may be cancelled.
async fn already_final(redis: &Redis, order: &Order) -> Result<Option<CancelOutcome>, CancelError> {
    match order.status {
        OrderStatus::Confirmed => Ok(None),
        OrderStatus::Cancelled => {
            // Finishes the committed attempt's Redis half if a crash left it (guarded by its id).
            if let Some(cancel_id) = order.cancel_id {
                ledger::cancel_finish(redis, order.home(), &order.user_id, cancel_id).await?;
            }
            Ok(Some(CancelOutcome::AlreadyCancelled))
        }
        status => Ok(Some(CancelOutcome::NotCancellable(status))),
    }
}

/// Announce: the attempt in the ledger. `Ok(epoch)` to go on and commit (the load
/// epoch the commit must still find, `None` for a sale only the database holds); `Err` with
/// the answer when this attempt stops here.
async fn announce(
    pool: &PgPool,
    redis: &Redis,
    order: &Order,
    attempt: &CancelAttempt<'_>,
    now: DateTime<Utc>,
    by: Canceller,
) -> Result<Result<Option<i64>, CancelOutcome>, CancelError> {
    let activity_id = attempt.activity_id;
    let now_ms = now.timestamp_millis();
    pause::point("cancel.before_begin", activity_id).await;
    let mut announced = cancel::begin(redis, attempt, now_ms).await?;
    if announced.0 == CancelBegin::NotHeld && regain_field(pool, redis, attempt, now_ms).await? {
        announced = cancel::begin(redis, attempt, now_ms).await?;
    }
    let (begin, epoch) = announced;
    pause::point("cancel.after_begin", activity_id).await;
    match begin {
        CancelBegin::Busy => Ok(Err(other_attempt(pool, redis, order, by).await?)),
        CancelBegin::Recorded => Ok(Ok(Some(epoch))),
        CancelBegin::NotHeld => Ok(Err(not_held(pool, order).await?)),
        CancelBegin::NotLoaded => {
            // Only a sale no loader will load again may change in the database alone: a load
            // in progress would write a stock read before this commit, and the unit would be
            // lost to Redis. A running sale missing from Redis is reloaded within a reconcile
            // run; until then the cancel is retried.
            if !activity_is_over(pool, activity_id, now).await? {
                return Ok(Err(CancelOutcome::Busy));
            }
            Ok(Ok(None))
        }
    }
}

/// The user's field does not name the order. An attempt that cancelled and finished the order
/// committed the row before it removed the field, so a row still `confirmed` when read now
/// means Redis lost the field (a failover that dropped the last writes; or it names a purchase
/// the database refused after the loss): the field is restored from the database
/// ([`restore::restore_fields`]) and the attempt announces itself once more. Returns whether
/// to.
async fn regain_field(
    pool: &PgPool,
    redis: &Redis,
    attempt: &CancelAttempt<'_>,
    now_ms: i64,
) -> Result<bool, CancelError> {
    let confirmed = order::get(pool, attempt.order_id)
        .await?
        .is_some_and(|o| o.status == OrderStatus::Confirmed);
    if !confirmed {
        return Ok(false);
    }
    let holder = [(attempt.user_id.to_string(), attempt.request_id)];
    let bucket = attempt.home();
    restore::restore_fields(pool, redis, bucket, &holder, Restorer::Cancel, now_ms).await?;
    Ok(true)
}

/// Redis holds nothing for the order: the row, read again, says why. A cancelled or otherwise
/// final order answers as a repeated cancel would. A row still `confirmed` means its lost field
/// could not be restored yet (another entry of the user is in flight, or another canceller's
/// restore took it over): the attempt changes nothing and answers `Busy`.
async fn not_held(pool: &PgPool, order: &Order) -> Result<CancelOutcome, CancelError> {
    let status = status_of(pool, order.id).await?;
    Ok(match status {
        OrderStatus::Cancelled => CancelOutcome::AlreadyCancelled,
        OrderStatus::Confirmed => {
            tracing::warn!(
                order_id = order.id,
                "a confirmed order whose field in users could not be restored yet"
            );
            CancelOutcome::Busy
        }
        status => CancelOutcome::NotCancellable(status),
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
) -> Result<CancelOutcome, CancelError> {
    let (user, cancel_id) = (attempt.user_id, attempt.cancel_id);
    let row = order::get(pool, attempt.order_id)
        .await?
        .ok_or(sqlx::Error::RowNotFound)?;
    if epoch.is_some() {
        if row.cancel_id == Some(cancel_id) {
            ledger::cancel_finish(redis, attempt.home(), user, cancel_id).await?;
        } else {
            ledger::settle(redis, attempt.home(), user, &cancel_id.to_string()).await?;
        }
    }
    Ok(match row.status {
        OrderStatus::Cancelled => CancelOutcome::AlreadyCancelled,
        // Reconcile aborted this attempt (its announcement went stale): try again.
        OrderStatus::Confirmed => CancelOutcome::Busy,
        status => CancelOutcome::NotCancellable(status),
    })
}

/// The order's status as the row says it now (rows are never deleted).
async fn status_of(pool: &PgPool, order_id: i64) -> Result<OrderStatus, CancelError> {
    let row = order::get(pool, order_id).await?;
    Ok(row.ok_or(sqlx::Error::RowNotFound)?.status)
}

/// Whether the sale has ended: no loader loads it again, so its Redis state is not needed.
async fn activity_is_over(
    pool: &PgPool,
    activity_id: i64,
    now: DateTime<Utc>,
) -> Result<bool, CancelError> {
    let a = activity::get(pool, activity_id).await?;
    Ok(a.is_none_or(|a| a.phase(now) == Phase::Ended))
}

/// Another entry of the user was in flight. When it is another attempt to cancel this very
/// order (a double click, the payment timeout racing the owner), its outcome is a moment away:
/// the owner waits for the row to say cancelled and answers `AlreadyCancelled`; the payment
/// timeout does not wait. Anything else, or an attempt that does not commit in time (it may
/// have crashed; reconcile drops its entry), is `Busy`: never take over another attempt's
/// entry.
async fn other_attempt(
    pool: &PgPool,
    redis: &Redis,
    order: &Order,
    by: Canceller,
) -> Result<CancelOutcome, CancelError> {
    let cancelled = || async {
        Ok::<_, CancelError>(status_of(pool, order.id).await? == OrderStatus::Cancelled)
    };
    // The other attempt may have finished (and its entry gone) since our announcement failed.
    if cancelled().await? {
        return Ok(CancelOutcome::AlreadyCancelled);
    }
    if by != Canceller::Owner {
        return Ok(CancelOutcome::Busy);
    }
    let entry = ledger::entry(redis, order.home(), &order.user_id).await?;
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

/// How long an owner's cancel waits for another attempt at the same order to commit.
pub const OTHER_ATTEMPT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// What the cancel's transaction did.
#[derive(Debug, PartialEq, Eq)]
pub enum Committed {
    /// This attempt cancelled the order; the quantity went back to the database.
    Cancelled(i64),
    /// The order was not `confirmed` any more, or reconcile aborted this attempt.
    NotConfirmed,
    /// The sale was loaded into Redis from scratch since the announcement.
    EpochMoved,
    /// The order's payment is open at the provider: it is closed first
    /// (`protocol::pay::cancel_unpaid`).
    PaymentOpen,
}

/// Commit: one transaction, conditional on the order being `confirmed`, on this attempt not
/// being aborted by reconcile, and (when the attempt was announced in Redis) on the sale's load
/// epoch being the one the announcement saw.
pub async fn commit_cancel(
    pool: &PgPool,
    order_id: i64,
    cancel_id: Uuid,
    epoch: Option<i64>,
    now: DateTime<Utc>,
) -> Result<Committed, CancelError> {
    // The database function `cancel_confirmed_order`: the order's update and the units' return
    // in one transaction, the second only while the sale's load epoch is `epoch`; the entry's
    // role may give units back through it alone.
    let row = sqlx::query!(
        r#"select outcome as "outcome!", quantity as "quantity!"
           from cancel_confirmed_order($1, $2, $3, $4)"#,
        order_id,
        cancel_id,
        epoch,
        now
    )
    .fetch_one(pool)
    .await?;
    Ok(match row.outcome.as_str() {
        "cancelled" => Committed::Cancelled(i64::from(row.quantity)),
        "epoch_moved" => Committed::EpochMoved,
        "payment_open" => Committed::PaymentOpen,
        _ => Committed::NotConfirmed,
    })
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
