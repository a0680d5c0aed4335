//! Activities (sales): the domain type, validation of admin input, and database access.

use crate::error::ApiError;
use chrono::{DateTime, Datelike, Duration as ChronoDuration, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgExecutor};
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
    /// How many stock buckets the sale's Redis stock is split over (1: one, the layout every
    /// sale had before buckets). Fixed once the sale has started or has an order.
    pub buckets: i32,
    /// `fcfs` (first come, first served) or `draw` (the opening decided by a draw).
    #[schema(example = "fcfs")]
    pub admission: String,
    /// A draw sale's pool window after `startAt`, in milliseconds (0 for `fcfs`).
    pub draw_window_ms: i32,
    /// Purchase attempts one user may make per second (0: no limit).
    pub per_user_rate_per_sec: i32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Upper bound on a draw window: ten minutes.
pub const MAX_DRAW_WINDOW_MS: i64 = 600_000;
/// Upper bound on a per-user purchase rate.
pub const MAX_RATE_PER_SEC: i64 = 1_000;

/// How a sale admits its buyers at the opening.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// First come, first served: purchases are decided in the order Redis runs them.
    Fcfs,
    /// Purchases of the first `drawWindowMs` after the start enter a pool; when the window
    /// closes the winners are drawn at random (`lua/draw.lua`), and what they leave is sold
    /// first come, first served.
    Draw,
}

impl Admission {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "fcfs" => Some(Admission::Fcfs),
            "draw" => Some(Admission::Draw),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Admission::Fcfs => "fcfs",
            Admission::Draw => "draw",
        }
    }
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
    /// Where the window `[start_at, end_at)` stands at `now`, wherever the window was read
    /// (the row, or the sale's meta in Redis).
    pub fn of(start_at: DateTime<Utc>, end_at: DateTime<Utc>, now: DateTime<Utc>) -> Phase {
        if now < start_at {
            Phase::Upcoming
        } else if now < end_at {
            Phase::Running
        } else {
            Phase::Ended
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Upcoming => "upcoming",
            Phase::Running => "running",
            Phase::Ended => "ended",
        }
    }
}

impl Activity {
    /// The bucket count, as the key layout takes it.
    pub fn bucket_count(&self) -> u32 {
        u32::try_from(self.buckets).unwrap_or(1).max(1)
    }

    /// When a draw sale's pool closes, in ms since 1970; 0 for a first-come sale. Redis holds
    /// it as the meta's `drawEndMs`.
    pub fn draw_end_ms(&self) -> i64 {
        Rules::of(self).draw_end_ms(self.start_at)
    }

    pub fn phase(&self, now: DateTime<Utc>) -> Phase {
        Phase::of(self.start_at, self.end_at, now)
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
    /// Stock buckets (default 1): on Redis Cluster, a sale with more than one bucket spreads
    /// its stock, and its buyers, over that many hash tags and so over the shards. Worth it
    /// only for a sale hot enough to saturate one shard (see docs/capacity.md).
    #[schema(minimum = 1, maximum = 16)]
    #[serde(default)]
    pub buckets: Option<i64>,
    /// `fcfs` (default): first come, first served. `draw`: purchases in the first
    /// `drawWindowMs` after `startAt` enter a pool (202 `queued`) and the winners are drawn at
    /// random when it closes; the rest of the stock is sold first come, first served. A draw
    /// sale has one bucket.
    #[schema(example = "draw", pattern = "^(fcfs|draw)$")]
    #[serde(default)]
    pub admission: Option<String>,
    /// The draw window in milliseconds (1 to 600000); required with `draw`, and at most the
    /// sale's length.
    #[schema(minimum = 1, maximum = 600_000)]
    #[serde(default)]
    pub draw_window_ms: Option<i64>,
    /// Purchase attempts one user may make per second (0, the default: no limit); the excess
    /// is answered 429 `rate_limited` with `Retry-After`.
    #[schema(minimum = 0, maximum = 1_000)]
    #[serde(default)]
    pub per_user_rate_per_sec: Option<i64>,
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
    /// Only before the sale starts, and while it has no order.
    #[schema(minimum = 1, maximum = 16)]
    pub buckets: Option<i64>,
    /// Only before the sale starts.
    #[schema(example = "draw", pattern = "^(fcfs|draw)$")]
    pub admission: Option<String>,
    /// Only before the sale starts.
    #[schema(minimum = 1, maximum = 600_000)]
    pub draw_window_ms: Option<i64>,
    #[schema(minimum = 0, maximum = 1_000)]
    pub per_user_rate_per_sec: Option<i64>,
}

impl ActivityPatch {
    pub fn is_empty(&self) -> bool {
        self.buckets.is_none()
            && self.admission.is_none()
            && self.draw_window_ms.is_none()
            && self.per_user_rate_per_sec.is_none()
            && self.title.is_none()
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
        )?;
        validate_buckets(self.buckets.unwrap_or(1))?;
        validate_admission(
            &self.rules(),
            self.start_at,
            self.end_at,
            self.buckets.unwrap_or(1),
        )
    }

