//! A sale's meta in Redis and the owner-checked scripts that write it: a load
//! (`lua/rebuild_users.lua`, then `lua/preheat.lua`), an admin change (`lua/adjust.lua`), and
//! the reads preheat decides by. Who may write, and when, is [`crate::protocol::load`] and the
//! admin function; docs/invariants.md, "Load" and "Admin".

use super::buckets::split;
use super::conn::{Redis, StoreError};
use super::keys::{Bucket, SENTINEL};
use super::scripts::{self, codes};
use super::values::SaleTerms;
use crate::domain::activity::Activity;
use crate::domain::settings::Settings;
use chrono::{DateTime, Utc};
use std::time::Duration;
use uuid::Uuid;

codes! {
    /// What `preheat.lua` did.
    pub enum PreheatOutcome of "preheat.lua" {
        AlreadyLoaded = 0,
        Loaded = 1,
        MetaRefreshed = 2,
        /// The lock changed hands before the script ran: nothing was written.
        NotOwner = 3,
    }
}

/// Loads one activity into Redis (stock from the DB's remaining stock), idempotently, for the
/// holder `owner` of its lock: every bucket of its layout, each with its share of the stock
/// (`lua/preheat.lua` per bucket; a bucket already loaded keeps its stock). The caller read
/// `activity` after taking the lock and recording its fencing token (see
/// [`crate::protocol::load`]). The outcome is the whole sale's: `NotOwner` if any bucket
/// refused, else `Loaded` if any bucket was loaded now, else `MetaRefreshed` if any meta was,
/// else `AlreadyLoaded`.
pub async fn preheat(
    redis: &Redis,
    activity: &Activity,
    buffer: Duration,
    owner: &str,
) -> Result<PreheatOutcome, StoreError> {
    let count = activity.bucket_count();
    let shares = split(activity.remaining_stock, count);
    let mut whole = PreheatOutcome::AlreadyLoaded;
    for (bucket, share) in Bucket::all(activity.id, count).zip(shares) {
        let outcome = preheat_bucket(redis, bucket, activity, share, buffer, owner).await?;
        whole = match (whole, outcome) {
            (_, PreheatOutcome::NotOwner) => return Ok(PreheatOutcome::NotOwner),
            (PreheatOutcome::Loaded, _) | (_, PreheatOutcome::Loaded) => PreheatOutcome::Loaded,
            (PreheatOutcome::MetaRefreshed, _) | (_, PreheatOutcome::MetaRefreshed) => {
                PreheatOutcome::MetaRefreshed
            }
            _ => PreheatOutcome::AlreadyLoaded,
        };
    }
    Ok(whole)
}

async fn preheat_bucket(
    redis: &Redis,
    bucket: Bucket,
    activity: &Activity,
    stock: i64,
    buffer: Duration,
    owner: &str,
) -> Result<PreheatOutcome, StoreError> {
    let k = redis.bucket_keys(bucket);
    let mut inv = scripts::PREHEAT.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.users)
        .key(&k.ledger)
        .key(&k.lock)
        .key(&k.pool)
        .key(&k.winners)
        .key(&k.tickets)
        .arg(stock)
        .arg(activity.total_stock)
        .arg(activity.start_at.timestamp_millis())
        .arg(activity.end_at.timestamp_millis())
        .arg(activity.per_order_limit)
        .arg(activity.config_version)
        .arg(activity.expire_at(buffer).timestamp_millis())
        .arg(owner)
        .arg(activity.load_epoch)
        .arg(&activity.title)
        .arg(bucket.count)
        .arg(activity.draw_end_ms())
        .arg(activity.per_user_rate_per_sec)
        .arg(activity.price_minor)
        .arg(&activity.currency);
    let (inner, outer) = activity.draw_secret.hmac_pads();
    inv.arg(&inner[..])
        .arg(&outer[..])
        .arg(activity.draw_secret.commitment())
        .arg(activity.draw_secret.expose_hex())
        .arg(activity.max_entrants);
    PreheatOutcome::read(redis.script(&inv).await?)
}

codes! {
    /// `adjust.lua`'s reply codes.
    pub enum AdjustCode of "adjust.lua" {
        Applied = 0,
        NotOwner = 1,
        NotLoaded = 2,
        WouldGoNegative = 3,
    }
}

/// What `adjust.lua` answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Adjust {
    Applied,
    /// The lock changed hands before the script ran: nothing was written.
    NotOwner,
    /// Redis does not hold the sale: the caller loads it.
    NotLoaded,
    /// The Redis stock would go below 0: units are sold or reserved.
    WouldGoNegative {
        stock: i64,
    },
}

/// The activity's meta as `adjust.lua` writes it to Redis.
#[derive(Clone, Debug)]
pub struct ActivityMeta {
    /// Shown by the public view, which reads it from the meta.
    pub title: String,
    pub total: i64,
    pub per_order_limit: i64,
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    pub version: i64,
    /// When the sale's keys expire: end plus the expiry buffer.
    pub expire_at: DateTime<Utc>,
    /// When a draw sale's pool closes (ms since 1970; 0: first come, first served).
    pub draw_end_ms: i64,
    /// Purchase attempts per user and second (0: no limit).
    pub rate: i64,
    /// A unit's price in minor units and its currency, for the public view.
    pub price_minor: i64,
    pub currency: String,
    /// The most entrants a draw sale's pool takes.
    pub max_entrants: i64,
}

