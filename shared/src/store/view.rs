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

/// What the public view shows of a loaded sale, as its meta holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SaleView {
    pub title: String,
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    /// Units Redis may still sell (never below 0).
    pub stock: i64,
    pub per_order_limit: i64,
    /// A unit's price in minor units, and its currency.
    pub price_minor: i64,
    pub currency: String,
}

/// The meta fields the public view reads: title, startMs, endMs, stock, buckets, limit,
/// price, currency.
type ViewFields = (
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<u32>,
    Option<i64>,
    Option<i64>,
    Option<String>,
);

/// The public view of a loaded sale: one HMGET of its meta (the stock is a field of it), and
/// in a bucketed sale one HGET of each other bucket's stock. `None` when Redis does not hold
/// the whole view: the sale is not loaded (before preheat, after its keys expired), or its
/// meta was written before the meta carried the title and the price.
pub async fn view(redis: &Redis, activity_id: i64) -> Result<Option<SaleView>, StoreError> {
    let k = redis.keys(activity_id);
    let mut cmd = redis::cmd("HMGET");
    cmd.arg(&k.meta)
        .arg("title")
        .arg("startMs")
        .arg("endMs")
        .arg("stock")
        .arg("buckets")
        .arg("limit")
        .arg("price")
        .arg("currency");
    let (title, start_ms, end_ms, stock, buckets, limit, price, currency): ViewFields =
        redis.cmd(&cmd).await?;
    let (
        Some(title),
        Some(start_ms),
        Some(end_ms),
        Some(mut stock),
        Some(per_order_limit),
        Some(price_minor),
        Some(currency),
    ) = (title, start_ms, end_ms, stock, limit, price, currency)
    else {
        return Ok(None);
    };
    for other in Bucket::all(activity_id, buckets.unwrap_or(1)).skip(1) {
        match self::stock(redis, other).await? {
            Some(s) => stock += s.max(0),
            None => return Ok(None),
        }
    }
    let at = |ms| DateTime::<Utc>::from_timestamp_millis(ms);
    let (Some(start_at), Some(end_at)) = (at(start_ms), at(end_ms)) else {
        return Ok(None);
    };
    Ok(Some(SaleView {
        title,
        start_at,
        end_at,
        stock: stock.max(0),
        per_order_limit,
        price_minor,
        currency,
    }))
}
