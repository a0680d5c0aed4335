//! Activities (sales): the row as the database stores it, and every statement that reads or
//! writes one. What an admin may set, and its rules, is [`super::settings`].

use super::settings::{Admission, Settings};
use super::status::ActivityState;
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgExecutor};
use std::time::Duration;

/// `sqlx::query_as!(Activity, <head> + <the column list> + <tail>, args…)`: the one place the
/// columns of [`Activity`] are listed, for every statement that answers rows.
macro_rules! activity_rows {
    ($head:tt, $tail:tt $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            Activity,
            $head + "id, title, total_stock, remaining_stock, per_order_limit, start_at, end_at, \
                     state as \"state: ActivityState\", config_version, last_fence_token, \
                     load_epoch, buckets, admission as \"admission: Admission\", \
                     draw_window_ms, per_user_rate_per_sec, price_minor, currency, created_at, \
                     updated_at, draw_secret as \"draw_secret: DrawSecret\", max_entrants" + $tail
            $(, $arg)*
        )
    };
}

/// One sale as the database stores it.
#[derive(Clone, Debug, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Activity {
    pub id: i64,
    pub title: String,
    pub total_stock: i64,
    pub remaining_stock: i64,
    pub per_order_limit: i64,
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    pub state: ActivityState,
    pub config_version: i64,
    pub last_fence_token: i64,
    /// Bumped each time Redis loads the sale from scratch (`crate::protocol::load`).
    pub load_epoch: i64,
    /// How many stock buckets the sale's Redis stock is split over (1: one, the layout every
    /// sale had before buckets). Fixed once the sale has started or has an order.
    pub buckets: i64,
    pub admission: Admission,
    /// A draw sale's pool window after `startAt`, in milliseconds (0 for `fcfs`).
    pub draw_window_ms: i64,
    /// Purchase attempts one user may make per second (0: no limit).
    pub per_user_rate_per_sec: i64,
    /// A unit's price in the currency's minor units (0: a sale from before prices, which
    /// cannot be paid until an admin sets one).
    pub price_minor: i64,
    /// ISO 4217, lowercase.
    #[schema(example = "usd")]
    pub currency: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// A draw sale's ticket secret (see [`DrawSecret`]): never in an answer before the draw.
    #[serde(skip)]
    pub draw_secret: DrawSecret,
    /// The most entrants a draw sale's pool takes (past it: 409 `pool_full`).
    pub max_entrants: i64,
}

/// A sale's draw secret, 32 bytes as 64 lowercase hex digits, made by the database with the
/// row: an entrant's ticket is HMAC-SHA1 of it and the user id (`lua/purchase.lua`). Its
/// SHA-256 ([`DrawSecret::commitment`]) is public from the start; the secret itself only after
/// the draw. `Debug` does not print it.
#[derive(Clone, Default, PartialEq, Eq, sqlx::Type)]
#[sqlx(transparent)]
pub struct DrawSecret(String);

impl std::fmt::Debug for DrawSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DrawSecret(..)")
    }
}

impl DrawSecret {
    /// The secret's hex digits (to reveal after the draw, or to load into Redis).
    pub fn expose_hex(&self) -> &str {
        &self.0
    }

    /// The secret's bytes (empty when the text is not hex, which the column's check forbids).
    pub fn bytes(&self) -> Vec<u8> {
        hex::decode(&self.0).unwrap_or_default()
    }

