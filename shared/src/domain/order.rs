//! Orders: statuses, the row type, and every statement that reads or writes one.

use super::purchase::Attempt;
use super::status::{FailureReason, OrderStatus};
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

/// `sqlx::query_as!(Order, <head> + <the column list> + <tail>, args…)`: the one place the
/// columns of [`Order`] are listed (the sale's bucket count with them), for every statement
/// that answers rows.
macro_rules! order_rows {
    ($head:tt, $tail:tt $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            Order,
            $head + r#"id, request_id, activity_id, user_id, quantity,
                status as "status: OrderStatus", failure_reason as "failure_reason: FailureReason",
                created_at, updated_at, paid_at, cancelled_at, cancel_id, unit_price_minor, currency,
                (select buckets from activities a where a.id = orders.activity_id) as "buckets!""#
                + $tail
            $(, $arg)*
        )
    };
}

/// One order row, as its owner sees it after paying.
#[derive(Clone, Debug, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Order {
    pub id: i64,
    pub request_id: Uuid,
    pub activity_id: i64,
    pub user_id: String,
    pub quantity: i64,
    pub status: OrderStatus,
    pub failure_reason: Option<FailureReason>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub paid_at: Option<DateTime<Utc>>,
    pub cancelled_at: Option<DateTime<Utc>>,
    /// The cancel attempt that committed the cancellation.
    pub cancel_id: Option<Uuid>,
    /// The price per unit the order was bought at, in the currency's minor units (none on a
    /// `failed` row).
    pub unit_price_minor: Option<i64>,
    pub currency: Option<String>,
    /// The sale's bucket count (fixed once it has an order): with the user, it names the
    /// bucket that holds the order's quota and ledger entries.
    #[serde(skip)]
    pub buckets: i64,
}

impl Order {
    /// The sale's bucket count, as the key layout takes it.
    pub fn bucket_count(&self) -> u32 {
        u32::try_from(self.buckets).unwrap_or(1).max(1)
    }
}

pub async fn get(db: impl PgExecutor<'_>, id: i64) -> Result<Option<Order>, sqlx::Error> {
    order_rows!("select ", " from orders where id = $1", id)
        .fetch_optional(db)
        .await
}

pub async fn by_request(
    db: impl PgExecutor<'_>,
    request_id: Uuid,
) -> Result<Option<Order>, sqlx::Error> {
    order_rows!("select ", " from orders where request_id = $1", request_id)
        .fetch_optional(db)
        .await
}

/// The user's most relevant row for an activity: an active order if there is one, else the
/// newest cancelled or failed one.
pub async fn latest_for_user(
    db: impl PgExecutor<'_>,
    activity_id: i64,
    user_id: &str,
) -> Result<Option<Order>, sqlx::Error> {
    order_rows!(
        "select ",
        " from orders where activity_id = $1 and user_id = $2
         order by order_is_live(status) desc, created_at desc, id desc limit 1",
        activity_id,
        user_id
    )
    .fetch_optional(db)
    .await
}

/// Whether the activity has any order row (of any status).
pub async fn exists_for(db: impl PgExecutor<'_>, activity_id: i64) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar!(
        r#"select exists(select 1 from orders where activity_id = $1) as "exists!""#,
        activity_id
    )
    .fetch_one(db)
    .await
}

/// Confirmed + paid quantity of an activity (what the database has sold). Reconcile calls it
/// inside the transaction that holds the activity row lock, so it takes any executor.
pub async fn sold_quantity(db: impl PgExecutor<'_>, activity_id: i64) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar!(
        r#"select coalesce(sum(quantity), 0)::bigint as "sold!" from orders
         where activity_id = $1 and order_is_live(status)"#,
        activity_id
    )
    .fetch_one(db)
    .await
}

/// The consumer's order insert for one message's attempt: a `confirmed` row at the sale's
/// price (fixed since before the sale started), which is also the claim of the request (`orders_request_id_key`) and the one-live-order-per-user check
/// (`orders_one_per_user`); both refuse it as unique violations. Returns the order id.
pub async fn insert_confirmed(conn: &mut PgConnection, a: &Attempt) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar!(
        "insert into orders (request_id, activity_id, user_id, quantity, status,
                             unit_price_minor, currency)
         select $1, a.id, $3, $4, 'confirmed', a.price_minor, a.currency
         from activities a where a.id = $2
         returning id",
        a.request_id,
        a.activity_id,
        a.user_id,
        a.quantity
    )
    .fetch_one(conn)
    .await
}

