//! The consumer's decision on an order message: each message is a reservation Redis granted,
//! and its fate is decided once, by the database's `request_id` key
//! ([`crate::protocol::giveback`]). A row already there is applied; a reservation missing from
//! the ledger is claimed `reservation_expired`; otherwise one transaction inserts the order
//! and takes the stock (under the message's load epoch), and a business refusal gives the
//! units back through the arbiter. [`commit_group`] writes many messages of one sale in one
//! statement when that commits exactly what [`decide`] would. A draw's entry messages are
//! kept, not ordered ([`keep_entries`]). Every step is safe to repeat.
//! docs/invariants.md, "Consumer: an order message".

use crate::domain::activity;
use crate::domain::draw::{self as kept, Entry};
use crate::domain::order::{self, Order};
use crate::domain::purchase::{MessageKind, OrderMessage};
use crate::domain::status::FailureReason;
use crate::infra::{db, pause};
use crate::protocol::giveback::{self, GiveBack, GiveBackError};
use crate::store::conn::{Redis, StoreError};
use crate::store::draw::{self as pool, Restore, RestoreCursor};
use crate::store::keys::Home;
use crate::store::ledger::{self, Compensation};
use crate::store::values::LedgerEntry;
use sqlx::PgPool;
use std::collections::{BTreeMap, HashSet};
use uuid::Uuid;

/// What the database decided for one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The order is in the database and the ledger entry dropped.
    Committed,
    /// A row for this request already existed (an earlier delivery, a give-back, a
    /// concurrent delivery that committed first): its decision was applied, nothing else done.
    Duplicate,
    /// The request is recorded `failed` for this reason: `reservation_expired` (the
    /// reservation was not in the ledger, or Redis lost the sale since), `sold_out` (the
    /// database had less stock than Redis), `already_purchased` (the user holds another
    /// order; stock given back, the field kept), or `unknown_activity` (no such sale; nothing
    /// recorded, the reservation given back).
    Failed(FailureReason),
    /// A draw sale's entry, kept in the database (or found kept, or claimed after a 503), and
    /// its pool entry made sure of.
    Entered,
}

impl Decision {
    /// The name logs and metrics give it.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Committed => "committed",
            Decision::Duplicate => "duplicate",
            Decision::Failed(why) => why.as_str(),
            Decision::Entered => "entered",
        }
    }
}

/// One message's decision, and whether this call gave units back to Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decided {
    pub decision: Decision,
    pub compensated: bool,
}

impl Decided {
    fn new(decision: Decision, compensated: bool) -> Self {
        Self {
            decision,
            compensated,
        }
    }
}

/// The database or Redis could not be reached in time (or failed unexpectedly): the message
/// is redelivered, and every step it repeats is idempotent.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    GiveBack(#[from] GiveBackError),
}

/// Decides one parsed order message. Safe to call any number of times for the same message,
/// also concurrently.
pub async fn decide(
    pool: &PgPool,
    redis: &Redis,
    m: &OrderMessage,
) -> Result<Decided, DecideError> {
    if m.kind == MessageKind::Entry {
        keep_entries(pool, redis, m.attempt.activity_id, &[m]).await?;
        return Ok(Decided::new(Decision::Entered, false));
    }
    // An earlier delivery or a give-back decided: apply that decision, nothing else.
    if let Some(row) = order::by_request(pool, m.attempt.request_id).await? {
        return applied(redis, m, &row).await;
    }

    // A reservation that is not in the ledger was never granted, or Redis lost it (a restart
    // with no data, or keys expired long after the sale): its units are not held in Redis, so
    // committing would sell them twice. It fails. This read is a shortcut, not a guard: what
    // holds is the claim (the order insert below) against every give-back, and the load epoch
    // in the stock update against a Redis that lost the entry after this read.
    let entry = ledger::entry(redis, m.home(), &m.attempt.user_id).await?;
    if entry.and_then(|e| e.request_id()) != Some(m.attempt.request_id) {
        return refuse(pool, redis, m, FailureReason::ReservationExpired).await;
    }

    // The order transaction; its insert is the claim.
    pause::point("consumer.before_write", m.attempt.activity_id).await;
    match write_order(pool, m).await? {
        Decision::Committed => {
            settle(redis, m).await;
            Ok(Decided::new(Decision::Committed, false))
        }
        Decision::Duplicate => match order::by_request(pool, m.attempt.request_id).await? {
            Some(row) => applied(redis, m, &row).await,
            None => Err(DecideError::Db(sqlx::Error::RowNotFound)),
        },
        Decision::Failed(FailureReason::UnknownActivity) => {
            let a = &m.attempt;
            let mode = Compensation::Full;
            let given = ledger::compensate(redis, m.home(), &a.user_id, a.request_id, mode).await?;
            let decision = Decision::Failed(FailureReason::UnknownActivity);
            Ok(Decided::new(decision, given.is_some()))
        }
        Decision::Failed(why) => refuse(pool, redis, m, why).await,
        Decision::Entered => unreachable!("the order transaction keeps no entry"),
    }
}

