//! The one arbiter of a reservation's fate: the database.
//!
//! A reservation (stock taken in Redis, user added, ledger entry `r|<requestId>|...`) ends in
//! exactly one of two ways: an order row, or its units given back to Redis. Several actors
//! may want to give them back (the entry after a failed send or a timed-out script, the
//! consumer on a business refusal, reconcile after the grace period), and the consumer may
//! commit at any moment. Each of them decides on its own reading of the state, so nothing
//! they read may be trusted to still hold when they act. What holds is the `request_id`
//! unique key of `orders`:
//!
//! - whoever gives units back first **claims** the request: it inserts the `failed` row
//!   ([`claim`]). Only the winner of that insert touches Redis ([`give_back`]).
//! - the consumer's insert of the order is the same key: after a claim it fails as a
//!   duplicate, so a late commit can never follow a give-back, nor a give-back a commit.
//! - anyone who finds a row already there applies what the row says ([`apply`]): a `failed`
//!   row means "units back" (the claimer may have crashed before doing it), a live one
//!   means "drop the entry". Both Redis steps are guarded by the exact ledger entry, so
//!   however many actors apply them, they happen once.
//!
//! The protocol, with what a crash at each step leaves and who repairs it, is written out in
//! `docs/invariants.md`.

use crate::cache::{CacheError, Redis};
use crate::order::{self, reason, Order, OrderStatus};
use crate::queue::OrderMessage;
use crate::sale::{self, Compensation};
use sqlx::PgPool;

/// Why a give-back could not finish. Either way the request may be retried: every step is
/// idempotent, and a `failed` row already written is applied by whoever reads it next.
#[derive(Debug, thiserror::Error)]
pub enum GiveBackError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Cache(#[from] CacheError),
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

/// Claims `reservation` as failed with `why`, under its request id.
pub async fn claim(
    pool: &PgPool,
    reservation: &OrderMessage,
    why: &str,
) -> Result<Claim, sqlx::Error> {
    match order::insert_failed(pool, reservation, why).await {
        Ok(true) => Ok(Claim::Won),
        Ok(false) => match order::by_request(pool, reservation.request_id).await? {
            Some(row) => Ok(Claim::Decided(row)),
            // Rows are never deleted: a conflict without a row cannot happen.
            None => Err(sqlx::Error::RowNotFound),
        },
        Err(e) if crate::db::is_foreign_key_violation(&e) => Ok(Claim::UnknownActivity),
        Err(e) => Err(e),
    }
}

/// How much a `failed` row with `why` gives back: a user refused because they already hold
/// an order keeps their field in `users`; every other failure removes them.
pub fn compensation_for(why: Option<&str>) -> Compensation {
    if why == Some(reason::ALREADY_PURCHASED) {
        Compensation::StockOnly
    } else {
        Compensation::Full
    }
}

/// Applies what the database decided to the request's ledger entry: a `failed` row gives the
/// units back, any other row drops the entry. Returns the units given back by this call.
pub async fn apply(redis: &Redis, row: &Order) -> Result<Option<i64>, CacheError> {
    if OrderStatus::parse(&row.status) == Some(OrderStatus::Failed) {
        let mode = compensation_for(row.failure_reason.as_deref());
        sale::compensate(redis, row.home(), &row.user_id, row.request_id, mode).await
    } else {
        sale::settle(redis, row.home(), &row.user_id, &row.request_id.to_string()).await?;
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
            GiveBack::Decided(row) if row.status != OrderStatus::Failed.as_str() => Some(row),
            _ => None,
        }
    }
}

/// Gives `reservation` back through the arbiter: claim it in the database as failed with
/// `why`, and only if this call won, give its units back in Redis.
#[tracing::instrument(skip_all, fields(request_id = %reservation.request_id, why))]
pub async fn give_back(
    pool: &PgPool,
    redis: &Redis,
    reservation: &OrderMessage,
    why: &str,
) -> Result<GiveBack, GiveBackError> {
    let r = reservation;
    Ok(match claim(pool, r, why).await? {
        Claim::Won => {
            crate::pause::point("giveback.after_claim", r.activity_id).await;
            let mode = compensation_for(Some(why));
            let units = sale::compensate(redis, r.home(), &r.user_id, r.request_id, mode).await?;
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
            let units = sale::compensate(
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