    /// SHA-256 of the secret's bytes, hex: what the public view shows before the draw.
    pub fn commitment(&self) -> String {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(self.bytes()))
    }

    /// HMAC-SHA1's two padded keys of the secret (key XOR 0x36…, key XOR 0x5c…, 64 bytes
    /// each), with which `lua/purchase.lua` makes a ticket in two SHA-1s.
    pub fn hmac_pads(&self) -> ([u8; 64], [u8; 64]) {
        let mut inner = [0x36u8; 64];
        let mut outer = [0x5cu8; 64];
        for (i, b) in self.bytes().iter().take(64).enumerate() {
            inner[i] ^= b;
            outer[i] ^= b;
        }
        (inner, outer)
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
        self.settings().draw_end_ms()
    }

    /// The settings the row holds now (the base of a merge update).
    pub fn settings(&self) -> Settings {
        Settings {
            title: self.title.clone(),
            total_stock: self.total_stock,
            per_order_limit: self.per_order_limit,
            start_at: self.start_at,
            end_at: self.end_at,
            buckets: self.bucket_count(),
            admission: self.admission,
            draw_window_ms: self.draw_window_ms,
            per_user_rate_per_sec: self.per_user_rate_per_sec,
            price_minor: self.price_minor,
            currency: self.currency.clone(),
            max_entrants: self.max_entrants,
        }
    }

    pub fn phase(&self, now: DateTime<Utc>) -> Phase {
        Phase::of(self.start_at, self.end_at, now)
    }

    /// Whether preheat loads it at `now`: published, starting within `lead`, not yet ended.
    pub fn due_for_preheat(&self, now: DateTime<Utc>, lead: Duration) -> bool {
        let horizon = now + ChronoDuration::from_std(lead).unwrap_or(ChronoDuration::hours(1));
        self.state == ActivityState::Published && self.start_at <= horizon && self.end_at > now
    }

    /// When the activity's Redis keys expire: the sale's end plus the buffer.
    pub fn expire_at(&self, buffer: Duration) -> DateTime<Utc> {
        self.end_at + ChronoDuration::from_std(buffer).unwrap_or(ChronoDuration::hours(2))
    }
}

/// Stores a new, published activity with all its stock remaining.
pub async fn insert(db: impl PgExecutor<'_>, new: &Settings) -> Result<Activity, sqlx::Error> {
    activity_rows!(
        "insert into activities (title, total_stock, remaining_stock, per_order_limit, start_at,
                                 end_at, buckets, admission, draw_window_ms, per_user_rate_per_sec,
                                 price_minor, currency, max_entrants)
         values ($1, $2, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
         returning ",
        "",
        new.title,
        new.total_stock,
        new.per_order_limit,
        new.start_at,
        new.end_at,
        i64::from(new.buckets),
        new.admission.as_str(),
        new.draw_window_ms,
        new.per_user_rate_per_sec,
        new.price_minor,
        new.currency,
        new.max_entrants
    )
    .fetch_one(db)
    .await
}

/// The highest activity id there is (0: none): one step down the primary key's index.
pub async fn max_id(db: impl PgExecutor<'_>) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar!(r#"select coalesce(max(id), 0) as "max!" from activities"#)
        .fetch_one(db)
        .await
}

/// The row, from the pool or inside a transaction (after its fencing update, say).
pub async fn get(db: impl PgExecutor<'_>, id: i64) -> Result<Option<Activity>, sqlx::Error> {
    activity_rows!("select ", " from activities where id = $1", id)
        .fetch_optional(db)
        .await
}