/// A row for the request exists: apply it (a `failed` row's units go back, once).
async fn applied(redis: &Redis, m: &OrderMessage, row: &Order) -> Result<Decided, DecideError> {
    let given_back = giveback::apply(redis, row).await?;
    tracing::debug!(request_id = %m.attempt.request_id, status = %row.status, "already decided");
    Ok(Decided::new(Decision::Duplicate, given_back.is_some()))
}

/// One transaction: the order row, then the conditional stock update. Answers
/// [`Decision::Committed`], [`Decision::Duplicate`] (a concurrent delivery or a give-back
/// claimed the request first) or the reason it failed, with nothing written.
///
/// The insert comes first for two reasons: the unique indexes classify a refusal before
/// stock is looked at (a user who already holds an order gets a stock-only compensation even
/// when the database is also sold out, so Redis keeps them in the user set), and the hot
/// activity row is locked only for the update and the commit.
async fn write_order(pool: &PgPool, m: &OrderMessage) -> Result<Decision, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let inserted = order::insert_confirmed(&mut tx, &m.attempt).await;
    if let Err(e) = inserted {
        // Dropping `tx` rolls back.
        return if db::is_unique_violation(&e, "orders_request_id_key") {
            Ok(Decision::Duplicate)
        } else if db::is_unique_violation(&e, "orders_one_per_user") {
            Ok(Decision::Failed(FailureReason::AlreadyPurchased))
        } else if db::is_foreign_key_violation(&e) {
            Ok(Decision::Failed(FailureReason::UnknownActivity))
        } else {
            Err(e)
        };
    }
    let a = &m.attempt;
    let left = activity::take_stock(&mut tx, a.activity_id, a.quantity, m.load_epoch).await?;
    if left.is_none() {
        // The foreign key proved the activity exists: it is sold out in the database, or
        // Redis lost this reservation and loaded the sale again since (its units are in the
        // reloaded stock, so the order must not take them again).
        let epoch = activity::load_epoch(&mut *tx, a.activity_id)
            .await?
            .ok_or(sqlx::Error::RowNotFound)?;
        tx.rollback().await?;
        if m.load_epoch.is_some_and(|e| e != epoch) {
            return Ok(Decision::Failed(FailureReason::ReservationExpired));
        }
        return Ok(Decision::Failed(FailureReason::SoldOut));
    }
    // A commit that fails with the connection lost may or may not have applied: the
    // redelivery finds the row (duplicate) or retries, both correct.
    tx.commit().await?;
    Ok(Decision::Committed)
}

/// The request fails with `why`: give the reservation back through the arbiter (claim the
/// request as failed; only the winner compensates Redis). If Redis is out of reach the
/// message is retried, and the redelivery finds the `failed` row and applies it.
async fn refuse(
    pool: &PgPool,
    redis: &Redis,
    m: &OrderMessage,
    why: FailureReason,
) -> Result<Decided, DecideError> {
    let done = giveback::give_back(pool, redis, &m.attempt, why).await?;
    if why != FailureReason::ReservationExpired {
        pause::point("consumer.after_give_back", m.attempt.activity_id).await;
    }
    Ok(match done {
        GiveBack::GivenBack(units) => Decided::new(Decision::Failed(why), units.is_some()),
        GiveBack::Decided(_) => Decided::new(Decision::Duplicate, false),
        GiveBack::UnknownActivity(units) => Decided::new(
            Decision::Failed(FailureReason::UnknownActivity),
            units.is_some(),
        ),
    })
}

