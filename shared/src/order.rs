//! Orders: statuses, the row type and the lookups the API and the jobs share.

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
}

#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct Order {
    pub id: i64,
    pub request_id: Uuid,
    pub activity_id: i64,
    pub user_id: String,
    pub quantity: i32,
    pub status: String,
    pub failure_reason: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub paid_at: Option<DateTime<Utc>>,
    pub cancelled_at: Option<DateTime<Utc>>,
}

/// The column list of [`Order`], as a literal so queries stay `&'static str`.
#[macro_export]
macro_rules! order_columns {
    () => {
        "id, request_id, activity_id, user_id, quantity, status, failure_reason, \
         created_at, updated_at, paid_at, cancelled_at"
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
