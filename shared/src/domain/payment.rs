//! Payments: one per order, started at the provider for the order's amount, and the provider
//! events that decided something, each stored once under its id.

use super::status::{PaymentStatus, RefundState};
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
        /// The order can no longer be paid (cancelled while its payment succeeded anyway): the
        /// money is owed back, the unit stays where it is.
        RefundDue = "refund_due",
        /// A refund was made at the provider (`charge.refunded`).
        Refunded = "refunded",
        /// A dispute was opened or changed at the provider (`charge.dispute.*`).
        Disputed = "disputed",
        /// Its order, amount or currency is not the payment's: nothing changed.
        Mismatch = "mismatch",
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

/// Records the payment started for an order, unless one is recorded already, only while the
/// order is `confirmed` (the database function `open_payment`, under the order's row lock: a
/// cancel of the order commits before or after, never between). Answers the order's one
/// payment, or `None` when the order is not confirmed.
pub async fn open(
    db: impl PgExecutor<'_> + Copy,
    order_id: i64,
    provider: &str,
    provider_payment_id: &str,
    amount_minor: i64,
    currency: &str,
) -> Result<Option<Payment>, sqlx::Error> {
    let opened = sqlx::query_scalar!(
        r#"select open_payment($1, $2, $3, $4, $5) as "opened!""#,
        order_id,
        provider,
        provider_payment_id,
        amount_minor,
        currency
    )
    .fetch_one(db)
    .await?;
    if !opened {
        return Ok(None);
    }
    of_order(db, order_id).await
}

/// Records the order's payment cancelled at the provider (while it is still open); answers
/// whether it was open.
pub async fn mark_cancelled(
    db: impl PgExecutor<'_>,
    order_id: i64,
    now: DateTime<Utc>,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query!(
        "update payments set status = 'cancelled', updated_at = $2
         where order_id = $1 and status = 'requires_payment'",
        order_id,
        now
    )
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
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

/// Marks the order's payment owed back (unless a refund of it is under way or made already).
pub async fn mark_refund_due(
    conn: &mut PgConnection,
    order_id: i64,
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update payments set refund_state = 'due', updated_at = $2
         where order_id = $1 and refund_state is null",
        order_id,
        now
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// A payment owed back, claimed for one refund attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefundClaim {
    pub order_id: i64,
    pub provider: String,
    pub provider_payment_id: String,
    pub amount_minor: i64,
    pub currency: String,
    /// Attempts so far, this one included.
    pub attempts: i32,
}

impl RefundClaim {
    /// The refund's request: the whole payment, under an idempotency key of this attempt's
    /// (a retry after a crash or a lost answer within the attempt gets the same refund; a
    /// later attempt is a new request, and the provider refuses a second whole refund).
    pub fn request(&self) -> crate::infra::payments::RefundRequest {
        crate::infra::payments::RefundRequest {
            order_id: self.order_id,
            provider_payment_id: self.provider_payment_id.clone(),
            amount_minor: self.amount_minor,
            attempt: self.attempts,
        }
    }
}

/// Claims up to `limit` payments of `provider` owed back, oldest first: those `due`, and those whose last
/// attempt's claim is older than `lease` (its run crashed, or the provider refused). Each is
/// `refunding` with one more attempt counted and its lease starting `now`; a concurrent claimer
/// skips them (`skip locked`, and the lease once committed).
pub async fn claim_refunds(
    db: impl PgExecutor<'_>,
    provider: &str,
    now: DateTime<Utc>,
    lease: chrono::Duration,
    limit: i64,
) -> Result<Vec<RefundClaim>, sqlx::Error> {
    let stale = now - lease;
    sqlx::query_as!(
        RefundClaim,
        r#"update payments set refund_state = 'refunding', refund_attempts = refund_attempts + 1,
                               updated_at = $1
           where order_id in (
               select order_id from payments
                where (refund_state = 'due' or (refund_state = 'refunding' and updated_at < $2))
                  and provider = $4
                order by updated_at limit $3
                for update skip locked)
           returning order_id, provider, provider_payment_id, amount_minor, currency,
                     refund_attempts as attempts"#,
        now,
        stale,
        limit,
        provider
    )
    .fetch_all(db)
    .await
}

/// Records the refund of the order's payment made at the provider as `refund_id` (`None`: the
/// provider said it was refunded before, without the id): `refunded`, and the events that owed
/// it marked refunded.
pub async fn mark_refunded(
    conn: &mut PgConnection,
    order_id: i64,
    refund_id: Option<&str>,
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    let pid = sqlx::query_scalar!(
        "update payments set refund_state = 'refunded', refund_id = coalesce($2, refund_id),
                             updated_at = $3
         where order_id = $1 returning provider_payment_id",
        order_id,
        refund_id,
        now
    )
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(pid) = pid {
        sqlx::query!(
            "update payment_events set refunded_at = $2
             where provider_payment_id = $1 and outcome = 'refund_due' and refunded_at is null",
            pid,
            now
        )
        .execute(conn)
        .await?;
    }
    Ok(())
}

/// A refund attempt the provider refused or did not answer: its error kept for the operator;
/// after `max_attempts` the payment is `failed` and no run tries it again.
pub async fn refund_refused(
    db: impl PgExecutor<'_>,
    order_id: i64,
    error: &str,
    max_attempts: i32,
) -> Result<bool, sqlx::Error> {
    let failed = sqlx::query_scalar!(
        r#"update payments
              set refund_error = $2,
                  refund_state = case when refund_attempts >= $3 then 'failed'
                                      else refund_state end
            where order_id = $1 and refund_state = 'refunding'
        returning refund_state = 'failed' as "failed!""#,
        order_id,
        error,
        max_attempts
    )
    .fetch_optional(db)
    .await?;
    Ok(failed.unwrap_or(false))
}

/// How many payments are owed back and not refunded yet, and how many refunds failed for good,
/// each counted up to `cap`.
pub async fn refund_counts(
    db: impl PgExecutor<'_> + Copy,
    cap: i64,
) -> Result<(i64, i64), sqlx::Error> {
    let open = sqlx::query_scalar!(
        r#"select count(*) as "n!" from (select 1 from payments
            where refund_state in ('due', 'refunding') limit $1) o"#,
        cap
    )
    .fetch_one(db)
    .await?;
    let failed = sqlx::query_scalar!(
        r#"select count(*) as "n!" from (select 1 from payments
            where refund_state = 'failed' limit $1) f"#,
        cap
    )
    .fetch_one(db)
    .await?;
    Ok((open, failed))
}

