//! Typed calls of the sale's Lua scripts: purchase, compensation, settle, cancel, preheat,
//! snapshot. Each is one atomic script on the activity's hash-tagged keys. Also the plain reads
//! of a loaded sale: its stock, its public view, its ledger entries.

use crate::activity::Activity;
use crate::cache::{CacheError, Redis};
use crate::refusal::Refusal;
use crate::scripts;
use chrono::{DateTime, Utc};
use std::time::Duration;
use uuid::Uuid;

/// A purchase `purchase.lua` made: stock decremented, user added, reservation recorded in the
/// ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// Units left after this one.
    pub stock_left: i64,
    /// The Redis server's clock when the script ran: the reservation's time.
    pub now_ms: i64,
    /// The sale's load epoch, for the order message.
    pub epoch: i64,
}

/// Runs the purchase script for one user and quantity. `deadline_ms` is on the Redis server's
/// clock: a script that only gets to run after it refuses ([`Refusal::Expired`]), so a caller
/// that timed out and answered 503 leaves nothing behind. [`far_deadline`] never expires.
pub async fn purchase(
    redis: &Redis,
    activity_id: i64,
    user_id: &str,
    quantity: i64,
    request_id: Uuid,
    deadline_ms: i64,
) -> Result<Result<Reservation, Refusal>, CacheError> {
    let k = redis.keys(activity_id);
    let mut inv = scripts::PURCHASE.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.users)
        .key(&k.ledger)
        .arg(user_id)
        .arg(quantity)
        .arg(request_id.to_string())
        .arg(deadline_ms);
    let (code, stock, now_ms, epoch): (i64, i64, i64, i64) = redis.script(&inv).await?;
    if code == 0 {
        return Ok(Ok(Reservation {
            stock_left: stock,
            now_ms,
            epoch,
        }));
    }
    match Refusal::from_script(code, stock, now_ms) {
        Some(refusal) => Ok(Err(refusal)),
        None => Err(scripts::unknown_answer("purchase.lua", code)),
    }
}

/// A purchase deadline that never passes, for callers with no timeout of their own to honour
/// (tests, tools).
pub fn far_deadline() -> i64 {
    i64::MAX / 2
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
    inv.key(&k.meta)
        .key(&k.users)
        .key(&k.ledger)
        .arg(user_id)
        .arg(request_id.to_string())
        .arg(match mode {
            Compensation::Full => "full",
            Compensation::StockOnly => "stock",
        });
    let (applied, qty): (i64, i64) = redis.script(&inv).await?;
    Ok(scripts::flag("compensate.lua", applied)?.then_some(qty))
}

/// Drops the ledger entry carrying `id` (a request id, a cancel id or a check token) once the
/// database holds the outcome. Returns whether an entry was dropped.
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
    scripts::flag("settle.lua", dropped)
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
    /// The user's field in `users` does not name the order's request: the order holds nothing
    /// in Redis any more (another attempt cancelled it and finished). Nothing was written.
    NotHeld,
}

/// One cancel attempt, as `lua/cancel_begin.lua` announces it.
#[derive(Clone, Copy, Debug)]
pub struct CancelAttempt<'a> {
    pub activity_id: i64,
    pub user_id: &'a str,
    pub order_id: i64,
    /// The order's request id: its own reservation entry may give way to the cancel.
    pub request_id: Uuid,
    pub quantity: i64,
    /// This attempt's id; the order row records it when the attempt commits.
    pub cancel_id: Uuid,
}

/// Announces a cancel attempt in the ledger (`c|<cancelId>|qty|ms|<orderId>`). Returns what
/// the script answered and the sale's load epoch, which the database commit must still find.
pub async fn cancel_begin(
    redis: &Redis,
    attempt: &CancelAttempt<'_>,
    now_ms: i64,
) -> Result<(CancelBegin, i64), CacheError> {
    let k = redis.keys(attempt.activity_id);
    let mut inv = scripts::CANCEL_BEGIN.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.ledger)
        .key(&k.users)
        .arg(attempt.user_id)
        .arg(attempt.cancel_id.to_string())
        .arg(attempt.quantity)
        .arg(now_ms)
        .arg(attempt.order_id)
        .arg(attempt.request_id.to_string());
    let (code, epoch): (i64, i64) = redis.script(&inv).await?;
    let begin = match code {
        0 => CancelBegin::Busy,
        1 => CancelBegin::Recorded,
        2 => CancelBegin::NotLoaded,
        3 => CancelBegin::NotHeld,
        other => return Err(scripts::unknown_answer("cancel_begin.lua", other)),
    };
    Ok((begin, epoch))
}