/// The batch path's one statement (`confirm_orders`, migrations/0024): one `confirmed` row per
/// (request id, user, quantity) of sale `activity_id`, skipping request ids that already have a
/// row (claimed or decided: the per-message path applies those), and the inserted rows' units
/// taken from the sale's stock under load epoch `epoch` as [`crate::domain::activity::take_stock`]
/// takes them, in the statement's own transaction: one round trip, and no client turn while the
/// sale's row is locked. Returns the request ids it inserted.
///
/// Any error rolled the whole group back: [`is_short_stock`] (the sale cannot cover the units,
/// or its epoch moved), `orders_one_per_user`, or anything unexpected.
///
/// Unchecked at compile time (`sqlx::query_scalar`, not the macro): the consumer's batch path
/// tests run it, as the consumer's own role.
pub async fn confirm_batch(
    db: impl PgExecutor<'_>,
    activity_id: i64,
    epoch: Option<i64>,
    request_ids: &[Uuid],
    user_ids: &[String],
    quantities: &[i64],
) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar("select confirm_orders($1, $2, $3, $4, $5)")
        .bind(activity_id)
        .bind(epoch)
        .bind(request_ids)
        .bind(user_ids)
        .bind(quantities)
        .fetch_all(db)
        .await
}

/// [`confirm_batch`] refused the group because its sale cannot take the units (too little
/// stock, or a load epoch other than the messages').
pub fn is_short_stock(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.code().as_deref() == Some(SHORT_STOCK))
}

/// The SQLSTATE `confirm_orders` raises when the sale cannot take the group's units.
const SHORT_STOCK: &str = "SK002";

/// Records `m` as `failed` with `why`, unless a row with its request id exists. Returns
/// whether this call inserted it: the claim of [`crate::protocol::giveback`].
pub async fn insert_failed(
    db: impl PgExecutor<'_>,
    m: &Attempt,
    why: FailureReason,
) -> Result<bool, sqlx::Error> {
    let inserted = sqlx::query!(
        "insert into orders (request_id, activity_id, user_id, quantity, status, failure_reason)
         values ($1, $2, $3, $4, 'failed', $5)
         on conflict (request_id) do nothing",
        m.request_id,
        m.activity_id,
        m.user_id,
        m.quantity,
        why.as_str()
    )
    .execute(db)
    .await?;
    Ok(inserted.rows_affected() == 1)
}

/// A purchase answered 503 and claimed for it (`failed`, `unavailable`): its row id, user,
/// request id and when the claim was made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unanswered {
    pub id: i64,
    pub user_id: String,
    pub request_id: Uuid,
    pub created_at: DateTime<Utc>,
}

/// Up to `limit` of sale `activity_id`'s purchases answered 503, with a row id above
/// `after_id`, in id order (the index `orders_unanswered`).
pub async fn unanswered_after(
    db: impl PgExecutor<'_>,
    activity_id: i64,
    after_id: i64,
    limit: i64,
) -> Result<Vec<Unanswered>, sqlx::Error> {
    sqlx::query_as!(
        Unanswered,
        "select id, user_id, request_id, created_at from orders
         where activity_id = $1 and status = 'failed' and failure_reason = $2 and id > $3
         order by id limit $4",
        activity_id,
        FailureReason::Unavailable.as_str(),
        after_id,
        limit
    )
    .fetch_all(db)
    .await
}

/// Rows of the given request ids (any status).
pub async fn by_requests(
    db: impl PgExecutor<'_>,
    request_ids: &[Uuid],
) -> Result<Vec<Order>, sqlx::Error> {
    order_rows!(
        "select ",
        " from orders where request_id = any($1)",
        request_ids
    )
    .fetch_all(db)
    .await
}

/// The users holding a live (confirmed or paid) order of an activity, each with the order's
/// request id.
pub async fn live_holders(
    db: impl PgExecutor<'_>,
    activity_id: i64,
) -> Result<Vec<(String, Uuid)>, sqlx::Error> {
    let rows = sqlx::query!(
        "select user_id, request_id from orders
         where activity_id = $1 and order_is_live(status)",
        activity_id
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.user_id, r.request_id))
        .collect())
}

/// Which of `users` hold a live order of the activity, each with the order's request id:
/// reconcile's check of the users it marked as possible orphans, and a restore's read of the
/// users whose field it marked as lost.
pub async fn live_holders_among(
    db: impl PgExecutor<'_>,
    activity_id: i64,
    users: &[String],
) -> Result<Vec<(String, Uuid)>, sqlx::Error> {
    let rows = sqlx::query!(
        "select user_id, request_id from orders
         where activity_id = $1 and user_id = any($2) and order_is_live(status)",
        activity_id,
        users
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.user_id, r.request_id))
        .collect())
}

/// Up to `limit` holders of a live order of the activity whose user id sorts after `after`,
/// in user id order, each with the order's request id: one page of reconcile's walk of the
/// live orders (the buyer index keeps a page's cost to its rows, whatever the sale's size).
pub async fn live_holders_after(
    db: impl PgExecutor<'_>,
    activity_id: i64,
    after: &str,
    limit: i64,
) -> Result<Vec<(String, Uuid)>, sqlx::Error> {
    let rows = sqlx::query!(
        "select user_id, request_id from orders
         where activity_id = $1 and user_id > $2 and order_is_live(status)
         order by user_id limit $3",
        activity_id,
        after,
        limit
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.user_id, r.request_id))
        .collect())
}