/// Flags the order's payment disputed at the provider (the first time).
pub async fn mark_disputed(
    conn: &mut PgConnection,
    order_id: i64,
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update payments set disputed_at = coalesce(disputed_at, $2), updated_at = $2
         where order_id = $1",
        order_id,
        now
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// What the operator page counts of payments, each up to the cap it was counted to.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PaymentCounts {
    /// Owed back, not claimed yet (`due`).
    pub refunds_due: i64,
    /// Claimed by a reconcile run, or its attempt refused and waiting for the next
    /// (`refunding`).
    pub refunds_refunding: i64,
    /// Refused too many times, left to the operator (`failed`).
    pub refunds_failed: i64,
    /// Recorded `refunded` since the time asked (a later dispute's event moves a payment's
    /// time too).
    pub refunded_recently: i64,
    /// Payments with a dispute opened at the provider (`disputed_at`; a closed dispute is not
    /// recorded apart, so this counts every dispute there was).
    pub disputed: i64,
    /// The oldest last change of a refund owed (`due` or `refunding`): how long the longest
    /// has waited.
    pub oldest_owed_at: Option<DateTime<Utc>>,
}

/// Counts for the operator page, each up to `cap` and each from a partial index of `payments`
/// (migrations 0021 and 0023), so none reads the payments that need nothing; refunds made
/// counted from `refunded_since`. The `due` count walks the open refunds' index in its order
/// (skipping only the few `refunding`): without the order, a backlog of `due` makes a scan of
/// the table look cheaper to the planner.
pub async fn operator_counts(
    db: impl PgExecutor<'_>,
    refunded_since: DateTime<Utc>,
    cap: i64,
) -> Result<PaymentCounts, sqlx::Error> {
    sqlx::query_as!(
        PaymentCounts,
        r#"select
             (select count(*) from (select from payments where refund_state = 'due'
                                     order by updated_at limit $1) d) as "refunds_due!",
             (select count(*) from (select from payments where refund_state = 'refunding'
                                     limit $1) r) as "refunds_refunding!",
             (select count(*) from (select from payments where refund_state = 'failed'
                                     limit $1) f) as "refunds_failed!",
             (select count(*) from (select from payments where refund_state = 'refunded'
                                       and updated_at >= $2 limit $1) m) as "refunded_recently!",
             (select count(*) from (select from payments where disputed_at is not null
                                     limit $1) s) as "disputed!",
             (select min(updated_at) from payments
               where refund_state in ('due', 'refunding')) as oldest_owed_at"#,
        cap,
        refunded_since
    )
    .fetch_one(db)
    .await
}

/// A payment the operator has to look at: its refund failed, it is disputed, or its refund has
/// been owed for long.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlaggedPayment {
    pub order_id: i64,
    /// The sale the order is of.
    pub activity_id: i64,
    /// The provider's id of the payment (Stripe's PaymentIntent, `pi_...`).
    pub provider_payment_id: String,
    pub amount_minor: i64,
    pub currency: String,
    /// `null`: nothing is owed back (a disputed payment that was not refunded).
    pub refund_state: Option<RefundState>,
    /// Refund attempts made.
    pub refund_attempts: i32,
    /// The provider's answer to the last refused attempt.
    pub refund_error: Option<String>,
    /// The provider's refund id, once refunded.
    pub refund_id: Option<String>,
    /// When the provider first told of a dispute.
    pub disputed_at: Option<DateTime<Utc>>,
    /// The payment's last change: a refund owed, claimed or recorded, a dispute's event.
    pub updated_at: DateTime<Utc>,
}

/// The payments the operator has to look at, newest change first, at most `limit`: refunds
/// `failed`, disputed payments, and refunds owed (`due` or `refunding`) not changed since
/// `owed_before` (a refund owed for a moment is reconcile's next run's, not a human's). Each
/// kind is read newest first from its own partial index, at most `limit` of it.
pub async fn flagged(
    db: impl PgExecutor<'_>,
    owed_before: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<FlaggedPayment>, sqlx::Error> {
    sqlx::query_as!(
        FlaggedPayment,
        r#"select p.order_id, o.activity_id, p.provider_payment_id, p.amount_minor, p.currency,
                  p.refund_state as "refund_state: RefundState", p.refund_attempts,
                  p.refund_error, p.refund_id, p.disputed_at, p.updated_at
             from ((select order_id from payments where refund_state = 'failed'
                     order by updated_at desc limit $1)
                   union
                   (select order_id from payments where disputed_at is not null
                     order by updated_at desc limit $1)
                   union
                   (select order_id from payments
                     where refund_state in ('due', 'refunding') and updated_at < $2
                     order by updated_at desc limit $1)) flagged
             join payments p on p.order_id = flagged.order_id
             join orders o on o.id = p.order_id
            order by p.updated_at desc, p.order_id desc
            limit $1"#,
        limit,
        owed_before
    )
    .fetch_all(db)
    .await
}