    /// The admission rules as given (defaults filled in).
    pub fn rules(&self) -> Rules {
        Rules {
            admission: self.admission.clone().unwrap_or_else(|| "fcfs".into()),
            draw_window_ms: self.draw_window_ms.unwrap_or(0),
            per_user_rate_per_sec: self.per_user_rate_per_sec.unwrap_or(0),
        }
    }
}

/// How a sale admits buyers: its admission, draw window and per-user rate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rules {
    pub admission: String,
    pub draw_window_ms: i64,
    pub per_user_rate_per_sec: i64,
}

impl Rules {
    pub fn of(a: &Activity) -> Self {
        Rules {
            admission: a.admission.clone(),
            draw_window_ms: i64::from(a.draw_window_ms),
            per_user_rate_per_sec: i64::from(a.per_user_rate_per_sec),
        }
    }

    /// When the draw's pool closes for a sale starting at `start_at`, in ms since 1970; 0 for
    /// a first-come sale. Redis holds it as the meta's `drawEndMs`.
    pub fn draw_end_ms(&self, start_at: DateTime<Utc>) -> i64 {
        if self.admission == Admission::Draw.as_str() && self.draw_window_ms > 0 {
            start_at.timestamp_millis() + self.draw_window_ms
        } else {
            0
        }
    }

    /// The rules after a merge update: a switch to `fcfs` drops the window, a switch to `draw`
    /// needs one.
    pub fn merged(current: &Activity, patch: &ActivityPatch) -> Self {
        let admission = patch
            .admission
            .clone()
            .unwrap_or_else(|| current.admission.clone());
        let draw_window_ms = match (&patch.draw_window_ms, admission.as_str()) {
            (Some(ms), _) => *ms,
            (None, "draw") => i64::from(current.draw_window_ms),
            (None, _) => 0,
        };
        Rules {
            admission,
            draw_window_ms,
            per_user_rate_per_sec: patch
                .per_user_rate_per_sec
                .unwrap_or(i64::from(current.per_user_rate_per_sec)),
        }
    }
}

/// The admission rules an activity obeys: `fcfs` or `draw`; a draw's window between 1 ms and
/// [`MAX_DRAW_WINDOW_MS`], within the sale, on a sale with one bucket; a rate between 0 and
/// [`MAX_RATE_PER_SEC`].
pub fn validate_admission(
    rules: &Rules,
    start_at: DateTime<Utc>,
    end_at: DateTime<Utc>,
    buckets: i64,
) -> Result<(), ApiError> {
    let bad = |m: String| Err(ApiError::BadRequest(m));
    let Some(admission) = Admission::parse(&rules.admission) else {
        return bad(format!(
            "admission must be \"fcfs\" or \"draw\", got {:?}",
            rules.admission
        ));
    };
    if !(0..=MAX_RATE_PER_SEC).contains(&rules.per_user_rate_per_sec) {
        return bad(format!(
            "perUserRatePerSec must be between 0 and {MAX_RATE_PER_SEC}"
        ));
    }
    match admission {
        Admission::Fcfs if rules.draw_window_ms != 0 => {
            bad("drawWindowMs applies only to admission \"draw\"".into())
        }
        Admission::Fcfs => Ok(()),
        Admission::Draw if !(1..=MAX_DRAW_WINDOW_MS).contains(&rules.draw_window_ms) => bad(
            format!("admission \"draw\" needs drawWindowMs between 1 and {MAX_DRAW_WINDOW_MS}"),
        ),
        Admission::Draw if (end_at - start_at).num_milliseconds() < rules.draw_window_ms => {
            bad("drawWindowMs must fit between startAt and endAt".into())
        }
        Admission::Draw if buckets != 1 => {
            bad("admission \"draw\" needs buckets = 1: the draw is one script on one shard".into())
        }
        Admission::Draw => Ok(()),
    }
}