/// Drops the reservation's ledger entry once the database holds the outcome. A failure is
/// only logged: reconcile drops entries whose order exists.
async fn settle(redis: &Redis, m: &OrderMessage) {
    let id = m.attempt.request_id.to_string();
    if let Err(e) = ledger::settle(redis, m.home(), &m.attempt.user_id, &id).await {
        tracing::warn!(
            request_id = %m.attempt.request_id,
            activity_id = m.attempt.activity_id,
            error = %e,
            "could not drop the ledger entry; reconcile will"
        );
    }
}

/// Keeps the draw entries `messages` of sale `activity_id` in the database, in one
/// transaction (an entry claimed after a 503 is not kept), then makes sure each live one is in
/// the pool (`lua/pool_restore.lua`, which adds only to a user with no field there: a sale
/// Redis lost and loaded again before the row was written gets the entry back). A sale Redis
/// does not hold gets nothing: its load rebuilds the pool from the rows.
pub async fn keep_entries(
    pool: &PgPool,
    redis: &Redis,
    activity_id: i64,
    messages: &[&OrderMessage],
) -> Result<(), DecideError> {
    let entries: Vec<Entry> = messages
        .iter()
        .map(|m| Entry {
            request_id: m.attempt.request_id,
            user_id: m.attempt.user_id.clone(),
            quantity: m.attempt.quantity,
        })
        .collect();
    let mut tx = pool.begin().await?;
    let live = match kept::insert_entries(&mut tx, activity_id, &entries).await {
        Ok(live) => live,
        // An entry of a sale the database does not hold: nothing to keep.
        Err(e) if db::is_foreign_key_violation(&e) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    tx.commit().await?;
    // Kept, its pool entry not yet made sure of: a load from scratch now reads the row.
    pause::point("consumer.entry.after_commit", activity_id).await;
    let live: Vec<Entry> = entries
        .into_iter()
        .filter(|e| live.contains(&e.request_id))
        .collect();
    if !live.is_empty() {
        let (kind, cursor) = (Restore::Entries, RestoreCursor::None);
        let restored = pool::restore(redis, activity_id, None, kind, cursor, &live).await?;
        // Back too late for the draw: kept so, for a later rebuild of the pool.
        if let Some(late) = restored.filter(|r| !r.late.is_empty()) {
            kept::mark_late(pool, activity_id, &late.late).await?;
        }
    }
    Ok(())
}

/// The batch path for `messages` of one sale: one statement in its own transaction (one
/// multi-row insert and one aggregated conditional stock update, `confirm_orders`) instead of
/// one transaction (and one turn on the hot activity row) per order. Returns the positions in
/// `messages` of those it committed; the caller decides the rest one by one with [`decide`].
///
/// It commits only what [`decide`] would have committed: messages whose reservation is in the
/// ledger and with no row yet (the insert skips request ids someone claimed meanwhile), one
/// per user, when the database has stock for all of them and no one-per-user conflict.
/// Anything else (a unique violation, not enough stock for the whole group, an error) rolls
/// the whole group back and leaves it to the one-by-one path, which decides each message on
/// its own.
pub async fn commit_group(
    pool: &PgPool,
    redis: &Redis,
    messages: &[&OrderMessage],
) -> HashSet<usize> {
    if messages.len() < 2 {
        return HashSet::new();
    }
    let activity_id = messages[0].attempt.activity_id;
    // One message per user: a second request of the same user, or the same message twice,
    // is left to the one-by-one path.
    let mut users = HashSet::new();
    let candidates: Vec<(usize, &OrderMessage)> = messages
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, m)| users.insert(m.attempt.user_id.as_str()))
        .collect();
    // The reservation must be in the ledger, exactly as in `decide`: one HMGET per home
    // bucket (one for a sale with one bucket).
    let read: Vec<&OrderMessage> = candidates.iter().map(|(_, m)| *m).collect();
    let entries = match ledger_entries(redis, &read).await {
        Ok(v) => v,
        Err(e) => {
            tracing::debug!(activity_id, error = %e, "batch path skipped: ledger unreadable");
            return HashSet::new();
        }
    };
    let mut held: Vec<(usize, &OrderMessage)> = candidates
        .into_iter()
        .zip(entries)
        .filter(|((_, m), entry)| {
            let a = &m.attempt;
            let entry = entry
                .as_deref()
                .and_then(|v| LedgerEntry::parse(&a.user_id, v));
            entry.and_then(|e| e.request_id()) == Some(a.request_id)
        })
        .map(|(held, _)| held)
        .collect();
    if held.len() < 2 {
        return HashSet::new();
    }
    // A stable lock order (by user) between concurrent batches of the same activity.
    held.sort_by(|a, b| a.1.attempt.user_id.cmp(&b.1.attempt.user_id));
    let group: Vec<&OrderMessage> = held.iter().map(|(_, m)| *m).collect();
    // The ledger read, the statement not yet run: a give-back may claim one of the group now.
    pause::point("consumer.batch.before_write", activity_id).await;
    let inserted = match write_group(pool, activity_id, &group).await {
        Ok(Some(inserted)) => inserted,
        Ok(None) => {
            tracing::debug!(activity_id, size = held.len(), "batch path fell back");
            return HashSet::new();
        }
        Err(e) => {
            tracing::debug!(activity_id, error = %e, "batch path failed; falling back");
            return HashSet::new();
        }
    };
    // Rows that already existed were not inserted: the one-by-one path finds them and applies
    // what they say.
    let committed: Vec<(usize, &OrderMessage)> = held
        .into_iter()
        .filter(|(_, m)| inserted.contains(&m.attempt.request_id))
        .collect();
    futures::future::join_all(committed.iter().map(|(_, m)| settle(redis, m))).await;
    committed.into_iter().map(|(i, _)| i).collect()
}

