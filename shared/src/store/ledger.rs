//! The ledger of entries in flight between Redis and the database, and the scripts that end
//! them: `lua/give_back.lua` (a reservation's or a committed cancel's units back, once),
//! `lua/settle.lua` (an entry dropped once the database holds its outcome), and
//! `lua/snapshot.lua` (a sale's state read in one step). docs/invariants.md, "The state".

use super::conn::{Redis, StoreError};
use super::keys::Bucket;
use super::scripts::{self, codes};
use super::values::{EntryKind, LedgerEntry};
use std::collections::HashSet;
use uuid::Uuid;

/// How much of a reservation a give-back returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compensation {
    /// Stock back and the user removed: the purchase never happened.
    Full,
    /// Stock back only: the user already holds another order and keeps it.
    StockOnly,
}

codes! {
    /// `lua/give_back.lua`'s reply codes.
    pub enum GiveBackCode of "give_back.lua" {
        NotThere = 0,
        GivenBack = 1,
    }
}

/// `lua/give_back.lua` for the entry of `kind` carrying `id`: the units back (and, for
/// [`Compensation::Full`], the user out of `users`), at most once. The quantity given back,
/// `None` when the ledger no longer holds that entry.
async fn give_back(
    redis: &Redis,
    at: Bucket,
    user_id: &str,
    id: Uuid,
    kind: EntryKind,
    mode: Compensation,
) -> Result<Option<i64>, StoreError> {
    let k = redis.bucket_keys(at);
    let mut inv = scripts::GIVE_BACK.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.users)
        .key(&k.ledger)
        .arg(user_id)
        .arg(id.to_string())
        .arg(kind.letter())
        .arg(match mode {
            Compensation::Full => "full",
            Compensation::StockOnly => "stock",
        });
    let (code, qty): (i64, i64) = redis.script(&inv).await?;
    Ok((GiveBackCode::read(code)? == GiveBackCode::GivenBack).then_some(qty))
}

/// Gives a reservation back, at most once. Returns the quantity given back, or `None` when
/// the ledger no longer holds this request (already settled or compensated).
pub async fn compensate(
    redis: &Redis,
    at: impl Into<Bucket>,
    user_id: &str,
    request_id: Uuid,
    mode: Compensation,
) -> Result<Option<i64>, StoreError> {
    give_back(
        redis,
        at.into(),
        user_id,
        request_id,
        EntryKind::Reservation,
        mode,
    )
    .await
}

/// Gives a cancelled order's units and quota back, at most once, for the attempt `cancel_id`
/// (the one the order row recorded). Returns the quantity.
pub async fn cancel_finish(
    redis: &Redis,
    at: impl Into<Bucket>,
    user_id: &str,
    cancel_id: Uuid,
) -> Result<Option<i64>, StoreError> {
    give_back(
        redis,
        at.into(),
        user_id,
        cancel_id,
        EntryKind::Cancel,
        Compensation::Full,
    )
    .await
}

codes! {
    /// `lua/settle.lua`'s reply codes.
    pub enum SettleCode of "settle.lua" {
        NotThere = 0,
        Dropped = 1,
    }
}

/// Drops the ledger entry carrying `id` (a request id, a cancel id, a check token or a
/// transfer id) once the database holds the outcome. Returns whether an entry was dropped.
pub async fn settle(
    redis: &Redis,
    at: impl Into<Bucket>,
    user_id: &str,
    id: &str,
) -> Result<bool, StoreError> {
    let k = redis.bucket_keys(at.into());
    let mut inv = scripts::SETTLE.prepare_invoke();
    inv.key(&k.ledger).arg(user_id).arg(id);
    Ok(SettleCode::read(redis.script(&inv).await?)? == SettleCode::Dropped)
}

/// The user's ledger entry, if any.
pub async fn entry(
    redis: &Redis,
    at: impl Into<Bucket>,
    user_id: &str,
) -> Result<Option<LedgerEntry>, StoreError> {
    let k = redis.bucket_keys(at.into());
    let value: Option<String> = redis
        .cmd(redis::cmd("HGET").arg(&k.ledger).arg(user_id))
        .await?;
    Ok(value.and_then(|v| LedgerEntry::parse(user_id, &v)))
}

/// A bucket's Redis state, read atomically.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub loaded: bool,
    /// `None` when the meta holds no stock (the sale is not loaded).
    pub stock: Option<i64>,
    /// Users holding a reservation, an order or a cancel in flight (the sentinel not counted).
    pub participants: i64,
    /// The entries: read with the rest in one step up to [`LEDGER_INLINE`] of them. Beyond
    /// that, [`snapshot`] reads them after it in chunks (then a script that ran between the
    /// chunks may show in them or not; `ledger_size` and everything else are of the one step)
    /// and [`head`] not at all (`complete` false).
    pub ledger: Vec<LedgerEntry>,
    /// Whether `ledger` holds every entry.
    pub complete: bool,
    /// How many entries the ledger held at the step (the sentinel not counted).
    pub ledger_size: i64,
    /// The stock sequence: bumped by every script that moves the stock.
    pub seq: i64,
    /// A draw sale whose winners' orders are not all written yet: its reservations are the
    /// drawer's to settle, and no grace period makes them stale.
    pub held: bool,
}