/// A bucket count between 1 and [`MAX_BUCKETS`](crate::keys::MAX_BUCKETS).
pub fn validate_buckets(buckets: i64) -> Result<(), ApiError> {
    let max = i64::from(crate::keys::MAX_BUCKETS);
    if (1..=max).contains(&buckets) {
        return Ok(());
    }
    Err(ApiError::BadRequest(format!(
        "buckets must be between 1 and {max}"
    )))
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

/// Stores a new, published activity with all its stock remaining.
pub async fn insert(db: impl PgExecutor<'_>, new: &NewActivity) -> Result<Activity, sqlx::Error> {
    let rules = new.rules();
    sqlx::query_as!(
        Activity,
        "insert into activities (title, total_stock, remaining_stock, per_order_limit, start_at, end_at,
                                 buckets, admission, draw_window_ms, per_user_rate_per_sec)
         values ($1, $2, $2, $3, $4, $5, $6, $7, $8, $9)
         returning id, title, total_stock, remaining_stock, per_order_limit, start_at, end_at,
                   state, config_version, last_fence_token, load_epoch, buckets, admission, draw_window_ms, per_user_rate_per_sec, created_at, updated_at",
        new.title.trim(),
        new.total_stock as i32,
        new.per_order_limit as i32,
        new.start_at,
        new.end_at,
        new.buckets.unwrap_or(1) as i32,
        rules.admission,
        rules.draw_window_ms as i32,
        rules.per_user_rate_per_sec as i32
    )
    .fetch_one(db)
    .await
}

/// The row, from the pool or inside a transaction (after its fencing update, say).
pub async fn get(db: impl PgExecutor<'_>, id: i64) -> Result<Option<Activity>, sqlx::Error> {
    sqlx::query_as!(
        Activity,
        "select id, title, total_stock, remaining_stock, per_order_limit, start_at, end_at,
                state, config_version, last_fence_token, load_epoch, buckets, admission, draw_window_ms, per_user_rate_per_sec, created_at, updated_at
         from activities where id = $1",
        id
    )
    .fetch_optional(db)
    .await
}

/// A page of activities, newest first.
pub async fn list(
    db: impl PgExecutor<'_>,
    limit: i64,
    offset: i64,
) -> Result<Vec<Activity>, sqlx::Error> {
    sqlx::query_as!(
        Activity,
        "select id, title, total_stock, remaining_stock, per_order_limit, start_at, end_at,
                state, config_version, last_fence_token, load_epoch, buckets, admission, draw_window_ms, per_user_rate_per_sec, created_at, updated_at
         from activities order by id desc limit $1 offset $2",
        limit,
        offset
    )
    .fetch_all(db)
    .await
}

/// Published activities that start within `lead` of `now` and have not ended: what preheat loads.
pub async fn due_for_preheat(
    db: impl PgExecutor<'_>,
    now: DateTime<Utc>,
    lead: Duration,
) -> Result<Vec<Activity>, sqlx::Error> {
    let horizon = now + ChronoDuration::from_std(lead).unwrap_or(ChronoDuration::hours(1));
    sqlx::query_as!(
        Activity,
        "select id, title, total_stock, remaining_stock, per_order_limit, start_at, end_at,
                state, config_version, last_fence_token, load_epoch, buckets, admission, draw_window_ms, per_user_rate_per_sec, created_at, updated_at
         from activities
         where state = 'published' and start_at <= $1 and end_at > $2 order by start_at",
        horizon,
        now
    )
    .fetch_all(db)
    .await
}