/// Gives a cancelled order's units and quota back, at most once, for the attempt `cancel_id`
/// (the one the order row recorded). Returns the quantity.
pub async fn cancel_finish(
    redis: &Redis,
    activity_id: i64,
    user_id: &str,
    cancel_id: Uuid,
) -> Result<Option<i64>, CacheError> {
    let k = redis.keys(activity_id);
    let mut inv = scripts::CANCEL_FINISH.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.users)
        .key(&k.ledger)
        .arg(user_id)
        .arg(cancel_id.to_string());
    let (applied, qty): (i64, i64) = redis.script(&inv).await?;
    Ok(scripts::flag("cancel_finish.lua", applied)?.then_some(qty))
}

/// What a ledger entry stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// `r|<requestId>|qty|ms`: units reserved, order message on its way.
    Reservation,
    /// `c|<cancelId>|qty|ms|<orderId>`: a cancel attempt between Redis and the database.
    Cancel,
    /// `x|<token>|0|ms`: reconcile's orphan check is looking at this user.
    Check,
}

/// One in-flight entry of the ledger, keyed by user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerEntry {
    pub user_id: String,
    pub kind: EntryKind,
    /// What guards the entry: the request id (reservation), the cancel id (cancel) or the
    /// check token.
    pub id: String,
    pub quantity: i64,
    pub at_ms: i64,
    /// The order a cancel entry is about.
    pub order_id: Option<i64>,
}

impl LedgerEntry {
    pub fn parse(user_id: &str, value: &str) -> Option<Self> {
        let mut parts = value.split('|');
        let kind = match parts.next()? {
            "r" => EntryKind::Reservation,
            "c" => EntryKind::Cancel,
            "x" => EntryKind::Check,
            _ => return None,
        };
        let id = parts.next()?.to_string();
        let quantity = parts.next()?.parse().ok()?;
        let at_ms = parts.next()?.parse().ok()?;
        let order_id = match kind {
            EntryKind::Cancel => Some(parts.next()?.parse().ok()?),
            _ => None,
        };
        Some(Self {
            user_id: user_id.to_string(),
            kind,
            id,
            quantity,
            at_ms,
            order_id,
        })
    }

    /// The reservation's request id, when this is a reservation.
    pub fn request_id(&self) -> Option<Uuid> {
        (self.kind == EntryKind::Reservation)
            .then(|| self.id.parse().ok())
            .flatten()
    }

    /// The cancel attempt's id, when this is a cancel.
    pub fn cancel_id(&self) -> Option<Uuid> {
        (self.kind == EntryKind::Cancel)
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
    /// `None` when the meta holds no stock (the sale is not loaded).
    pub stock: Option<i64>,
    /// Users holding a reservation, an order or a cancel in flight (the sentinel not counted).
    pub participants: i64,
    pub ledger: Vec<LedgerEntry>,
    /// The stock sequence: bumped by every script that moves the stock.
    pub seq: i64,
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
    inv.key(&k.meta).key(&k.users).key(&k.ledger);
    let (loaded, stock, participants, flat, seq): (i64, i64, i64, Vec<String>, i64) =
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
        seq,
    })
}

/// Units left in Redis, `None` when the activity is not loaded.
pub async fn stock(redis: &Redis, activity_id: i64) -> Result<Option<i64>, CacheError> {
    let k = redis.keys(activity_id);
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
}

/// The public view of a loaded sale: one HMGET of its meta (the stock is a field of it).
/// `None` when Redis does
/// not hold the whole view: the sale is not loaded (before preheat, after its keys expired),
/// or its meta was written before the meta carried the title.
pub async fn view(redis: &Redis, activity_id: i64) -> Result<Option<SaleView>, CacheError> {
    let k = redis.keys(activity_id);
    let mut cmd = redis::cmd("HMGET");
    cmd.arg(&k.meta)
        .arg("title")
        .arg("startMs")
        .arg("endMs")
        .arg("stock");
    let (title, start_ms, end_ms, stock): (Option<String>, Option<i64>, Option<i64>, Option<i64>) =
        redis.cmd(&cmd).await?;
    let (Some(title), Some(start_ms), Some(end_ms), Some(stock)) = (title, start_ms, end_ms, stock)
    else {
        return Ok(None);
    };
    let at = |ms| DateTime::<Utc>::from_timestamp_millis(ms);
    let (Some(start_at), Some(end_at)) = (at(start_ms), at(end_ms)) else {
        return Ok(None);
    };
    Ok(Some(SaleView {
        title,
        start_at,
        end_at,
        stock: stock.max(0),
    }))
}