impl ActivityMeta {
    /// The meta of a sale with these settings at config `version`, its keys expiring `buffer`
    /// after its end.
    pub fn of(settings: &Settings, version: i64, buffer: Duration) -> Self {
        let buffer = chrono::Duration::from_std(buffer).unwrap_or(chrono::Duration::hours(2));
        ActivityMeta {
            title: settings.title.clone(),
            total: settings.total_stock,
            per_order_limit: settings.per_order_limit,
            start_at: settings.start_at,
            end_at: settings.end_at,
            version,
            expire_at: settings.end_at + buffer,
            draw_end_ms: settings.draw_end_ms(),
            rate: settings.per_user_rate_per_sec,
            max_entrants: settings.max_entrants,
            price_minor: settings.price_minor,
            currency: settings.currency.clone(),
        }
    }
}

/// `lua/adjust.lua`: applies an admin change to a loaded sale, for the lock `owner` only:
/// the stock `delta` and the new `meta`, once per `change` id.
pub async fn adjust(
    redis: &Redis,
    at: impl Into<Bucket>,
    owner: &str,
    delta: i64,
    meta: &ActivityMeta,
    change: &str,
) -> Result<Adjust, StoreError> {
    let k = redis.bucket_keys(at.into());
    let mut inv = scripts::ADJUST.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.lock)
        .key(&k.users)
        .key(&k.ledger)
        .key(&k.pool)
        .key(&k.winners)
        .key(&k.tickets)
        .arg(owner)
        .arg(delta)
        .arg(meta.total)
        .arg(meta.start_at.timestamp_millis())
        .arg(meta.end_at.timestamp_millis())
        .arg(meta.per_order_limit)
        .arg(meta.version)
        .arg(meta.expire_at.timestamp_millis())
        .arg(change)
        .arg(&meta.title)
        .arg(meta.draw_end_ms)
        .arg(meta.rate)
        .arg(meta.price_minor)
        .arg(&meta.currency)
        .arg(meta.max_entrants);
    let (code, stock): (i64, i64) = redis.script(&inv).await?;
    Ok(match AdjustCode::read(code)? {
        AdjustCode::Applied => Adjust::Applied,
        AdjustCode::NotOwner => Adjust::NotOwner,
        AdjustCode::NotLoaded => Adjust::NotLoaded,
        AdjustCode::WouldGoNegative => Adjust::WouldGoNegative { stock },
    })
}

/// The config version Redis holds for the activity, `None` when it is not loaded.
pub async fn loaded_version(
    redis: &Redis,
    at: impl Into<Bucket>,
) -> Result<Option<i64>, StoreError> {
    let k = redis.bucket_keys(at.into());
    redis
        .cmd(redis::cmd("HGET").arg(&k.meta).arg("version"))
        .await
}

/// Whether `users` and the ledger both hold their [`SENTINEL`] field and the meta its ticket
/// secret, as `lua/preheat.lua` leaves them: a sale loaded without them (or whose hash was
/// lost, or loaded by a build before tickets) is given them back by the next preheat.
pub async fn has_sentinels(redis: &Redis, at: impl Into<Bucket>) -> Result<bool, StoreError> {
    let k = redis.bucket_keys(at.into());
    for (key, field) in [
        (&k.users, SENTINEL),
        (&k.ledger, SENTINEL),
        (&k.meta, "drawKeyI"),
    ] {
        let there: bool = redis.cmd(redis::cmd("HEXISTS").arg(key).arg(field)).await?;
        if !there {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether the meta's `terms` are the terms of its own fields, as `lua/preheat.lua` and
/// `lua/adjust.lua` write them: a meta loaded by a build before them, or whose fields a writer
/// that did not know them changed, is given them by the next preheat (until then every
/// purchase reads the fields).
pub async fn terms_current(redis: &Redis, at: impl Into<Bucket>) -> Result<bool, StoreError> {
    let k = redis.bucket_keys(at.into());
    let (fields, terms): ([Option<String>; 6], Option<String>) = {
        let mut read: Vec<Option<String>> = redis
            .cmd(
                redis::cmd("HMGET")
                    .arg(&k.meta)
                    .arg(&SaleTerms::FIELDS[..])
                    .arg("terms"),
            )
            .await?;
        let terms = read.pop().flatten();
        let fields = read.try_into().unwrap_or_default();
        (fields, terms)
    };
    Ok(terms.is_some() && terms == SaleTerms::of_fields(&fields))
}

codes! {
    /// `lua/rebuild_users.lua`'s reply codes.
    pub enum RebuildCode of "rebuild_users.lua" {
        /// Not the owner, or the sale is loaded.
        Refused = 0,
        Rebuilt = 1,
    }
}

/// `lua/rebuild_users.lua`: one chunk of `users` of a sale that is not loaded, for the lock
/// `owner`: each holder of a live order with its order's request id; the first chunk empties
/// `users` and the ledger first. Returns false when refused (not the owner, or the sale is
/// loaded).
pub async fn rebuild_users(
    redis: &Redis,
    at: impl Into<Bucket>,
    owner: &str,
    first: bool,
    holders: &[(String, Uuid)],
) -> Result<bool, StoreError> {
    let k = redis.bucket_keys(at.into());
    let mut inv = scripts::REBUILD_USERS.prepare_invoke();
    inv.key(&k.users)
        .key(&k.ledger)
        .key(&k.meta)
        .key(&k.lock)
        .key(&k.pool)
        .key(&k.tickets)
        .key(&k.winners)
        .arg(owner)
        .arg(if first { "first" } else { "more" });
    for (user, request_id) in holders {
        inv.arg(user).arg(request_id.to_string());
    }
    Ok(RebuildCode::read(redis.script(&inv).await?)? == RebuildCode::Rebuilt)
}
