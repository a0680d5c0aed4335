//! Typed calls of the sale's Lua scripts: purchase, compensation, settle, cancel, preheat,
//! snapshot. Each is one atomic script on the activity's hash-tagged keys.

use crate::activity::Activity;
use crate::cache::{CacheError, Redis};
use crate::scripts;
use std::time::Duration;
use uuid::Uuid;

/// What `purchase.lua` decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Stock decremented, user added, reservation recorded in the ledger.
    Accepted {
        stock_left: i64,
        now_ms: i64,
    },
    NotFound,
    NotStarted,
    Ended,
    QuantityExceedsLimit,
    SoldOut {
        stock_left: i64,
    },
    AlreadyPurchased,
}

impl Decision {
    /// The outcome name used in logs, metrics and the load generator.
    pub fn outcome(&self) -> &'static str {
        match self {
            Decision::Accepted { .. } => "accepted",
            Decision::NotFound => "not_found",
            Decision::NotStarted => "not_started",
            Decision::Ended => "ended",
            Decision::QuantityExceedsLimit => "quantity_exceeds_limit",
            Decision::SoldOut { .. } => "sold_out",
            Decision::AlreadyPurchased => "already_purchased",
        }
    }
}

/// Runs the purchase script for one user and quantity.
pub async fn purchase(
    redis: &Redis,
    activity_id: i64,
    user_id: &str,
    quantity: i64,
    request_id: Uuid,
) -> Result<Decision, CacheError> {
    let k = redis.keys(activity_id);
    let mut inv = scripts::PURCHASE.prepare_invoke();
    inv.key(&k.stock)
        .key(&k.meta)
        .key(&k.users)
        .key(&k.ledger)
        .arg(user_id)
        .arg(quantity)
        .arg(request_id.to_string());
    let (code, stock, now_ms): (i64, i64, i64) = redis.script(&inv).await?;
    Ok(match code {
        0 => Decision::Accepted {
            stock_left: stock,
            now_ms,
        },
        1 => Decision::NotFound,
        2 => Decision::NotStarted,
        3 => Decision::Ended,
        4 => Decision::QuantityExceedsLimit,
        5 => Decision::SoldOut { stock_left: stock },
        6 => Decision::AlreadyPurchased,
        other => {
            return Err(CacheError::Redis(redis::RedisError::from((
                redis::ErrorKind::Parse,
                "unexpected purchase.lua code",
                other.to_string(),
            ))))
        }
    })
}

/// How much of a reservation a compensation gives back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compensation {
    /// Stock back and the user removed: the purchase never happened.
    Full,
    /// Stock back only: the user already holds another order and keeps it.
    StockOnly,
}

/// Gives a reservation back, at most once. Returns the quantity given back, or `None` when
/// the ledger no longer holds this request (already settled or compensated).
pub async fn compensate(
    redis: &Redis,
    activity_id: i64,
    user_id: &str,
    request_id: Uuid,
    mode: Compensation,
) -> Result<Option<i64>, CacheError> {
    let k = redis.keys(activity_id);
    let mut inv = scripts::COMPENSATE.prepare_invoke();
    inv.key(&k.stock)
        .key(&k.users)
        .key(&k.ledger)
        .arg(user_id)
        .arg(request_id.to_string())
        .arg(match mode {
            Compensation::Full => "full",
            Compensation::StockOnly => "stock",
        });
    let (applied, qty): (i64, i64) = redis.script(&inv).await?;
    Ok((applied == 1).then_some(qty))
}

/// Drops the ledger entry carrying `id` (a request id or an order id) once the database holds
/// the outcome. Returns whether an entry was dropped.
pub async fn settle(
    redis: &Redis,
    activity_id: i64,
    user_id: &str,
    id: &str,
) -> Result<bool, CacheError> {
    let k = redis.keys(activity_id);
    let mut inv = scripts::SETTLE.prepare_invoke();
    inv.key(&k.ledger).arg(user_id).arg(id);
    let dropped: i64 = redis.script(&inv).await?;
    Ok(dropped == 1)
}

/// What `cancel_begin.lua` answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelBegin {
    /// The cancel is announced in the ledger: commit it in the database, then finish it.
    Recorded,
    /// Another entry of the user is in flight; retry shortly.
    Busy,
    /// The activity is not in Redis (sale long over): only the database changes.
    NotLoaded,
}

pub async fn cancel_begin(
    redis: &Redis,
    activity_id: i64,
    user_id: &str,
    order_id: i64,
    quantity: i64,
    now_ms: i64,
) -> Result<CancelBegin, CacheError> {
    let k = redis.keys(activity_id);
    let mut inv = scripts::CANCEL_BEGIN.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.ledger)
        .arg(user_id)
        .arg(order_id)
        .arg(quantity)
        .arg(now_ms);
    let code: i64 = redis.script(&inv).await?;
    Ok(match code {
        1 => CancelBegin::Recorded,
        2 => CancelBegin::NotLoaded,
        _ => CancelBegin::Busy,
    })
}

/// Gives a cancelled order's units and quota back, at most once. Returns the quantity.
pub async fn cancel_finish(
    redis: &Redis,
    activity_id: i64,
    user_id: &str,
    order_id: i64,
) -> Result<Option<i64>, CacheError> {
    let k = redis.keys(activity_id);
    let mut inv = scripts::CANCEL_FINISH.prepare_invoke();
    inv.key(&k.stock)
        .key(&k.users)
        .key(&k.ledger)
        .arg(user_id)
        .arg(order_id);
    let (applied, qty): (i64, i64) = redis.script(&inv).await?;
    Ok((applied == 1).then_some(qty))
}