/// What `preheat.lua` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreheatOutcome {
    Loaded,
    AlreadyLoaded,
    MetaRefreshed,
    /// The lock changed hands before the script ran: nothing was written.
    NotOwner,
}

/// Loads one activity into Redis (stock from the DB's remaining stock), idempotently, for the
/// holder `owner` of its lock. The caller read `activity` after taking the lock and recording
/// its fencing token (see [`crate::load`]).
pub async fn preheat(
    redis: &Redis,
    activity: &Activity,
    buffer: Duration,
    owner: &str,
) -> Result<PreheatOutcome, CacheError> {
    let k = redis.keys(activity.id);
    let mut inv = scripts::PREHEAT.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.users)
        .key(&k.ledger)
        .key(&k.lock)
        .arg(activity.remaining_stock)
        .arg(activity.total_stock)
        .arg(activity.start_at.timestamp_millis())
        .arg(activity.end_at.timestamp_millis())
        .arg(activity.per_order_limit)
        .arg(activity.config_version)
        .arg(activity.expire_at(buffer).timestamp_millis())
        .arg(owner)
        .arg(activity.load_epoch)
        .arg(&activity.title);
    let code: i64 = redis.script(&inv).await?;
    Ok(match code {
        0 => PreheatOutcome::AlreadyLoaded,
        1 => PreheatOutcome::Loaded,
        2 => PreheatOutcome::MetaRefreshed,
        3 => PreheatOutcome::NotOwner,
        other => return Err(scripts::unknown_answer("preheat.lua", other)),
    })
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
pub struct SaleMeta {
    /// Shown by the public view, which reads it from the meta ([`view`]).
    pub title: String,
    pub total: i64,
    pub per_order_limit: i64,
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    pub version: i64,
    /// When the sale's keys expire: end plus the expiry buffer.
    pub expire_at: DateTime<Utc>,
}

/// `lua/adjust.lua`: applies an admin change to a loaded sale, for the lock `owner` only:
/// the stock `delta` and the new `meta`, once per `change` id.
pub async fn adjust(
    redis: &Redis,
    activity_id: i64,
    owner: &str,
    delta: i64,
    meta: &SaleMeta,
    change: &str,
) -> Result<Adjust, CacheError> {
    let k = redis.keys(activity_id);
    let mut inv = scripts::ADJUST.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.lock)
        .key(&k.users)
        .key(&k.ledger)
        .arg(owner)
        .arg(delta)
        .arg(meta.total)
        .arg(meta.start_at.timestamp_millis())
        .arg(meta.end_at.timestamp_millis())
        .arg(meta.per_order_limit)
        .arg(meta.version)
        .arg(meta.expire_at.timestamp_millis())
        .arg(change)
        .arg(&meta.title);
    let (code, stock): (i64, i64) = redis.script(&inv).await?;
    Ok(match code {
        0 => Adjust::Applied,
        1 => Adjust::NotOwner,
        2 => Adjust::NotLoaded,
        3 => Adjust::WouldGoNegative { stock },
        other => return Err(scripts::unknown_answer("adjust.lua", other)),
    })
}

/// The config version Redis holds for the activity, `None` when it is not loaded.
pub async fn loaded_version(redis: &Redis, activity_id: i64) -> Result<Option<i64>, CacheError> {
    let k = redis.keys(activity_id);
    redis
        .cmd(redis::cmd("HGET").arg(&k.meta).arg("version"))
        .await
}

