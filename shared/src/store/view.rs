//! The plain reads of a loaded sale: its stock and what the public view shows of it.

use super::conn::{Redis, StoreError};
use super::keys::Bucket;
use chrono::{DateTime, Utc};

/// Units left in Redis, `None` when the activity is not loaded.
pub async fn stock(redis: &Redis, at: impl Into<Bucket>) -> Result<Option<i64>, StoreError> {
    let k = redis.bucket_keys(at.into());
    redis
        .cmd(redis::cmd("HGET").arg(&k.meta).arg("stock"))
        .await
}

/// A bucket's stock and stock sequence (`seq`, bumped by every script that moves the stock), in
/// one read; a bucket not loaded reads (0, 0).
pub async fn stock_and_seq(redis: &Redis, at: Bucket) -> Result<(i64, i64), StoreError> {
    let k = redis.bucket_keys(at);
    let (stock, seq): (Option<i64>, Option<i64>) = redis
        .cmd(redis::cmd("HMGET").arg(&k.meta).arg("stock").arg("seq"))
        .await?;
    Ok((stock.unwrap_or(0), seq.unwrap_or(0)))
}

/// What the public view shows of a loaded sale, as its meta holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActivityView {
    pub title: String,
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    /// Units Redis may still sell (never below 0).
    pub stock: i64,
    pub per_order_limit: i64,
    /// A unit's price in minor units, and its currency.
    pub price_minor: i64,
    pub currency: String,
    /// A draw sale's public facts of its draw; `None` for a first-come sale.
    pub draw: Option<DrawView>,
}

/// What anyone may know of a draw sale's draw: the SHA-256 of its ticket secret from the
/// start; once the draw is done, the secret itself and the last ticket the draw looked at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrawView {
    pub commitment: String,
    /// Revealed when the draw is done.
    pub secret: Option<String>,
    /// The last ticket the draw looked at (every higher ticket lost), when it is done.
    pub cutoff: Option<i64>,
    /// Entries answered `queued` that reached the pool again only after the draw had begun
    /// (Redis lost the sale; their messages came after the wait): the draw could not look at
    /// them, whatever their ticket. Shown when the draw is done.
    pub late_entries: Option<i64>,
}

/// The meta fields the public view reads, in this order.
const VIEW_FIELDS: [&str; 14] = [
    "title",
    "startMs",
    "endMs",
    "stock",
    "buckets",
    "limit",
    "price",
    "currency",
    "drawEndMs",
    "drawCommit",
    "drawn",
    "drawSecret",
    "drawCutoff",
    "lateEntries",
];

/// The public view of a loaded sale: one HMGET of its meta (the stock is a field of it), and
/// in a bucketed sale one HGET of each other bucket's stock. `None` when Redis does not hold
/// the whole view: the sale is not loaded (before preheat, after its keys expired), or its
/// meta was written before the meta carried the title and the price.
pub async fn view(redis: &Redis, activity_id: i64) -> Result<Option<ActivityView>, StoreError> {
    let k = redis.keys(activity_id);
    let mut cmd = redis::cmd("HMGET");
    cmd.arg(&k.meta).arg(&VIEW_FIELDS[..]);
    let fields: Vec<Option<String>> = redis.cmd(&cmd).await?;
    let text = |i: usize| fields.get(i).cloned().flatten();
    let number = |i: usize| text(i).and_then(|v| v.parse::<i64>().ok());
    let (
        Some(title),
        Some(start_ms),
        Some(end_ms),
        Some(mut stock),
        Some(per_order_limit),
        Some(price_minor),
        Some(currency),
    ) = (
        text(0),
        number(1),
        number(2),
        number(3),
        number(5),
        number(6),
        text(7),
    )
    else {
        return Ok(None);
    };
    let buckets = number(4).and_then(|b| u32::try_from(b).ok()).unwrap_or(1);
    for other in Bucket::all(activity_id, buckets).skip(1) {
        match self::stock(redis, other).await? {
            Some(s) => stock += s.max(0),
            None => return Ok(None),
        }
    }
    let at = |ms| DateTime::<Utc>::from_timestamp_millis(ms);
    let (Some(start_at), Some(end_at)) = (at(start_ms), at(end_ms)) else {
        return Ok(None);
    };
    let draw = match (number(8), text(9)) {
        (Some(draw_end), Some(commitment)) if draw_end > 0 => {
            let done = text(10).as_deref() == Some("1");
            Some(DrawView {
                commitment,
                secret: if done { text(11) } else { None },
                cutoff: if done { number(12) } else { None },
                late_entries: done.then(|| number(13).unwrap_or(0)),
            })
        }
        _ => None,
    };
    Ok(Some(ActivityView {
        title,
        start_at,
        end_at,
        stock: stock.max(0),
        per_order_limit,
        price_minor,
        currency,
        draw,
    }))
}