/// Marks a `confirmed` order paid by its started payment `provider_payment_id` of `provider`,
/// at `now` (the database function `pay_confirmed_order`, the entry role's one way to pay an
/// order); false when it is not (any more) confirmed or has no such payment under way. Only a
/// provider's verified event calls it (`protocol::pay::settle`).
pub async fn mark_paid(
    conn: &mut PgConnection,
    order_id: i64,
    provider: &str,
    provider_payment_id: &str,
    now: DateTime<Utc>,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar!(
        r#"select pay_confirmed_order($1, $2, $3, $4) as "paid!""#,
        order_id,
        provider,
        provider_payment_id,
        now
    )
    .fetch_one(conn)
    .await
}

/// The order, locked until the transaction ends (a cancel's conditional update waits): the
/// database function `lock_order_for_payment`, which the entry role may call though it may
/// lock no order row itself. The row is read by a statement of its own once the lock is held:
/// a statement's snapshot is taken when it starts, so one that also waited for the lock (a
/// cancel committing meanwhile) would read the row as it was before.
pub async fn get_for_payment(
    conn: &mut PgConnection,
    id: i64,
) -> Result<Option<Order>, sqlx::Error> {
    let locked = sqlx::query_scalar!(r#"select id as "id!" from lock_order_for_payment($1)"#, id)
        .fetch_optional(&mut *conn)
        .await?;
    match locked {
        Some(id) => get(conn, id).await,
        None => Ok(None),
    }
}

/// An unpaid order's place in the payment timeout's walk: its `(created_at, id)`.
pub type UnpaidKey = (DateTime<Utc>, i64);

impl Order {
    /// This order's place in the payment timeout's walk.
    pub fn unpaid_key(&self) -> UnpaidKey {
        (self.created_at, self.id)
    }
}

/// Up to `limit` orders still `confirmed` (unpaid) that were created before `before` and come
/// after `after` in `(created_at, id)` order, in that order: one batch of the payment
/// timeout's walk.
pub async fn unpaid_after(
    db: impl PgExecutor<'_>,
    before: DateTime<Utc>,
    after: UnpaidKey,
    limit: i64,
) -> Result<Vec<Order>, sqlx::Error> {
    order_rows!(
        "select ",
        " from orders where status = 'confirmed' and created_at < $1
         and (created_at, id) > ($2, $3)
         order by created_at, id limit $4",
        before,
        after.0,
        after.1,
        limit
    )
    .fetch_all(db)
    .await
}

/// Where the payment timeout's walk stopped (`None`: it has not started).
pub async fn release_cursor(db: impl PgExecutor<'_>) -> Result<Option<UnpaidKey>, sqlx::Error> {
    let row = sqlx::query!("select created_at, order_id from release_cursor")
        .fetch_optional(db)
        .await?;
    Ok(row.map(|r| (r.created_at, r.order_id)))
}

/// Records where the payment timeout's walk goes on.
pub async fn save_release_cursor(
    db: impl PgExecutor<'_>,
    at: UnpaidKey,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "insert into release_cursor (only_row, created_at, order_id) values (true, $1, $2)
         on conflict (only_row)
         do update set created_at = excluded.created_at, order_id = excluded.order_id",
        at.0,
        at.1
    )
    .execute(db)
    .await?;
    Ok(())
}

/// The cancel ids that committed the cancellation of any of `order_ids`.
pub async fn committed_cancel_ids(
    db: impl PgExecutor<'_>,
    order_ids: &[i64],
) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"select cancel_id as "cancel_id!" from orders
         where id = any($1) and status = 'cancelled' and cancel_id is not null"#,
        order_ids
    )
    .fetch_all(db)
    .await
}

/// What the orders table holds for one sale, counted in one statement (one snapshot): the
/// demo's, the benchmark's and the tests' read-back of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Rows of any status.
    pub rows: i64,
    pub confirmed: i64,
    pub confirmed_units: i64,
    /// Confirmed or paid rows, and their units.
    pub live: i64,
    pub live_units: i64,
    pub failed: i64,
    /// Users holding more than one live order (the one-per-user index makes it 0).
    pub users_with_two_live: i64,
}

pub async fn tally(db: impl PgExecutor<'_>, activity_id: i64) -> Result<Tally, sqlx::Error> {
    sqlx::query_as!(
        Tally,
        r#"select
             count(*) as "rows!",
             count(*) filter (where status = 'confirmed') as "confirmed!",
             coalesce(sum(quantity) filter (where status = 'confirmed'), 0)::bigint
                 as "confirmed_units!",
             count(*) filter (where order_is_live(status)) as "live!",
             coalesce(sum(quantity) filter (where order_is_live(status)), 0)::bigint
                 as "live_units!",
             count(*) filter (where status = 'failed') as "failed!",
             (select count(*) from (select user_id from orders
                where activity_id = $1 and order_is_live(status)
                group by user_id having count(*) > 1) d) as "users_with_two_live!"
           from orders where activity_id = $1"#,
        activity_id
    )
    .fetch_one(db)
    .await
}

/// Every row of a sale (any status), oldest first: the tests' and the chaos checks' view.
pub async fn of_activity(
    db: impl PgExecutor<'_>,
    activity_id: i64,
) -> Result<Vec<Order>, sqlx::Error> {
    order_rows!(
        "select ",
        " from orders where activity_id = $1 order by id",
        activity_id
    )
    .fetch_all(db)
    .await
}