/// Each message's ledger entry in its home bucket, in the messages' order.
async fn ledger_entries(
    redis: &Redis,
    messages: &[&OrderMessage],
) -> Result<Vec<Option<String>>, StoreError> {
    let mut by_home: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, m) in messages.iter().enumerate() {
        by_home.entry(m.home().index).or_default().push(i);
    }
    let mut entries = vec![None; messages.len()];
    for at in by_home.into_values() {
        let home = messages[at[0]].home();
        let mut hmget = redis::cmd("HMGET");
        hmget.arg(redis.bucket_keys(home).ledger);
        for &i in &at {
            hmget.arg(&messages[i].attempt.user_id);
        }
        let found: Vec<Option<String>> = redis.cmd(&hmget).await?;
        for (i, entry) in at.into_iter().zip(found) {
            entries[i] = entry;
        }
    }
    Ok(entries)
}

/// The batch statement ([`order::confirm_batch`]): the group's rows and their units in one
/// round trip and one transaction. `Ok(None)`: it rolled back, the group goes one by one.
async fn write_group(
    pool: &PgPool,
    activity_id: i64,
    messages: &[&OrderMessage],
) -> Result<Option<HashSet<Uuid>>, sqlx::Error> {
    // One epoch per statement; a group that spans a reload goes one by one.
    let epoch = messages[0].load_epoch;
    if messages.iter().any(|m| m.load_epoch != epoch) {
        return Ok(None);
    }
    let request_ids: Vec<Uuid> = messages.iter().map(|m| m.attempt.request_id).collect();
    let users: Vec<String> = messages.iter().map(|m| m.attempt.user_id.clone()).collect();
    let quantities: Vec<i64> = messages.iter().map(|m| m.attempt.quantity).collect();
    let confirmed =
        order::confirm_batch(pool, activity_id, epoch, &request_ids, &users, &quantities).await;
    match confirmed {
        Ok(inserted) => Ok(Some(inserted.into_iter().collect())),
        // Short stock or a moved epoch, a second order of a user, an unknown sale: nothing
        // committed, and each message's own decision tells which.
        Err(e)
            if order::is_short_stock(&e)
                || db::is_unique_violation(&e, "orders_one_per_user")
                || db::is_foreign_key_violation(&e) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}
