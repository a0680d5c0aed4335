//! A sale's settings: what an admin creates ([`NewActivity`]) or changes ([`ActivityPatch`]),
//! checked into the one [`Settings`] the database stores and Redis's meta is made from.

use chrono::{DateTime, Datelike, Utc};
use serde::Deserialize;

/// Upper bound on one activity's stock; keeps every sum comfortably inside i64 and Lua numbers.
pub const MAX_TOTAL_STOCK: i64 = 100_000_000;
/// Upper bound on the per-order limit.
pub const MAX_PER_ORDER_LIMIT: i64 = 10_000;
/// Upper bound on a draw window: ten minutes.
pub const MAX_DRAW_WINDOW_MS: i64 = 600_000;
/// Upper bound on a per-user purchase rate.
pub const MAX_RATE_PER_SEC: i64 = 1_000;
/// A new sale's per-user purchase rate unless it says otherwise: far above what a person
/// clicks, far below what a script sends. 0 turns it off, on purpose only.
pub const DEFAULT_RATE_PER_SEC: i64 = 10;
/// A draw sale's pool takes this many entrants unless it says otherwise (about 250 MB of
/// Redis at about 250 B an entrant: the pool entry and the ticket, `make bench`'s draw section).
pub const DEFAULT_MAX_ENTRANTS: i64 = 1_000_000;
/// Upper bound on a draw sale's pool.
pub const MAX_MAX_ENTRANTS: i64 = 10_000_000;
/// The most buckets one sale may have.
pub const MAX_BUCKETS: u32 = 16;
/// Upper bound on a unit's price in minor units (999,999.99 in a two-decimal currency): the
/// most a card payment at the usual providers may be, and with the per-order limit still far
/// inside i64.
pub const MAX_PRICE_MINOR: i64 = 99_999_999;

/// An admin's input that breaks a rule of the settings; the text names the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

crate::domain::status::text_enum! {
    /// How a sale admits its buyers at the opening (`activities.admission`).
    pub enum Admission {
        /// First come, first served: purchases are decided in the order Redis runs them.
        Fcfs = "fcfs",
        /// Purchases of the first `drawWindowMs` after the start enter a pool; when the window
        /// closes the winners are drawn at random (`lua/draw.lua`), and what they leave is
        /// sold first come, first served.
        Draw = "draw",
    }
}

/// A sale's settings, every rule checked: what a create stores, what a merge update comes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Trimmed.
    pub title: String,
    pub total_stock: i64,
    pub per_order_limit: i64,
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    pub buckets: u32,
    pub admission: Admission,
    /// A draw sale's pool window after `start_at` (0 for `fcfs`).
    pub draw_window_ms: i64,
    /// Purchase attempts one user may make per second (0: no limit).
    pub per_user_rate_per_sec: i64,
    /// A unit's price in the currency's minor units (cents); an order pays it times its
    /// quantity.
    pub price_minor: i64,
    /// ISO 4217, lowercase (`usd`).
    pub currency: String,
    /// The most entrants a draw sale's pool takes.
    pub max_entrants: i64,
}

impl Settings {
    /// When a draw sale's pool closes, in ms since 1970; 0 for a first-come sale. Redis holds
    /// it as the meta's `drawEndMs`.
    pub fn draw_end_ms(&self) -> i64 {
        draw_end_ms(self.admission, self.draw_window_ms, self.start_at)
    }

