//! Typed calls of the sale's Lua scripts: purchase, compensation, settle, cancel, preheat,
//! snapshot. Each is one atomic script on the activity's hash-tagged keys. Also the plain reads
//! of a loaded sale: its stock, its public view, its ledger entries.

use crate::activity::Activity;
use crate::cache::{CacheError, Redis};
use crate::keys::Bucket;
use crate::refusal::Refusal;
use crate::scripts;
use chrono::{DateTime, Utc};
use std::collections::HashSet;
use std::time::Duration;
use uuid::Uuid;

/// A purchase `purchase.lua` made: stock decremented, user added, reservation recorded in the
/// ledger (of the user's home bucket).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// Units left after this one (in the home bucket).
    pub stock_left: i64,
    /// The Redis server's clock when the script ran: the reservation's time.
    pub now_ms: i64,
    /// The sale's load epoch, for the order message.
    pub epoch: i64,
    /// The sale's bucket count the reservation was made under, for the order message.
    pub buckets: u32,
}

/// Units [`borrow`] took from another bucket, for the home bucket's purchase to add to its
/// stock (once per id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credit {
    /// The bucket the units came from.
    pub donor: Bucket,
    pub id: Uuid,
    pub units: i64,
    pub epoch: i64,
}

/// What `purchase.lua` answered in one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Accepted(Reservation),
    Refused(Refusal),
    /// The sale has this many buckets, not the caller's count: ask the right home bucket.
    Layout(u32),
    /// A bucketed sale's home bucket holds only `stock` units, fewer than asked, and the user
    /// is free to buy: borrow from the other buckets and ask again.
    Short {
        stock: i64,
    },
    /// A draw sale's window is open: the user is in its pool, with this arrival rank (from 1).
    Queued {
        rank: i64,
    },
    /// A draw sale's window has closed and its draw has not run: run it and ask again.
    DrawDue,
}

/// Runs the purchase script in one bucket for one user and quantity, adding `credits` to the
/// bucket's stock first. `deadline_ms` is on the Redis server's clock: a script that only gets
/// to run after it refuses ([`Refusal::Expired`]), so a caller that timed out and answered 503
/// leaves nothing behind. [`far_deadline`] never expires. The flag: every credit is in the
/// bucket's stock (now or before), so the donors' ledger entries can go.
pub async fn purchase_script(
    redis: &Redis,
    home: Bucket,
    user_id: &str,
    quantity: i64,
    request_id: Uuid,
    deadline_ms: i64,
    credits: &[Credit],
) -> Result<(Decision, bool), CacheError> {
    let k = redis.bucket_keys(home);
    let mut inv = scripts::PURCHASE.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.users)
        .key(&k.ledger)
        .key(&k.pool)
        .key(k.rate(user_id))
        .arg(user_id)
        .arg(quantity)
        .arg(request_id.to_string())
        .arg(deadline_ms)
        .arg(home.count);
    for c in credits {
        inv.arg(c.id.to_string()).arg(c.units).arg(c.epoch);
    }
    let (code, stock, now_ms, epoch, credited): (i64, i64, i64, i64, i64) =
        redis.script(&inv).await?;
    let decision = match code {
        0 => Decision::Accepted(Reservation {
            stock_left: stock,
            now_ms,
            epoch,
            buckets: home.count,
        }),
        8 => Decision::Layout(u32::try_from(stock).unwrap_or(1).max(1)),
        9 => Decision::Short { stock },
        10 => Decision::Queued { rank: stock },
        11 => Decision::DrawDue,
        _ => match Refusal::from_script(code, stock, now_ms) {
            Some(refusal) => Decision::Refused(refusal),
            None => return Err(scripts::unknown_answer("purchase.lua", code)),
        },
    };
    Ok((decision, credited == 1))
}

/// Buys for one user in a sale with one bucket, or in a bucketed one whose count is learnt
/// from bucket 0 (one more round trip): see [`crate::buckets::purchase`].
pub async fn purchase(
    redis: &Redis,
    activity_id: i64,
    user_id: &str,
    quantity: i64,
    request_id: Uuid,
    deadline_ms: i64,
) -> Result<Result<Reservation, Refusal>, CacheError> {
    let buy = crate::buckets::Purchase {
        activity_id,
        user_id,
        quantity,
        request_id,
        deadline_ms,
    };
    crate::buckets::purchase(redis, &buy, &mut 1).await
}