impl Snapshot {
    /// Whether the ledger held no entry at the step: nothing in flight in this bucket.
    pub fn quiet(&self) -> bool {
        self.ledger_size == 0
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

/// The most ledger entries `lua/snapshot.lua` reads in its one step; a larger ledger is read
/// in chunks of this size, each one bounded call.
pub const LEDGER_INLINE: usize = 1000;

/// `lua/snapshot.lua`: one bucket's state in one step, and a ledger larger than
/// [`LEDGER_INLINE`] entries read after it in chunks: for a look at the whole (the admin's
/// stats, tests), never on a path that runs for every sale on a schedule.
pub async fn snapshot(redis: &Redis, at: impl Into<Bucket>) -> Result<Snapshot, StoreError> {
    let at = at.into();
    let mut snap = head(redis, at).await?;
    fill(redis, at, &mut snap).await?;
    Ok(snap)
}

/// Makes a [`head`] of bucket `at` whole: a ledger too large for its one step read in chunks.
pub async fn fill(redis: &Redis, at: Bucket, snap: &mut Snapshot) -> Result<(), StoreError> {
    if !snap.complete {
        let k = redis.bucket_keys(at);
        snap.ledger = parse_flat(&scan_ledger(redis, &k.ledger).await?);
        snap.complete = true;
    }
    Ok(())
}

/// `lua/snapshot.lua` alone: one bucket's state in one step, its ledger's entries only when
/// there are at most [`LEDGER_INLINE`] of them (else `complete` is false and `ledger` empty;
/// [`scan_entries`] reads them a chunk at a time). One bounded call whatever the ledger holds.
pub async fn head(redis: &Redis, at: impl Into<Bucket>) -> Result<Snapshot, StoreError> {
    let k = redis.bucket_keys(at.into());
    let mut inv = scripts::SNAPSHOT.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.users)
        .key(&k.ledger)
        .arg(LEDGER_INLINE);
    type Reply = (i64, i64, i64, Vec<String>, i64, i64, i64);
    let (loaded, stock, participants, flat, seq, held, ledger_size): Reply =
        redis.script(&inv).await?;
    Ok(Snapshot {
        loaded: loaded == 1,
        stock: (stock >= 0).then_some(stock),
        participants,
        ledger: parse_flat(&flat),
        complete: ledger_size as usize <= LEDGER_INLINE,
        ledger_size,
        seq,
        held: held == 1,
    })
}

/// Field, value, field, value... as entries, the sentinel and anything unreadable skipped.
fn parse_flat(flat: &[String]) -> Vec<LedgerEntry> {
    flat.chunks(2)
        .filter_map(|pair| match pair {
            [user, value] if !user.is_empty() => LedgerEntry::parse(user, value),
            _ => None,
        })
        .collect()
}

/// One `HSCAN` step of a bucket's ledger from `cursor` (about [`LEDGER_INLINE`] entries): the
/// next cursor ("0" at the end) and the entries. A walk may meet an entry twice.
pub async fn scan_entries(
    redis: &Redis,
    at: impl Into<Bucket>,
    cursor: &str,
) -> Result<(String, Vec<LedgerEntry>), StoreError> {
    let k = redis.bucket_keys(at.into());
    let (next, flat): (String, Vec<String>) = redis
        .cmd(
            redis::cmd("HSCAN")
                .arg(&k.ledger)
                .arg(cursor)
                .arg("COUNT")
                .arg(LEDGER_INLINE),
        )
        .await?;
    Ok((next, parse_flat(&flat)))
}

/// A whole ledger by `HSCAN`, [`LEDGER_INLINE`] fields a call, flat (field, value, ...), each
/// field once.
async fn scan_ledger(redis: &Redis, ledger: &str) -> Result<Vec<String>, StoreError> {
    let mut cursor = "0".to_string();
    let mut seen = HashSet::new();
    let mut flat = Vec::new();
    loop {
        let (next, batch): (String, Vec<String>) = redis
            .cmd(
                redis::cmd("HSCAN")
                    .arg(ledger)
                    .arg(&cursor)
                    .arg("COUNT")
                    .arg(LEDGER_INLINE),
            )
            .await?;
        let mut pairs = batch.into_iter();
        while let (Some(field), Some(value)) = (pairs.next(), pairs.next()) {
            // HSCAN may return a field more than once.
            if seen.insert(field.clone()) {
                flat.push(field);
                flat.push(value);
            }
        }
        if next == "0" {
            return Ok(flat);
        }
        cursor = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_a_wrapper_does_not_know_is_an_error_not_an_outcome() {
        assert!(matches!(SettleCode::read(0), Ok(SettleCode::NotThere)));
        assert!(matches!(SettleCode::read(1), Ok(SettleCode::Dropped)));
        let e = SettleCode::read(2).unwrap_err();
        assert!(e.to_string().contains("settle.lua answered 2"), "{e}");
    }
}