    /// Checks the rules of the rate and the admission (the fields, the bucket count and the
    /// admission's name are checked before, in that order).
    fn checked(self) -> Result<Self, Invalid> {
        if !(1..=MAX_PRICE_MINOR).contains(&self.price_minor) {
            return invalid(format!(
                "priceMinor must be between 1 and {MAX_PRICE_MINOR}"
            ));
        }
        if !(self.currency.len() == 3 && self.currency.bytes().all(|b| b.is_ascii_lowercase())) {
            return invalid("currency must be three letters of ISO 4217 (usd)".into());
        }
        if !(1..=MAX_MAX_ENTRANTS).contains(&self.max_entrants) {
            return invalid(format!(
                "maxEntrants must be between 1 and {MAX_MAX_ENTRANTS}"
            ));
        }
        if self.per_user_rate_per_sec < 0 || self.per_user_rate_per_sec > MAX_RATE_PER_SEC {
            return invalid(format!(
                "perUserRatePerSec must be between 0 and {MAX_RATE_PER_SEC}"
            ));
        }
        match self.admission {
            Admission::Fcfs if self.draw_window_ms != 0 => {
                invalid("drawWindowMs applies only to admission \"draw\"".into())
            }
            Admission::Fcfs => Ok(self),
            Admission::Draw if !(1..=MAX_DRAW_WINDOW_MS).contains(&self.draw_window_ms) => invalid(
                format!("admission \"draw\" needs drawWindowMs between 1 and {MAX_DRAW_WINDOW_MS}"),
            ),
            Admission::Draw
                if (self.end_at - self.start_at).num_milliseconds() < self.draw_window_ms =>
            {
                invalid("drawWindowMs must fit between startAt and endAt".into())
            }
            Admission::Draw if self.buckets != 1 => invalid(
                "admission \"draw\" needs buckets = 1: the draw is one script on one shard".into(),
            ),
            Admission::Draw => Ok(self),
        }
    }
}

/// When the pool of a sale with these rules closes (0: not a draw sale).
pub fn draw_end_ms(admission: Admission, draw_window_ms: i64, start_at: DateTime<Utc>) -> i64 {
    if admission == Admission::Draw && draw_window_ms > 0 {
        start_at.timestamp_millis() + draw_window_ms
    } else {
        0
    }
}

fn invalid<T>(message: String) -> Result<T, Invalid> {
    Err(Invalid(message))
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
    /// Purchase attempts one user may make per second (default 10; 0: no limit); the excess
    /// is answered 429 `rate_limited` with `Retry-After`.
    #[schema(minimum = 0, maximum = 1_000)]
    #[serde(default)]
    pub per_user_rate_per_sec: Option<i64>,
    /// A unit's price in the currency's minor units (1999 is 19.99 USD); a buyer pays it
    /// times the order's quantity, through the payment provider.
    #[schema(minimum = 1, maximum = 99_999_999, example = 1999)]
    pub price_minor: i64,
    /// ISO 4217 code (`usd`; any case, stored lowercase).
    #[schema(example = "usd", pattern = "^[A-Za-z]{3}$")]
    pub currency: String,
    /// The most entrants a draw sale's pool takes (default 1000000); past it a purchase in the
    /// window is answered 409 `pool_full`.
    #[schema(minimum = 1, maximum = 10_000_000)]
    #[serde(default)]
    pub max_entrants: Option<i64>,
}

impl NewActivity {
    /// The settings it asks for, defaults filled in, every rule checked (the first problem is
    /// answered, naming the field).
    pub fn settings(&self) -> Result<Settings, Invalid> {
        check_fields(
            &self.title,
            self.total_stock,
            self.per_order_limit,
            self.start_at,
            self.end_at,
        )?;
        Settings {
            title: self.title.trim().to_string(),
            total_stock: self.total_stock,
            per_order_limit: self.per_order_limit,
            start_at: self.start_at,
            end_at: self.end_at,
            buckets: bucket_count(self.buckets.unwrap_or(1))?,
            admission: admission(self.admission.as_deref().unwrap_or("fcfs"))?,
            draw_window_ms: self.draw_window_ms.unwrap_or(0),
            per_user_rate_per_sec: self.per_user_rate_per_sec.unwrap_or(DEFAULT_RATE_PER_SEC),
            price_minor: self.price_minor,
            currency: self.currency.trim().to_ascii_lowercase(),
            max_entrants: self.max_entrants.unwrap_or(DEFAULT_MAX_ENTRANTS),
        }
        .checked()
    }
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
    /// Only until 10 s before the sale starts: a confirmed order pays the price it was sold at.
    #[schema(minimum = 1, maximum = 99_999_999)]
    pub price_minor: Option<i64>,
    /// Only until 10 s before the sale starts.
    #[schema(pattern = "^[A-Za-z]{3}$")]
    pub currency: Option<String>,
    #[schema(minimum = 1, maximum = 10_000_000)]
    pub max_entrants: Option<i64>,
}

