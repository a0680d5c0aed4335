//! Activities (sales): the domain type, validation of admin input, and database access.

use crate::error::ApiError;
use chrono::{DateTime, Datelike, Duration as ChronoDuration, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use std::time::Duration;

/// Upper bound on one activity's stock; keeps every sum comfortably inside i64 and Lua numbers.
pub const MAX_TOTAL_STOCK: i64 = 100_000_000;
/// Upper bound on the per-order limit.
pub const MAX_PER_ORDER_LIMIT: i64 = 10_000;

/// One sale as the database stores it.
#[derive(Clone, Debug, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Activity {
    pub id: i64,
    pub title: String,
    pub total_stock: i32,
    pub remaining_stock: i32,
    pub per_order_limit: i32,
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    /// `draft`, `published` or `closed`; only a published sale is sold.
    pub state: String,
    pub config_version: i64,
    pub last_fence_token: i64,
    /// Bumped each time Redis loads the sale from scratch (`seckill_shared::load`).
    pub load_epoch: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Where an activity's window stands at a moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Upcoming,
    Running,
    Ended,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Upcoming => "upcoming",
            Phase::Running => "running",
            Phase::Ended => "ended",
        }
    }
}

impl Activity {
    pub fn phase(&self, now: DateTime<Utc>) -> Phase {
        if now < self.start_at {
            Phase::Upcoming
        } else if now < self.end_at {
            Phase::Running
        } else {
            Phase::Ended
        }
    }

    /// Whether preheat loads it at `now`: published, starting within `lead`, not yet ended.
    pub fn due_for_preheat(&self, now: DateTime<Utc>, lead: Duration) -> bool {
        let horizon = now + ChronoDuration::from_std(lead).unwrap_or(ChronoDuration::hours(1));
        self.state == "published" && self.start_at <= horizon && self.end_at > now
    }

    /// When the activity's Redis keys expire: the sale's end plus the buffer.
    pub fn expire_at(&self, buffer: Duration) -> DateTime<Utc> {
        self.end_at + ChronoDuration::from_std(buffer).unwrap_or(ChronoDuration::hours(2))
    }
}

/// The fields an admin creates an activity with (`POST /admin/activities`).
// The schema's bounds are literals (utoipa takes no constants there); tests/tests/openapi.rs
// checks them against MAX_TOTAL_STOCK and MAX_PER_ORDER_LIMIT.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewActivity {
    /// 1 to 200 characters (after trimming), no control characters.
    #[schema(min_length = 1, max_length = 200)]
    pub title: String,
    #[schema(minimum = 1, maximum = 100_000_000)]
    pub total_stock: i64,
    #[schema(minimum = 1, maximum = 10_000)]
    pub per_order_limit: i64,
    /// Before `endAt`; the window lies between 1970-01-01 and 9999-12-31 (UTC).
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
}

/// A merge update (`PUT /admin/activities/{id}`): any subset of the create fields.
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ActivityPatch {
    #[schema(min_length = 1, max_length = 200)]
    pub title: Option<String>,
    #[schema(minimum = 1, maximum = 100_000_000)]
    pub total_stock: Option<i64>,
    #[schema(minimum = 1, maximum = 10_000)]
    pub per_order_limit: Option<i64>,
    pub start_at: Option<DateTime<Utc>>,
    pub end_at: Option<DateTime<Utc>>,
}

impl ActivityPatch {
    pub fn is_empty(&self) -> bool {
        self.title.is_none()
            && self.total_stock.is_none()
            && self.per_order_limit.is_none()
            && self.start_at.is_none()
            && self.end_at.is_none()
    }
}

impl NewActivity {
    /// Checks every field, answering the first problem as a 400 that names the field.
    pub fn validate(&self) -> Result<(), ApiError> {
        validate_fields(
            &self.title,
            self.total_stock,
            self.per_order_limit,
            self.start_at,
            self.end_at,
        )
    }
}