/// `lua/borrow.lua`: takes units from `donor` for a purchase in `home` that is short of
/// `need`, under the transfer id `id`. `None`: nothing there (empty, not loaded, or another
/// layout).
pub async fn borrow(
    redis: &Redis,
    donor: Bucket,
    home: Bucket,
    id: Uuid,
    need: i64,
) -> Result<Option<Credit>, CacheError> {
    let k = redis.bucket_keys(donor);
    let mut inv = scripts::BORROW.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.ledger)
        .arg(id.to_string())
        .arg(need)
        .arg(home.index)
        .arg(donor.count);
    let (units, epoch): (i64, i64) = redis.script(&inv).await?;
    Ok((units > 0).then_some(Credit {
        donor,
        id,
        units,
        epoch,
    }))
}

/// What `lua/credit.lua` answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Credited {
    Now,
    Before,
    /// The home bucket is not loaded: a load from scratch is under way or due.
    NotLoaded,
    /// The home bucket was loaded again since the units were taken.
    OtherEpoch,
}

/// `lua/credit.lua`: puts a transfer's units into its home bucket, once.
pub async fn credit(
    redis: &Redis,
    home: Bucket,
    id: Uuid,
    units: i64,
    epoch: i64,
) -> Result<Credited, CacheError> {
    let k = redis.bucket_keys(home);
    let mut inv = scripts::CREDIT.prepare_invoke();
    inv.key(&k.meta).arg(id.to_string()).arg(units).arg(epoch);
    Ok(match redis.script::<i64>(&inv).await? {
        1 => Credited::Now,
        2 => Credited::Before,
        0 => Credited::NotLoaded,
        3 => Credited::OtherEpoch,
        other => return Err(scripts::unknown_answer("credit.lua", other)),
    })
}

/// `lua/unload.lua`: removes one bucket's meta for the lock `owner`. False: not the owner.
pub async fn unload(redis: &Redis, at: Bucket, owner: &str) -> Result<bool, CacheError> {
    let k = redis.bucket_keys(at);
    let mut inv = scripts::UNLOAD.prepare_invoke();
    inv.key(&k.meta).key(&k.lock).arg(owner);
    let done: i64 = redis.script(&inv).await?;
    scripts::flag("unload.lua", done)
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
    at: impl Into<Bucket>,
    user_id: &str,
    request_id: Uuid,
    mode: Compensation,
) -> Result<Option<i64>, CacheError> {
    let k = redis.bucket_keys(at.into());
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
    at: impl Into<Bucket>,
    user_id: &str,
    id: &str,
) -> Result<bool, CacheError> {
    let k = redis.bucket_keys(at.into());
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
    /// The sale's bucket count: with the user it names the home bucket the cancel runs in.
    pub buckets: u32,
    pub user_id: &'a str,
    pub order_id: i64,
    /// The order's request id: its own reservation entry may give way to the cancel.
    pub request_id: Uuid,
    pub quantity: i64,
    /// This attempt's id; the order row records it when the attempt commits.
    pub cancel_id: Uuid,
}

impl CancelAttempt<'_> {
    /// The bucket holding the user's quota and ledger entries.
    pub fn home(&self) -> Bucket {
        Bucket::home(self.activity_id, self.buckets, self.user_id)
    }
}

/// Announces a cancel attempt in the ledger (`c|<cancelId>|qty|ms|<orderId>`). Returns what
/// the script answered and the sale's load epoch, which the database commit must still find.
pub async fn cancel_begin(
    redis: &Redis,
    attempt: &CancelAttempt<'_>,
    now_ms: i64,
) -> Result<(CancelBegin, i64), CacheError> {
    let k = redis.bucket_keys(attempt.home());
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
    at: impl Into<Bucket>,
    user_id: &str,
    cancel_id: Uuid,
) -> Result<Option<i64>, CacheError> {
    let k = redis.bucket_keys(at.into());
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
    /// `t|<transferId>|qty|ms|<homeIndex>|<epoch>` under a [`crate::keys::transfer_field`]:
    /// units taken from this bucket for a purchase in another (`lua/borrow.lua`), not yet
    /// known to be there.
    Transfer,
}

