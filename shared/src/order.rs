//! Orders: statuses, the row type and the lookups the API and the jobs share.

use crate::queue::OrderMessage;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

/// An order's life: `confirmed` (written by the consumer, awaiting payment) -> `paid`, or
/// -> `cancelled` (by its owner or by the payment timeout). `failed` records a request the
/// database refused (sold out, second order), so its redeliveries are recognised.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    Confirmed,
    Paid,
    Cancelled,
    Failed,
}

impl OrderStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Confirmed => "confirmed",
            OrderStatus::Paid => "paid",
            OrderStatus::Cancelled => "cancelled",
            OrderStatus::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "confirmed" => OrderStatus::Confirmed,
            "paid" => OrderStatus::Paid,
            "cancelled" => OrderStatus::Cancelled,
            "failed" => OrderStatus::Failed,
            _ => return None,
        })
    }
}

/// Why the database refused a request (stored in `orders.failure_reason`).
pub mod reason {
    /// DB stock was lower than Redis believed.
    pub const SOLD_OUT: &str = "sold_out";
    /// The user already holds another order for the activity.
    pub const ALREADY_PURCHASED: &str = "already_purchased";
    /// The reservation was given back (by reconcile) before the message was processed.
    pub const RESERVATION_EXPIRED: &str = "reservation_expired";
    /// The activity does not exist in the database.
    pub const UNKNOWN_ACTIVITY: &str = "unknown_activity";
    /// The order message could not be sent (the caller was told 503).
    pub const SEND_FAILED: &str = "send_failed";
    /// The purchase script's answer did not arrive in time (the caller was told 503).
    pub const UNAVAILABLE: &str = "unavailable";
}

/// One order row, as its owner sees it after paying.
#[derive(Clone, Debug, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Order {
    pub id: i64,
    pub request_id: Uuid,
    pub activity_id: i64,
    pub user_id: String,
    pub quantity: i32,
    /// `confirmed`, `paid`, `cancelled` or `failed`.
    pub status: String,
    pub failure_reason: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub paid_at: Option<DateTime<Utc>>,
    pub cancelled_at: Option<DateTime<Utc>>,
    /// The cancel attempt that committed the cancellation.
    pub cancel_id: Option<Uuid>,
}

/// The column list of [`Order`], as a literal so queries stay `&'static str`.
#[macro_export]
macro_rules! order_columns {
    () => {
        "id, request_id, activity_id, user_id, quantity, status, failure_reason, \
         created_at, updated_at, paid_at, cancelled_at, cancel_id"
    };
}

pub async fn get(pool: &PgPool, id: i64) -> Result<Option<Order>, sqlx::Error> {
    sqlx::query_as::<_, Order>(concat!(
        "select ",
        order_columns!(),
        " from orders where id = $1"
    ))
    .bind(id)
    .fetch_optional(pool)
    .await
}

pub async fn by_request(pool: &PgPool, request_id: Uuid) -> Result<Option<Order>, sqlx::Error> {
    sqlx::query_as::<_, Order>(concat!(
        "select ",
        order_columns!(),
        " from orders where request_id = $1"
    ))
    .bind(request_id)
    .fetch_optional(pool)
    .await
}

/// The user's most relevant row for an activity: an active order if there is one, else the
/// newest cancelled or failed one.
pub async fn latest_for_user(
    pool: &PgPool,
    activity_id: i64,
    user_id: &str,
) -> Result<Option<Order>, sqlx::Error> {
    sqlx::query_as::<_, Order>(concat!(
        "select ",
        order_columns!(),
        " from orders where activity_id = $1 and user_id = $2
         order by (status in ('confirmed', 'paid')) desc, created_at desc, id desc limit 1"
    ))
    .bind(activity_id)
    .bind(user_id)
    .fetch_optional(pool)
    .await
}

/// Confirmed + paid quantity of an activity (what the database has sold).
pub async fn sold_quantity(pool: &PgPool, activity_id: i64) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar::<_, i64>(
        "select coalesce(sum(quantity), 0)::bigint from orders
         where activity_id = $1 and status in ('confirmed', 'paid')",
    )
    .bind(activity_id)
    .fetch_one(pool)
    .await
}

/// Records `m` as `failed` with `why`, unless a row with its request id exists. Returns
/// whether this call inserted it: the claim of [`crate::giveback`].
pub async fn insert_failed(
    pool: &PgPool,
    m: &OrderMessage,
    why: &str,
) -> Result<bool, sqlx::Error> {
    let inserted = sqlx::query(
        "insert into orders (request_id, activity_id, user_id, quantity, status, failure_reason)
         values ($1, $2, $3, $4, 'failed', $5)
         on conflict (request_id) do nothing",
    )
    .bind(m.request_id)
    .bind(m.activity_id)
    .bind(&m.user_id)
    .bind(m.quantity)
    .bind(why)
    .execute(pool)
    .await?;
    Ok(inserted.rows_affected() == 1)
}

/// Rows of the given request ids (any status).
pub async fn by_requests(pool: &PgPool, request_ids: &[Uuid]) -> Result<Vec<Order>, sqlx::Error> {
    sqlx::query_as::<_, Order>(concat!(
        "select ",
        order_columns!(),
        " from orders where request_id = any($1)"
    ))
    .bind(request_ids)
    .fetch_all(pool)
    .await
}

/// The users holding a live (confirmed or paid) order of an activity.
pub async fn live_holders(pool: &PgPool, activity_id: i64) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar::<_, String>(
        "select user_id from orders where activity_id = $1 and status in ('confirmed', 'paid')",
    )
    .bind(activity_id)
    .fetch_all(pool)
    .await
}