impl ActivityPatch {
    pub fn is_empty(&self) -> bool {
        self.buckets.is_none()
            && self.admission.is_none()
            && self.draw_window_ms.is_none()
            && self.per_user_rate_per_sec.is_none()
            && self.price_minor.is_none()
            && self.currency.is_none()
            && self.max_entrants.is_none()
            && self.title.is_none()
            && self.total_stock.is_none()
            && self.per_order_limit.is_none()
            && self.start_at.is_none()
            && self.end_at.is_none()
    }

    /// The settings `was` after this merge, every rule checked. A switch to `fcfs` drops the
    /// draw window, a switch to `draw` needs one.
    pub fn merged(&self, was: &Settings) -> Result<Settings, Invalid> {
        let admission_text = self.admission.as_deref().unwrap_or(was.admission.as_str());
        let draw_window_ms = match (self.draw_window_ms, admission_text) {
            (Some(ms), _) => ms,
            (None, "draw") => was.draw_window_ms,
            (None, _) => 0,
        };
        let title = self.title.as_deref().unwrap_or(&was.title).trim();
        let total_stock = self.total_stock.unwrap_or(was.total_stock);
        let per_order_limit = self.per_order_limit.unwrap_or(was.per_order_limit);
        let start_at = self.start_at.unwrap_or(was.start_at);
        let end_at = self.end_at.unwrap_or(was.end_at);
        check_fields(title, total_stock, per_order_limit, start_at, end_at)?;
        Settings {
            title: title.to_string(),
            total_stock,
            per_order_limit,
            start_at,
            end_at,
            buckets: bucket_count(self.buckets.unwrap_or(i64::from(was.buckets)))?,
            admission: admission(admission_text)?,
            draw_window_ms,
            per_user_rate_per_sec: self
                .per_user_rate_per_sec
                .unwrap_or(was.per_user_rate_per_sec),
            price_minor: self.price_minor.unwrap_or(was.price_minor),
            currency: match &self.currency {
                Some(c) => c.trim().to_ascii_lowercase(),
                None => was.currency.clone(),
            },
            max_entrants: self.max_entrants.unwrap_or(was.max_entrants),
        }
        .checked()
    }
}

/// `fcfs` or `draw`.
fn admission(text: &str) -> Result<Admission, Invalid> {
    Admission::parse(text).ok_or_else(|| {
        Invalid(format!(
            "admission must be \"fcfs\" or \"draw\", got {text:?}"
        ))
    })
}

/// A bucket count between 1 and [`MAX_BUCKETS`].
fn bucket_count(buckets: i64) -> Result<u32, Invalid> {
    match u32::try_from(buckets) {
        Ok(n) if (1..=MAX_BUCKETS).contains(&n) => Ok(n),
        _ => invalid(format!("buckets must be between 1 and {MAX_BUCKETS}")),
    }
}

/// The rules of the plain fields, for a create or for the result of a merge update.
fn check_fields(
    title: &str,
    total_stock: i64,
    per_order_limit: i64,
    start_at: DateTime<Utc>,
    end_at: DateTime<Utc>,
) -> Result<(), Invalid> {
    let title_len = title.trim().chars().count();
    if title_len == 0 || title_len > 200 {
        return invalid("title must be 1 to 200 characters".into());
    }
    // PostgreSQL text cannot hold NUL; a title is one line of text anyway.
    if title.chars().any(char::is_control) {
        return invalid("title must not contain control characters".into());
    }
    if !(1..=MAX_TOTAL_STOCK).contains(&total_stock) {
        return invalid(format!(
            "totalStock must be between 1 and {MAX_TOTAL_STOCK}"
        ));
    }
    if !(1..=MAX_PER_ORDER_LIMIT).contains(&per_order_limit) {
        return invalid(format!(
            "perOrderLimit must be between 1 and {MAX_PER_ORDER_LIMIT}"
        ));
    }
    if start_at >= end_at {
        return invalid("startAt must be before endAt".into());
    }
    // Redis holds the window as milliseconds since 1970, and answers write it as RFC 3339,
    // whose years have four digits (an offset can push a valid 9999-12-31 into year 10000).
    if start_at < DateTime::UNIX_EPOCH || end_at.year() > 9999 {
        return invalid(
            "startAt and endAt must lie between 1970-01-01 and 9999-12-31 (UTC)".into(),
        );
    }
    Ok(())
}
