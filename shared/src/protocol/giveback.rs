//! The one arbiter of a reservation's fate: the database's `request_id` key.
//!
//! Whoever gives a reservation's units back first **claims** it ([`claim`]: a `failed` row);
//! only the winner touches Redis ([`give_back`]). The consumer's order insert is the same key,
//! so a commit never follows a give-back, nor a give-back a commit. Anyone who finds a row
//! already there **applies** it ([`apply`]): a `failed` row's units go back, a live row's
//! entry is dropped, each guarded by the exact ledger entry, so it happens once.
//! docs/invariants.md, "The rule: one arbiter per unit".

use crate::domain::order::{self, Order};
use crate::domain::purchase::Attempt;
use crate::domain::status::{FailureReason, OrderStatus};
use crate::store::conn::{Redis, StoreError};
use crate::store::keys::Home;
use crate::store::ledger::{self, Compensation};
use sqlx::PgPool;

/// Why a give-back could not finish. Either way the request may be retried: every step is
/// idempotent, and a `failed` row already written is applied by whoever reads it next.
#[derive(Debug, thiserror::Error)]
pub enum GiveBackError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What [`claim`] found.
#[derive(Clone, Debug)]
pub enum Claim {
    /// This call inserted the `failed` row: it alone gives the units back.
    Won,
    /// A row was already there: the request's fate was decided by someone else.
    Decided(Order),
    /// The activity is not in the database; no row can be written (nothing was ever sold).
    UnknownActivity,
}

/// Claims `attempt` as failed with `why`, under its request id.
pub async fn claim(
    pool: &PgPool,
    attempt: &Attempt,
    why: FailureReason,
) -> Result<Claim, sqlx::Error> {
    match order::insert_failed(pool, attempt, why).await {
        Ok(true) => Ok(Claim::Won),
        Ok(false) => match order::by_request(pool, attempt.request_id).await? {
            Some(row) => Ok(Claim::Decided(row)),
            // Rows are never deleted: a conflict without a row cannot happen.
            None => Err(sqlx::Error::RowNotFound),
        },
        Err(e) if crate::infra::db::is_foreign_key_violation(&e) => Ok(Claim::UnknownActivity),
        Err(e) => Err(e),
    }
}

/// How much a `failed` row with `why` gives back: a user refused because they already hold
/// an order keeps their field in `users`; every other failure removes them.
pub fn compensation_for(why: Option<FailureReason>) -> Compensation {
    if why == Some(FailureReason::AlreadyPurchased) {
        Compensation::StockOnly
    } else {
        Compensation::Full
    }
}

/// Applies what the database decided to the request's ledger entry: a `failed` row gives the
/// units back, any other row drops the entry. Returns the units given back by this call.
pub async fn apply(redis: &Redis, row: &Order) -> Result<Option<i64>, StoreError> {
    if row.status == OrderStatus::Failed {
        let mode = compensation_for(row.failure_reason);
        ledger::compensate(redis, row.home(), &row.user_id, row.request_id, mode).await
    } else {
        ledger::settle(redis, row.home(), &row.user_id, &row.request_id.to_string()).await?;
        Ok(None)
    }
}

/// What [`give_back`] did.
#[derive(Clone, Debug)]
pub enum GiveBack {
    /// This call claimed the request and gave back the units it found (`None`: the ledger no
    /// longer held the reservation, as when the script never ran).
    GivenBack(Option<i64>),
    /// The database had already decided; its decision was applied. A live row means the
    /// request became an order.
    Decided(Order),
    /// No such activity in the database; the reservation was given back in full.
    UnknownActivity(Option<i64>),
}

impl GiveBack {
    /// The order the request became, if the database holds one (live, paid or cancelled).
    pub fn order(&self) -> Option<&Order> {
        match self {
            GiveBack::Decided(row) if row.status != OrderStatus::Failed => Some(row),
            _ => None,
        }
    }
}

/// Gives `attempt`'s reservation back through the arbiter: claim it in the database as failed
/// with `why`, and only if this call won, give its units back in Redis.
#[tracing::instrument(skip_all, fields(request_id = %attempt.request_id, why))]
pub async fn give_back(
    pool: &PgPool,
    redis: &Redis,
    attempt: &Attempt,
    why: FailureReason,
) -> Result<GiveBack, GiveBackError> {
    let r = attempt;
    Ok(match claim(pool, r, why).await? {
        Claim::Won => {
            crate::infra::pause::point("giveback.after_claim", r.activity_id).await;
            let mode = compensation_for(Some(why));
            let units = ledger::compensate(redis, r.home(), &r.user_id, r.request_id, mode).await?;
            GiveBack::GivenBack(units)
        }
        Claim::Decided(row) => {
            // The decision is the row, whether or not its Redis half lands now: a failed
            // apply is left to whoever reads the row next (reconcile applies decided rows at
            // any age), and must not hide that the request may have become an order.
            if let Err(e) = apply(redis, &row).await {
                tracing::warn!(error = %e, status = %row.status, "decided row not applied in redis yet");
            }
            GiveBack::Decided(row)
        }
        Claim::UnknownActivity => {
            let units = ledger::compensate(
                redis,
                r.home(),
                &r.user_id,
                r.request_id,
                Compensation::Full,
            )
            .await?;
            GiveBack::UnknownActivity(units)
        }
    })
}