/// Activities running, or ended within `buffer`: what reconcile checks.
pub async fn due_for_reconcile(
    db: impl PgExecutor<'_>,
    now: DateTime<Utc>,
    lead: Duration,
    buffer: Duration,
) -> Result<Vec<Activity>, sqlx::Error> {
    let horizon = now + ChronoDuration::from_std(lead).unwrap_or(ChronoDuration::hours(1));
    let since = now - ChronoDuration::from_std(buffer).unwrap_or(ChronoDuration::hours(2));
    sqlx::query_as!(
        Activity,
        "select id, title, total_stock, remaining_stock, per_order_limit, start_at, end_at,
                state, config_version, last_fence_token, load_epoch, buckets, admission, draw_window_ms, per_user_rate_per_sec, created_at, updated_at
         from activities
         where state = 'published' and start_at <= $1 and end_at > $2 order by id",
        horizon,
        since
    )
    .fetch_all(db)
    .await
}

/// The conditional stock decrement of an order (or of a batch of them, `units` summed): enough
/// stock, and the sale not loaded from scratch since the reservations were made (`epoch`, the
/// load epoch the messages carry; `None` for messages that carry none). Returns the stock left,
/// or `None` when the row refused (or does not exist).
pub async fn take_stock(
    conn: &mut PgConnection,
    id: i64,
    units: i64,
    epoch: Option<i64>,
) -> Result<Option<i32>, sqlx::Error> {
    sqlx::query_scalar!(
        "update activities set remaining_stock = remaining_stock - $2::bigint, updated_at = now()
         where id = $1 and remaining_stock >= $2::bigint
           and ($3::bigint is null or load_epoch = $3)
         returning remaining_stock",
        id,
        units,
        epoch
    )
    .fetch_optional(conn)
    .await
}

/// The sale's load epoch (`None`: no such activity).
pub async fn load_epoch(db: impl PgExecutor<'_>, id: i64) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar!("select load_epoch from activities where id = $1", id)
        .fetch_optional(db)
        .await
}

/// Starts a new load epoch (a load from scratch), in the caller's transaction.
pub async fn bump_load_epoch(conn: &mut PgConnection, id: i64) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update activities set load_epoch = load_epoch + 1 where id = $1",
        id
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// [`bump_load_epoch`] only while the row still carries fencing token `token` (no newer lock
/// holder wrote since); returns the row after the bump, `None` when it did not apply.
pub async fn bump_load_epoch_if_fenced(
    db: impl PgExecutor<'_>,
    id: i64,
    token: i64,
) -> Result<Option<Activity>, sqlx::Error> {
    sqlx::query_as!(
        Activity,
        "update activities set load_epoch = load_epoch + 1
         where id = $1 and last_fence_token = $2
         returning id, title, total_stock, remaining_stock, per_order_limit, start_at, end_at,
                   state, config_version, last_fence_token, load_epoch, buckets, admission, draw_window_ms, per_user_rate_per_sec, created_at, updated_at",
        id,
        token
    )
    .fetch_optional(db)
    .await
}

/// The sale's bucket count (1 when there is no such activity: nothing is loaded for it).
pub async fn bucket_count(db: impl PgExecutor<'_>, id: i64) -> Result<u32, sqlx::Error> {
    let n = sqlx::query_scalar!("select buckets from activities where id = $1", id)
        .fetch_optional(db)
        .await?;
    Ok(n.and_then(|n| u32::try_from(n).ok()).unwrap_or(1).max(1))
}

/// The newest fencing token the row accepted (`None`: no such activity).
pub async fn fence_token(db: impl PgExecutor<'_>, id: i64) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar!("select last_fence_token from activities where id = $1", id)
        .fetch_optional(db)
        .await
}

/// The stock the database has left for the sale (`None`: no such activity).
pub async fn remaining_stock(db: impl PgExecutor<'_>, id: i64) -> Result<Option<i32>, sqlx::Error> {
    sqlx::query_scalar!("select remaining_stock from activities where id = $1", id)
        .fetch_optional(db)
        .await
}