/// One in-flight entry of the ledger, keyed by user (or, for a transfer, by its field).
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
    /// A transfer's home bucket index and the load epoch it was taken in.
    pub transfer: Option<(u32, i64)>,
}

impl LedgerEntry {
    pub fn parse(user_id: &str, value: &str) -> Option<Self> {
        let mut parts = value.split('|');
        let kind = match parts.next()? {
            "r" => EntryKind::Reservation,
            "c" => EntryKind::Cancel,
            "x" => EntryKind::Check,
            "t" => EntryKind::Transfer,
            _ => return None,
        };
        let id = parts.next()?.to_string();
        let quantity = parts.next()?.parse().ok()?;
        let at_ms = parts.next()?.parse().ok()?;
        let order_id = match kind {
            EntryKind::Cancel => Some(parts.next()?.parse().ok()?),
            _ => None,
        };
        let transfer = match kind {
            EntryKind::Transfer => Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?)),
            _ => None,
        };
        Some(Self {
            user_id: user_id.to_string(),
            kind,
            id,
            quantity,
            at_ms,
            order_id,
            transfer,
        })
    }

    /// The reservation's request id, when this is a reservation.
    pub fn request_id(&self) -> Option<Uuid> {
        (self.kind == EntryKind::Reservation)
            .then(|| self.id.parse().ok())
            .flatten()
    }

    /// The transfer's id, when this is a transfer.
    pub fn transfer_id(&self) -> Option<Uuid> {
        (self.kind == EntryKind::Transfer)
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
    at: impl Into<Bucket>,
    user_id: &str,
) -> Result<Option<LedgerEntry>, CacheError> {
    let k = redis.bucket_keys(at.into());
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
    /// Request ids in a draw sale's outbox: reservations whose order message is still to be
    /// sent, which no grace period makes stale.
    pub unsent: HashSet<String>,
}

impl Snapshot {
    /// Whether the reservation `request_id` waits in the outbox for its order message.
    pub fn is_unsent(&self, request_id: &str) -> bool {
        self.unsent.contains(request_id)
    }

    pub fn pending_quantity(&self) -> i64 {
        self.ledger
            .iter()
            .filter(|e| e.kind == EntryKind::Reservation)
            .map(|e| e.quantity)
            .sum()
    }

    /// Units taken from this bucket for another, not yet known to be there.
    pub fn transfer_quantity(&self) -> i64 {
        self.ledger
            .iter()
            .filter(|e| e.kind == EntryKind::Transfer)
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

pub async fn snapshot(redis: &Redis, at: impl Into<Bucket>) -> Result<Snapshot, CacheError> {
    let k = redis.bucket_keys(at.into());
    let mut inv = scripts::SNAPSHOT.prepare_invoke();
    inv.key(&k.meta).key(&k.users).key(&k.ledger).key(&k.outbox);
    type Answer = (i64, i64, i64, Vec<String>, i64, HashSet<String>);
    let (loaded, stock, participants, flat, seq, unsent): Answer = redis.script(&inv).await?;
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
        unsent,
    })
}

/// Units left in Redis, `None` when the activity is not loaded.
pub async fn stock(redis: &Redis, at: impl Into<Bucket>) -> Result<Option<i64>, CacheError> {
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
}

/// The meta fields the public view reads: title, startMs, endMs, stock, buckets.
type ViewFields = (
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<u32>,
);