/// What a ledger entry stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// `r|<requestId>|qty|ms`: units reserved, order message on its way.
    Reservation,
    /// `c|<orderId>|qty|ms`: a cancellation between Redis and the database.
    Cancel,
}

/// One in-flight entry of the ledger, keyed by user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerEntry {
    pub user_id: String,
    pub kind: EntryKind,
    /// The request id (reservation) or order id (cancel).
    pub id: String,
    pub quantity: i64,
    pub at_ms: i64,
}

impl LedgerEntry {
    pub fn parse(user_id: &str, value: &str) -> Option<Self> {
        let mut parts = value.split('|');
        let kind = match parts.next()? {
            "r" => EntryKind::Reservation,
            "c" => EntryKind::Cancel,
            _ => return None,
        };
        let id = parts.next()?.to_string();
        let quantity = parts.next()?.parse().ok()?;
        let at_ms = parts.next()?.parse().ok()?;
        Some(Self {
            user_id: user_id.to_string(),
            kind,
            id,
            quantity,
            at_ms,
        })
    }

    /// The reservation's request id, when this is a reservation.
    pub fn request_id(&self) -> Option<Uuid> {
        (self.kind == EntryKind::Reservation)
            .then(|| self.id.parse().ok())
            .flatten()
    }
}

/// The user's ledger entry, if any.
pub async fn ledger_entry(
    redis: &Redis,
    activity_id: i64,
    user_id: &str,
) -> Result<Option<LedgerEntry>, CacheError> {
    let k = redis.keys(activity_id);
    let value: Option<String> = redis
        .cmd(redis::cmd("HGET").arg(&k.ledger).arg(user_id))
        .await?;
    Ok(value.and_then(|v| LedgerEntry::parse(user_id, &v)))
}

/// An activity's Redis state, read atomically.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub loaded: bool,
    /// `None` when the stock key is missing.
    pub stock: Option<i64>,
    pub participants: i64,
    pub ledger: Vec<LedgerEntry>,
}

impl Snapshot {
    pub fn pending_quantity(&self) -> i64 {
        self.ledger
            .iter()
            .filter(|e| e.kind == EntryKind::Reservation)
            .map(|e| e.quantity)
            .sum()
    }

    pub fn pending_count(&self) -> usize {
        self.ledger
            .iter()
            .filter(|e| e.kind == EntryKind::Reservation)
            .count()
    }
}

pub async fn snapshot(redis: &Redis, activity_id: i64) -> Result<Snapshot, CacheError> {
    let k = redis.keys(activity_id);
    let mut inv = scripts::SNAPSHOT.prepare_invoke();
    inv.key(&k.stock).key(&k.meta).key(&k.users).key(&k.ledger);
    let (loaded, stock, participants, flat): (i64, i64, i64, Vec<String>) =
        redis.script(&inv).await?;
    let ledger = flat
        .chunks(2)
        .filter_map(|pair| match pair {
            [user, value] => LedgerEntry::parse(user, value),
            _ => None,
        })
        .collect();
    Ok(Snapshot {
        loaded: loaded == 1,
        stock: (stock >= 0).then_some(stock),
        participants,
        ledger,
    })
}

/// Units left in Redis, `None` when the activity is not loaded.
pub async fn stock(redis: &Redis, activity_id: i64) -> Result<Option<i64>, CacheError> {
    let k = redis.keys(activity_id);
    redis.cmd(redis::cmd("GET").arg(&k.stock)).await
}

/// What `preheat.lua` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreheatOutcome {
    Loaded,
    AlreadyLoaded,
    MetaRefreshed,
}

/// Loads one activity into Redis (stock from the DB's remaining stock), idempotently.
pub async fn preheat(
    redis: &Redis,
    activity: &Activity,
    buffer: Duration,
) -> Result<PreheatOutcome, CacheError> {
    let k = redis.keys(activity.id);
    let mut inv = scripts::PREHEAT.prepare_invoke();
    inv.key(&k.stock)
        .key(&k.meta)
        .key(&k.users)
        .key(&k.ledger)
        .arg(activity.remaining_stock)
        .arg(activity.total_stock)
        .arg(activity.start_at.timestamp_millis())
        .arg(activity.end_at.timestamp_millis())
        .arg(activity.per_order_limit)
        .arg(activity.config_version)
        .arg(activity.expire_at(buffer).timestamp_millis());
    let code: i64 = redis.script(&inv).await?;
    Ok(match code {
        1 => PreheatOutcome::Loaded,
        2 => PreheatOutcome::MetaRefreshed,
        _ => PreheatOutcome::AlreadyLoaded,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_entries_parse_both_kinds() {
        let r =
            LedgerEntry::parse("alice", "r|6f1c1a2e-0000-4000-8000-000000000001|2|1700").unwrap();
        assert_eq!(r.kind, EntryKind::Reservation);
        assert_eq!(r.quantity, 2);
        assert!(r.request_id().is_some());
        let c = LedgerEntry::parse("bob", "c|17|1|1800").unwrap();
        assert_eq!(
            (c.kind, c.id.as_str(), c.at_ms),
            (EntryKind::Cancel, "17", 1800)
        );
        assert!(LedgerEntry::parse("x", "garbage").is_none());
    }
}