/// Total and remaining stock, with the row locked until the caller's transaction ends:
/// reconcile's stock check, so no order or cancel commits between its reads and its fix.
pub async fn lock_stock(conn: &mut PgConnection, id: i64) -> Result<(i32, i32), sqlx::Error> {
    let row = sqlx::query!(
        "select total_stock, remaining_stock from activities where id = $1 for update",
        id
    )
    .fetch_one(conn)
    .await?;
    Ok((row.total_stock, row.remaining_stock))
}

/// Sets the remaining stock to what the orders say it is (reconcile's repair, in the
/// transaction of [`lock_stock`]).
pub async fn set_remaining_stock(
    db: impl PgExecutor<'_>,
    id: i64,
    remaining: i32,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update activities set remaining_stock = $2, updated_at = now() where id = $1",
        id,
        remaining
    )
    .execute(db)
    .await?;
    Ok(())
}

/// An admin's merge update of a sale, as the row will hold it.
#[derive(Clone, Debug)]
pub struct Change<'a> {
    pub title: &'a str,
    pub total_stock: i32,
    /// What the total changes by; the remaining stock changes by the same.
    pub stock_delta: i32,
    pub per_order_limit: i32,
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    pub config_version: i64,
    pub buckets: i32,
    pub rules: Rules,
}

/// Writes an admin change, in the caller's transaction (after the fence).
pub async fn apply_change(
    conn: &mut PgConnection,
    id: i64,
    c: &Change<'_>,
) -> Result<Activity, sqlx::Error> {
    sqlx::query_as!(
        Activity,
        "update activities set title = $2, total_stock = $3,
             remaining_stock = remaining_stock + $4, per_order_limit = $5,
             start_at = $6, end_at = $7, config_version = $8, buckets = $9, admission = $10,
             draw_window_ms = $11, per_user_rate_per_sec = $12, updated_at = now()
         where id = $1
         returning id, title, total_stock, remaining_stock, per_order_limit, start_at, end_at,
                   state, config_version, last_fence_token, load_epoch, buckets, admission, draw_window_ms, per_user_rate_per_sec, created_at, updated_at",
        id,
        c.title,
        c.total_stock,
        c.stock_delta,
        c.per_order_limit,
        c.start_at,
        c.end_at,
        c.config_version,
        c.buckets,
        c.rules.admission,
        c.rules.draw_window_ms as i32,
        c.rules.per_user_rate_per_sec as i32
    )
    .fetch_one(conn)
    .await
}

/// One row of `activity_stats`: the numbers reconcile found for a sale on its last run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stats {
    pub participants: i64,
    pub sold: i64,
    pub db_remaining: i64,
    pub redis_stock: Option<i64>,
    pub pending_qty: i64,
    pub drift: i64,
    pub repairs: i64,
}

/// Upserts the sale's row of `activity_stats`, stamped now.
pub async fn record_stats(db: impl PgExecutor<'_>, id: i64, s: &Stats) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "insert into activity_stats
             (activity_id, participants, sold, db_remaining, redis_stock, pending_qty, drift,
              repairs, checked_at)
         values ($1, $2, $3, $4, $5, $6, $7, $8, now())
         on conflict (activity_id) do update set
             participants = excluded.participants, sold = excluded.sold,
             db_remaining = excluded.db_remaining, redis_stock = excluded.redis_stock,
             pending_qty = excluded.pending_qty, drift = excluded.drift,
             repairs = excluded.repairs, checked_at = excluded.checked_at",
        id,
        s.participants,
        s.sold,
        s.db_remaining,
        s.redis_stock,
        s.pending_qty,
        s.drift,
        s.repairs
    )
    .execute(db)
    .await?;
    Ok(())
}

/// The stats row reconcile last wrote for the sale.
pub async fn stats(db: impl PgExecutor<'_>, id: i64) -> Result<Option<Stats>, sqlx::Error> {
    sqlx::query_as!(
        Stats,
        "select participants, sold, db_remaining, redis_stock, pending_qty, drift, repairs
         from activity_stats where activity_id = $1",
        id
    )
    .fetch_optional(db)
    .await
}