/// Whether `users` and the ledger both hold their [`SENTINEL`](crate::keys::SENTINEL) field,
/// as `lua/preheat.lua` leaves them: a sale loaded without them (or whose hash was lost) is
/// given them back by the next preheat.
pub async fn has_sentinels(redis: &Redis, activity_id: i64) -> Result<bool, CacheError> {
    let k = redis.keys(activity_id);
    for key in [&k.users, &k.ledger] {
        let there: bool = redis
            .cmd(redis::cmd("HEXISTS").arg(key).arg(crate::keys::SENTINEL))
            .await?;
        if !there {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `lua/rebuild_users.lua`: one chunk of `users` of a sale that is not loaded, for the lock
/// `owner`: each holder of a live order with its order's request id; the first chunk empties
/// `users` and the ledger first. Returns false when refused (not the owner, or the sale is
/// loaded).
pub async fn rebuild_users(
    redis: &Redis,
    activity_id: i64,
    owner: &str,
    first: bool,
    holders: &[(String, Uuid)],
) -> Result<bool, CacheError> {
    let k = redis.keys(activity_id);
    let mut inv = scripts::REBUILD_USERS.prepare_invoke();
    inv.key(&k.users)
        .key(&k.ledger)
        .key(&k.meta)
        .key(&k.lock)
        .arg(owner)
        .arg(if first { "first" } else { "more" });
    for (user, request_id) in holders {
        inv.arg(user).arg(request_id.to_string());
    }
    let done: i64 = redis.script(&inv).await?;
    scripts::flag("rebuild_users.lua", done)
}

/// `lua/mark_users.lua`: marks the candidates of an orphan check; returns those marked.
pub async fn mark_users(
    redis: &Redis,
    activity_id: i64,
    token: &str,
    now_ms: i64,
    users: &[String],
) -> Result<Vec<String>, CacheError> {
    let k = redis.keys(activity_id);
    let mut inv = scripts::MARK_USERS.prepare_invoke();
    inv.key(&k.users).key(&k.ledger).arg(token).arg(now_ms);
    for u in users {
        inv.arg(u);
    }
    redis.script(&inv).await
}

/// `lua/drop_user.lua`: ends an orphan check of `user`: removes the mark `token` and, when
/// `drop`, the user, both only while the mark is still there. Returns whether the user went.
pub async fn drop_user(
    redis: &Redis,
    activity_id: i64,
    user: &str,
    token: &str,
    drop: bool,
) -> Result<bool, CacheError> {
    let k = redis.keys(activity_id);
    let mut inv = scripts::DROP_USER.prepare_invoke();
    inv.key(&k.users)
        .key(&k.ledger)
        .arg(user)
        .arg(token)
        .arg(if drop { "drop" } else { "keep" });
    let removed: i64 = redis.script(&inv).await?;
    scripts::flag("drop_user.lua", removed)
}

/// `lua/fix_stock.lua`: sets the stock to `target` only for the lock `owner`, with the ledger
/// empty and the stock sequence still `observed_seq`.
pub async fn fix_stock(
    redis: &Redis,
    activity_id: i64,
    owner: &str,
    observed_seq: i64,
    target: i64,
) -> Result<bool, CacheError> {
    let k = redis.keys(activity_id);
    let mut inv = scripts::FIX_STOCK.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.ledger)
        .key(&k.lock)
        .arg(owner)
        .arg(observed_seq)
        .arg(target);
    let fixed: i64 = redis.script(&inv).await?;
    scripts::flag("fix_stock.lua", fixed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_a_wrapper_does_not_know_is_an_error_not_an_outcome() {
        assert!(matches!(scripts::flag("settle.lua", 0), Ok(false)));
        assert!(matches!(scripts::flag("settle.lua", 1), Ok(true)));
        let e = scripts::flag("settle.lua", 2).unwrap_err();
        assert!(e.to_string().contains("settle.lua answered 2"), "{e}");
    }

    #[test]
    fn ledger_entries_parse_both_kinds() {
        let r =
            LedgerEntry::parse("alice", "r|6f1c1a2e-0000-4000-8000-000000000001|2|1700").unwrap();
        assert_eq!(r.kind, EntryKind::Reservation);
        assert_eq!(r.quantity, 2);
        assert!(r.request_id().is_some());
        let c =
            LedgerEntry::parse("bob", "c|6f1c1a2e-0000-4000-8000-000000000002|1|1800|17").unwrap();
        assert_eq!(
            (c.kind, c.order_id, c.at_ms),
            (EntryKind::Cancel, Some(17), 1800)
        );
        assert!(c.cancel_id().is_some() && c.request_id().is_none());
        let x = LedgerEntry::parse("carol", "x|tok|0|1900").unwrap();
        assert_eq!((x.kind, x.id.as_str()), (EntryKind::Check, "tok"));
        assert!(LedgerEntry::parse("x", "garbage").is_none());
    }
}
