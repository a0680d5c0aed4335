//! Payments: one per order, started at the provider for the order's amount, and the provider
//! events that decided something, each stored once under its id.

use super::status::PaymentStatus;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgExecutor};

/// `sqlx::query_as!(Payment, "select <the columns> from payments " + <tail>, args…)`: the one
/// place the columns of [`Payment`] are listed.
macro_rules! payment_rows {
    ($tail:tt $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            Payment,
            r#"select order_id, provider, provider_payment_id, amount_minor, currency,
                    status as "status: PaymentStatus", created_at
             from payments "# + $tail
            $(, $arg)*
        )
    };
}

/// One row of `payments`.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct Payment {
    pub order_id: i64,
    pub provider: String,
    pub provider_payment_id: String,
    pub amount_minor: i64,
    pub currency: String,
    pub status: PaymentStatus,
    pub created_at: DateTime<Utc>,
}

crate::domain::status::text_enum! {
    /// What a provider event came to (`payment_events.outcome`).
    pub enum Outcome {
        /// It paid the order.
        Paid = "paid",
        /// The order was already paid by this payment (another event of it came first).
        AlreadyPaid = "already_paid",
        /// The order can no longer be paid (released, cancelled, past the payment timeout):
        /// the money is owed back, the unit stays where it is.
        RefundDue = "refund_due",
    }
}

/// The order's payment, if one was started.
pub async fn of_order(
    db: impl PgExecutor<'_>,
    order_id: i64,
) -> Result<Option<Payment>, sqlx::Error> {
    payment_rows!("where order_id = $1", order_id)
        .fetch_optional(db)
        .await
}

/// The payment the provider knows as `provider_payment_id`, locked until the transaction
/// ends: the events of one payment are decided one after the other.
pub async fn by_provider_id_for_update(
    conn: &mut PgConnection,
    provider: &str,
    provider_payment_id: &str,
) -> Result<Option<Payment>, sqlx::Error> {
    payment_rows!(
        "where provider = $1 and provider_payment_id = $2 for update",
        provider,
        provider_payment_id
    )
    .fetch_optional(conn)
    .await
}

/// Records the payment started for an order, unless one is recorded already; either way
/// answers the order's one payment.
pub async fn insert_or_get(
    db: impl PgExecutor<'_> + Copy,
    order_id: i64,
    provider: &str,
    provider_payment_id: &str,
    amount_minor: i64,
    currency: &str,
) -> Result<Payment, sqlx::Error> {
    sqlx::query!(
        "insert into payments (order_id, provider, provider_payment_id, amount_minor, currency)
         values ($1, $2, $3, $4, $5)
         on conflict (order_id) do nothing",
        order_id,
        provider,
        provider_payment_id,
        amount_minor,
        currency
    )
    .execute(db)
    .await?;
    of_order(db, order_id)
        .await?
        .ok_or(sqlx::Error::RowNotFound)
}

/// Marks the order's payment succeeded.
pub async fn mark_succeeded(
    conn: &mut PgConnection,
    order_id: i64,
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update payments set status = 'succeeded', updated_at = $2 where order_id = $1",
        order_id,
        now
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// The outcome already recorded for event `event_id`, if it was processed.
pub async fn event_outcome(
    db: impl PgExecutor<'_>,
    event_id: &str,
) -> Result<Option<(Outcome, i64)>, sqlx::Error> {
    let row = sqlx::query!(
        r#"select outcome as "outcome: Outcome", order_id from payment_events
         where event_id = $1"#,
        event_id
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map(|r| (r.outcome, r.order_id)))
}

/// One provider event that decided something.
#[derive(Clone, Debug)]
pub struct EventRow<'a> {
    pub event_id: &'a str,
    pub provider: &'a str,
    pub kind: &'a str,
    pub provider_payment_id: &'a str,
    pub order_id: i64,
    pub amount_minor: i64,
    pub currency: &'a str,
    pub outcome: Outcome,
}

/// Records `event`; false when its id was recorded already (a concurrent delivery of the
/// same event came first).
pub async fn insert_event(conn: &mut PgConnection, e: &EventRow<'_>) -> Result<bool, sqlx::Error> {
    let inserted = sqlx::query!(
        "insert into payment_events (event_id, provider, kind, provider_payment_id, order_id,
                                     amount_minor, currency, outcome)
         values ($1, $2, $3, $4, $5, $6, $7, $8)
         on conflict (event_id) do nothing",
        e.event_id,
        e.provider,
        e.kind,
        e.provider_payment_id,
        e.order_id,
        e.amount_minor,
        e.currency,
        e.outcome.as_str()
    )
    .execute(conn)
    .await?
    .rows_affected();
    Ok(inserted == 1)
}

/// Payments owed back to their payers, oldest first, at most `limit`.
pub async fn refunds_due(
    db: impl PgExecutor<'_>,
    limit: i64,
) -> Result<Vec<(String, i64, i64, String)>, sqlx::Error> {
    let rows = sqlx::query!(
        "select event_id, order_id, amount_minor, currency from payment_events
         where outcome = 'refund_due' and refunded_at is null
         order by received_at limit $1",
        limit
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.event_id, r.order_id, r.amount_minor, r.currency))
        .collect())
}

/// The payment the provider knows as `provider_payment_id`.
pub async fn by_provider_id(
    db: impl PgExecutor<'_>,
    provider: &str,
    provider_payment_id: &str,
) -> Result<Option<Payment>, sqlx::Error> {
    payment_rows!(
        "where provider = $1 and provider_payment_id = $2",
        provider,
        provider_payment_id
    )
    .fetch_optional(db)
    .await
}