/// The public view of a loaded sale: one HMGET of its meta (the stock is a field of it), and
/// in a bucketed sale one HGET of each other bucket's stock. `None` when Redis does not hold
/// the whole view: the sale is not loaded (before preheat, after its keys expired), or its
/// meta was written before the meta carried the title.
pub async fn view(redis: &Redis, activity_id: i64) -> Result<Option<SaleView>, CacheError> {
    let k = redis.keys(activity_id);
    let mut cmd = redis::cmd("HMGET");
    cmd.arg(&k.meta)
        .arg("title")
        .arg("startMs")
        .arg("endMs")
        .arg("stock")
        .arg("buckets");
    let (title, start_ms, end_ms, stock, buckets): ViewFields = redis.cmd(&cmd).await?;
    let (Some(title), Some(start_ms), Some(end_ms), Some(mut stock)) =
        (title, start_ms, end_ms, stock)
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
/// holder `owner` of its lock: every bucket of its layout, each with its share of the stock
/// (`lua/preheat.lua` per bucket; a bucket already loaded keeps its stock). The caller read
/// `activity` after taking the lock and recording its fencing token (see [`crate::load`]).
/// The outcome is the whole sale's: `NotOwner` if any bucket refused, else `Loaded` if any
/// bucket was loaded now, else `MetaRefreshed` if any meta was, else `AlreadyLoaded`.
pub async fn preheat(
    redis: &Redis,
    activity: &Activity,
    buffer: Duration,
    owner: &str,
) -> Result<PreheatOutcome, CacheError> {
    let count = activity.bucket_count();
    let shares = crate::buckets::split(i64::from(activity.remaining_stock), count);
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
) -> Result<PreheatOutcome, CacheError> {
    let k = redis.bucket_keys(bucket);
    let mut inv = scripts::PREHEAT.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.users)
        .key(&k.ledger)
        .key(&k.lock)
        .key(&k.pool)
        .key(&k.outbox)
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
        .arg(activity.per_user_rate_per_sec);
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
    /// When a draw sale's pool closes (ms since 1970; 0: first come, first served).
    pub draw_end_ms: i64,
    /// Purchase attempts per user and second (0: no limit).
    pub rate: i64,
}

/// `lua/adjust.lua`: applies an admin change to a loaded sale, for the lock `owner` only:
/// the stock `delta` and the new `meta`, once per `change` id.
pub async fn adjust(
    redis: &Redis,
    at: impl Into<Bucket>,
    owner: &str,
    delta: i64,
    meta: &SaleMeta,
    change: &str,
) -> Result<Adjust, CacheError> {
    let k = redis.bucket_keys(at.into());
    let mut inv = scripts::ADJUST.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.lock)
        .key(&k.users)
        .key(&k.ledger)
        .key(&k.pool)
        .key(&k.outbox)
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
        .arg(meta.rate);
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
pub async fn loaded_version(
    redis: &Redis,
    at: impl Into<Bucket>,
) -> Result<Option<i64>, CacheError> {
    let k = redis.bucket_keys(at.into());
    redis
        .cmd(redis::cmd("HGET").arg(&k.meta).arg("version"))
        .await
}

/// Whether `users` and the ledger both hold their [`SENTINEL`](crate::keys::SENTINEL) field,
/// as `lua/preheat.lua` leaves them: a sale loaded without them (or whose hash was lost) is
/// given them back by the next preheat.
pub async fn has_sentinels(redis: &Redis, at: impl Into<Bucket>) -> Result<bool, CacheError> {
    let k = redis.bucket_keys(at.into());
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
    at: impl Into<Bucket>,
    owner: &str,
    first: bool,
    holders: &[(String, Uuid)],
) -> Result<bool, CacheError> {
    let k = redis.bucket_keys(at.into());
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
    at: impl Into<Bucket>,
    token: &str,
    now_ms: i64,
    users: &[String],
) -> Result<Vec<String>, CacheError> {
    let k = redis.bucket_keys(at.into());
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
    at: impl Into<Bucket>,
    user: &str,
    token: &str,
    drop: bool,
) -> Result<bool, CacheError> {
    let k = redis.bucket_keys(at.into());
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
    at: impl Into<Bucket>,
    owner: &str,
    observed_seq: i64,
    target: i64,
) -> Result<bool, CacheError> {
    let k = redis.bucket_keys(at.into());
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
        let t = LedgerEntry::parse(
            " transfer:6f1c1a2e-0000-4000-8000-000000000003",
            "t|6f1c1a2e-0000-4000-8000-000000000003|4|2000|2|7",
        )
        .unwrap();
        assert_eq!(
            (t.kind, t.quantity, t.transfer),
            (EntryKind::Transfer, 4, Some((2, 7)))
        );
        assert!(t.transfer_id().is_some() && t.request_id().is_none());
        assert!(LedgerEntry::parse("x", "garbage").is_none());
    }
}