/// The rules an activity's fields obey, for a create or for the result of a merge update.
pub fn validate_fields(
    title: &str,
    total_stock: i64,
    per_order_limit: i64,
    start_at: DateTime<Utc>,
    end_at: DateTime<Utc>,
) -> Result<(), ApiError> {
    let bad = |m: &str| Err(ApiError::BadRequest(m.to_string()));
    let title_len = title.trim().chars().count();
    if title_len == 0 || title_len > 200 {
        return bad("title must be 1 to 200 characters");
    }
    // PostgreSQL text cannot hold NUL; a title is one line of text anyway.
    if title.chars().any(char::is_control) {
        return bad("title must not contain control characters");
    }
    if !(1..=MAX_TOTAL_STOCK).contains(&total_stock) {
        return bad(&format!(
            "totalStock must be between 1 and {MAX_TOTAL_STOCK}"
        ));
    }
    if !(1..=MAX_PER_ORDER_LIMIT).contains(&per_order_limit) {
        return bad(&format!(
            "perOrderLimit must be between 1 and {MAX_PER_ORDER_LIMIT}"
        ));
    }
    if start_at >= end_at {
        return bad("startAt must be before endAt");
    }
    // Redis holds the window as milliseconds since 1970, and answers write it as RFC 3339,
    // whose years have four digits (an offset can push a valid 9999-12-31 into year 10000).
    if start_at < DateTime::UNIX_EPOCH || end_at.year() > 9999 {
        return bad("startAt and endAt must lie between 1970-01-01 and 9999-12-31 (UTC)");
    }
    Ok(())
}

/// The column list of [`Activity`], as a literal so queries stay `&'static str`.
#[macro_export]
macro_rules! activity_columns {
    () => {
        "id, title, total_stock, remaining_stock, per_order_limit, start_at, end_at, \
         state, config_version, last_fence_token, load_epoch, created_at, updated_at"
    };
}

/// Stores a new, published activity with all its stock remaining.
pub async fn insert(pool: &PgPool, new: &NewActivity) -> Result<Activity, sqlx::Error> {
    sqlx::query_as::<_, Activity>(concat!("insert into activities (title, total_stock, remaining_stock, per_order_limit, start_at, end_at)
         values ($1, $2, $2, $3, $4, $5) returning ", activity_columns!(), ""))
    .bind(new.title.trim())
    .bind(new.total_stock as i32)
    .bind(new.per_order_limit as i32)
    .bind(new.start_at)
    .bind(new.end_at)
    .fetch_one(pool)
    .await
}

pub async fn get(pool: &PgPool, id: i64) -> Result<Option<Activity>, sqlx::Error> {
    sqlx::query_as::<_, Activity>(concat!(
        "select ",
        activity_columns!(),
        " from activities where id = $1"
    ))
    .bind(id)
    .fetch_optional(pool)
    .await
}

/// [`get`] inside a transaction (after its fencing update, say).
pub async fn get_in(
    conn: &mut sqlx::PgConnection,
    id: i64,
) -> Result<Option<Activity>, sqlx::Error> {
    sqlx::query_as::<_, Activity>(concat!(
        "select ",
        activity_columns!(),
        " from activities where id = $1"
    ))
    .bind(id)
    .fetch_optional(conn)
    .await
}

/// A page of activities, newest first.
pub async fn list(pool: &PgPool, limit: i64, offset: i64) -> Result<Vec<Activity>, sqlx::Error> {
    sqlx::query_as::<_, Activity>(concat!(
        "select ",
        activity_columns!(),
        " from activities order by id desc limit $1 offset $2"
    ))
    .bind(limit)
    .bind(offset)
    .fetch_all(pool)
    .await
}

/// Published activities that start within `lead` of `now` and have not ended: what preheat loads.
pub async fn due_for_preheat(
    pool: &PgPool,
    now: DateTime<Utc>,
    lead: Duration,
) -> Result<Vec<Activity>, sqlx::Error> {
    let horizon = now + ChronoDuration::from_std(lead).unwrap_or(ChronoDuration::hours(1));
    sqlx::query_as::<_, Activity>(concat!(
        "select ",
        activity_columns!(),
        " from activities
         where state = 'published' and start_at <= $1 and end_at > $2 order by start_at"
    ))
    .bind(horizon)
    .bind(now)
    .fetch_all(pool)
    .await
}

/// Activities running, or ended within `buffer`: what reconcile checks.
pub async fn due_for_reconcile(
    pool: &PgPool,
    now: DateTime<Utc>,
    lead: Duration,
    buffer: Duration,
) -> Result<Vec<Activity>, sqlx::Error> {
    let horizon = now + ChronoDuration::from_std(lead).unwrap_or(ChronoDuration::hours(1));
    let since = now - ChronoDuration::from_std(buffer).unwrap_or(ChronoDuration::hours(2));
    sqlx::query_as::<_, Activity>(concat!(
        "select ",
        activity_columns!(),
        " from activities
         where state = 'published' and start_at <= $1 and end_at > $2 order by id"
    ))
    .bind(horizon)
    .bind(since)
    .fetch_all(pool)
    .await
}