/// A page of activities, newest first.
pub async fn list(
    db: impl PgExecutor<'_>,
    limit: i64,
    offset: i64,
) -> Result<Vec<Activity>, sqlx::Error> {
    activity_rows!(
        "select ",
        " from activities order by id desc limit $1 offset $2",
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
    activity_rows!(
        "select ",
        " from activities
         where state = 'published' and start_at <= $1 and end_at > $2 order by start_at",
        horizon,
        now
    )
    .fetch_all(db)
    .await
}

/// Activities running, or ended within `buffer`: what reconcile checks, the one reconcile
/// checked longest ago (or never) first.
pub async fn due_for_reconcile(
    db: impl PgExecutor<'_>,
    now: DateTime<Utc>,
    lead: Duration,
    buffer: Duration,
) -> Result<Vec<Activity>, sqlx::Error> {
    let horizon = now + ChronoDuration::from_std(lead).unwrap_or(ChronoDuration::hours(1));
    let since = now - ChronoDuration::from_std(buffer).unwrap_or(ChronoDuration::hours(2));
    activity_rows!(
        "select ",
        " from activities
         where state = 'published' and start_at <= $1 and end_at > $2
         order by (select checked_at from activity_stats s where s.activity_id = activities.id)
             nulls first, id",
        horizon,
        since
    )
    .fetch_all(db)
    .await
}

/// The conditional stock decrement of an order: enough stock, and the sale not loaded from
/// scratch since the reservation was made (`epoch`, the load epoch the message carries; `None`
/// for messages that carry none). Returns the stock left, or `None` when the row refused (or
/// does not exist). The consumer's batch statement (`confirm_orders`, migrations/0024) takes a
/// group's summed units under the same condition.
pub async fn take_stock(
    conn: &mut PgConnection,
    id: i64,
    units: i64,
    epoch: Option<i64>,
) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar!(
        "update activities set remaining_stock = remaining_stock - $2, updated_at = now()
         where id = $1 and remaining_stock >= $2
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
    activity_rows!(
        "update activities set load_epoch = load_epoch + 1
         where id = $1 and last_fence_token = $2
         returning ",
        "",
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
pub async fn remaining_stock(db: impl PgExecutor<'_>, id: i64) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar!("select remaining_stock from activities where id = $1", id)
        .fetch_optional(db)
        .await
}

/// Total and remaining stock, with the row locked until the caller's transaction ends:
/// reconcile's stock check, so no order or cancel commits between its reads and its fix.
/// `for no key update`, the lock of every stock write (an `update` of the row's stock): it
/// waits for the writers in flight and holds off the next ones, and leaves alone the key-share
/// locks an order's insert takes on the row through its foreign key, which `for update` would
/// queue behind (starved by a stream of orders, each one's insert and stock update apart).
pub async fn lock_stock(conn: &mut PgConnection, id: i64) -> Result<(i64, i64), sqlx::Error> {
    let row = sqlx::query!(
        "select total_stock, remaining_stock from activities where id = $1 for no key update",
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
    remaining: i64,
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

/// Writes an admin's merge update, in the caller's transaction (after the fence): the
/// settings as merged, the remaining stock moved by `stock_delta` (what the total moves by),
/// and the new config version.
pub async fn apply_change(
    conn: &mut PgConnection,
    id: i64,
    settings: &Settings,
    stock_delta: i64,
    config_version: i64,
) -> Result<Activity, sqlx::Error> {
    activity_rows!(
        "update activities set title = $2, total_stock = $3,
             remaining_stock = remaining_stock + $4, per_order_limit = $5,
             start_at = $6, end_at = $7, config_version = $8, buckets = $9, admission = $10,
             draw_window_ms = $11, per_user_rate_per_sec = $12, price_minor = $13,
             currency = $14, max_entrants = $15, updated_at = now()
         where id = $1
         returning ",
        "",
        id,
        settings.title,
        settings.total_stock,
        stock_delta,
        settings.per_order_limit,
        settings.start_at,
        settings.end_at,
        config_version,
        i64::from(settings.buckets),
        settings.admission.as_str(),
        settings.draw_window_ms,
        settings.per_user_rate_per_sec,
        settings.price_minor,
        settings.currency,
        settings.max_entrants
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

/// Where reconcile's `walk` over one bucket of a sale stopped (`None`: at its beginning).
pub async fn reconcile_cursor(
    db: impl PgExecutor<'_>,
    id: i64,
    walk: &str,
    bucket: i32,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar!(
        "select position from reconcile_cursors
         where activity_id = $1 and walk = $2 and bucket = $3",
        id,
        walk,
        bucket
    )
    .fetch_optional(db)
    .await
}

/// Records where reconcile's `walk` over one bucket of a sale goes on next run.
pub async fn save_reconcile_cursor(
    db: impl PgExecutor<'_>,
    id: i64,
    walk: &str,
    bucket: i32,
    position: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "insert into reconcile_cursors (activity_id, walk, bucket, position)
         values ($1, $2, $3, $4)
         on conflict (activity_id, walk, bucket) do update set position = excluded.position",
        id,
        walk,
        bucket,
        position
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

/// A sale's latest reconcile check, as the operator page shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checked {
    pub activity_id: i64,
    pub checked_at: DateTime<Utc>,
    pub drift: i64,
    pub repairs: i64,
}

/// The latest reconcile rows (one per sale), newest check first, at most `limit`.
pub async fn latest_checks(
    db: impl PgExecutor<'_>,
    limit: i64,
) -> Result<Vec<Checked>, sqlx::Error> {
    sqlx::query_as!(
        Checked,
        "select activity_id, checked_at, drift, repairs from activity_stats
         order by checked_at desc, activity_id desc limit $1",
        limit
    )
    .fetch_all(db)
    .await
}
