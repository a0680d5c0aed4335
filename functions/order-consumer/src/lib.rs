//! order-consumer: turns the order messages `seckill-entry` sends into rows of the system of
//! record.
//!
//! Each message stands for a reservation Redis already granted (stock taken, user added,
//! ledger entry `r|<requestId>|qty|ms` written). Its fate is decided once, by the database's
//! `request_id` unique key (`seckill_shared::giveback`, `docs/invariants.md`):
//!
//! 1. **Decided already** (a row with the request id exists, whatever its status): apply what
//!    it says and ack. A live row drops the ledger entry; a `failed` row means someone claimed
//!    the reservation to give it back (the entry after a failed send, reconcile after the
//!    grace period, an earlier delivery), so its units go back, guarded by the ledger entry,
//!    in case that actor crashed before doing it.
//! 2. **No reservation** in the ledger (never granted, or lost with a Redis restart): claim
//!    the request as `failed / reservation_expired` and ack. Its units are not held in Redis,
//!    so committing would sell them twice.
//! 3. Otherwise one transaction: insert the order, then `remaining_stock - q where
//!    remaining_stock >= q`. After commit, drop the ledger entry. The insert is the claim: if
//!    anyone claimed the request meanwhile it fails as a duplicate, and step 1 applies.
//!    The ledger read of step 2 is no guard against that: it may be stale by the time the
//!    transaction commits; the claim is what holds. The stock update also requires the sale's
//!    load epoch to be the message's: if Redis lost the sale and loaded it again meanwhile, the
//!    reservation's units are in the reloaded stock and the request fails
//!    `reservation_expired` instead.
//! 4. **Business refusals** roll back and give the reservation back through the arbiter: claim
//!    the request as `failed`, and only if this delivery won, compensate Redis: sold out ->
//!    full compensation; the user already holds another order -> stock only.
//! 5. Anything transient (database or Redis out of reach, timeouts) reports the message in
//!    `batchItemFailures`: SQS redelivers it, and after `maxReceiveCount` moves it to the DLQ.
//!    Malformed messages are reported the same way, so they end in the DLQ for a human.
//!
//! Every step is safe to repeat, which is what lets a redelivery arrive at any moment.
//!
//! **Batch fast path.** One hot activity row serialises every order transaction on it, so
//! one transaction per order is bounded by that row. [`Consumer::handle_batch`] first tries,
//! per activity, one transaction for the whole batch (a multi-row insert from `unnest` plus
//! one aggregated conditional stock update). It only commits what the per-message path
//! would have committed; whenever the aggregate cannot apply (not enough stock for all, a
//! one-per-user conflict, any error) it rolls back and the messages go one by one.

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use futures::StreamExt;
use seckill_shared::cache::{CacheError, Redis};
use seckill_shared::config::Config;
use seckill_shared::giveback::{self, GiveBack};
use seckill_shared::order::{self, reason, Order};
use seckill_shared::queue::OrderMessage;
use seckill_shared::sale::{self, Compensation, LedgerEntry};
use seckill_shared::Deps;
use seckill_shared::{activity, db};
use sqlx::PgPool;
use std::collections::{BTreeMap, HashSet};
use uuid::Uuid;

/// The function name used in metrics.
pub const FUNCTION: &str = "order-consumer";

/// What became of one message that was acked (or, for [`Outcome::Malformed`], sent on its
/// way to the DLQ).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The order is in the database and the ledger entry dropped.
    Committed,
    /// A row for this request already existed: its decision was applied, nothing else done.
    Duplicate,
    /// The reservation was not in the ledger (never granted, or lost with Redis); recorded
    /// as `reservation_expired`.
    Expired,
    /// The database had less stock than Redis; compensated in full, recorded as `sold_out`.
    SoldOut,
    /// The user already holds another order; stock given back, recorded as `already_purchased`.
    AlreadyPurchased,
    /// The activity does not exist in the database; the reservation was given back.
    UnknownActivity,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Committed => "committed",
            Outcome::Duplicate => "duplicate",
            Outcome::Expired => "reservation_expired",
            Outcome::SoldOut => "sold_out",
            Outcome::AlreadyPurchased => "already_purchased",
            Outcome::UnknownActivity => "unknown_activity",
        }
    }
}

/// One message's result: its outcome, and whether this call gave units back to Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Processed {
    pub outcome: Outcome,
    pub compensated: bool,
}

impl Processed {
    fn new(outcome: Outcome, compensated: bool) -> Self {
        Self {
            outcome,
            compensated,
        }
    }
}

/// Why a message was not acked. Both put its id in `batchItemFailures`.
#[derive(Debug, thiserror::Error)]
pub enum ConsumeError {
    /// The body is not an order message; retrying cannot help, so it ends in the DLQ.
    #[error("malformed order message: {0}")]
    Malformed(String),
    /// The database or Redis could not be reached in time (or failed unexpectedly); the
    /// message is redelivered and every step it repeats is idempotent.
    #[error("retryable failure: {0:#}")]
    Retryable(anyhow::Error),
}

impl From<sqlx::Error> for ConsumeError {
    fn from(e: sqlx::Error) -> Self {
        ConsumeError::Retryable(anyhow::Error::new(e))
    }
}

impl From<CacheError> for ConsumeError {
    fn from(e: CacheError) -> Self {
        ConsumeError::Retryable(anyhow::Error::new(e))
    }
}

/// What the order transaction decided.
enum TxOutcome {
    Committed,
    /// Redis lost the reservation and loaded the sale from scratch since: its units are in
    /// the reloaded stock, so the order must not take them again.
    Reloaded,
    /// A concurrent delivery of the same message committed first.
    Duplicate,
    SoldOut,
    AlreadyPurchased,
    UnknownActivity,
}

/// The consumer's dependencies, built once per container and shared by every batch.
#[derive(Clone)]
pub struct Consumer {
    /// Config, pool and Redis (`self.pool`, `self.config`, `self.redis` read through it).
    deps: Deps,
    /// Whether batches take the one-transaction-per-activity fast path (on by default).
    batch_writes: bool,
}

impl std::ops::Deref for Consumer {
    type Target = Deps;

    fn deref(&self) -> &Deps {
        &self.deps
    }
}

/// Per-batch counters, emitted once as one metrics line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BatchStats {
    pub committed: u32,
    pub duplicates: u32,
    pub compensations: u32,
    /// Requests recorded as `failed` (sold out, already purchased, expired, unknown activity).
    pub failed: u32,
    /// Messages reported for redelivery because of a transient error.
    pub retried: u32,
    /// Messages reported because they cannot be parsed (they end in the DLQ).
    pub malformed: u32,
    /// Of `committed`, how many went through the batch fast path.
    pub batched: u32,
}

impl Consumer {
    pub fn new(deps: Deps) -> Self {
        Self {
            deps,
            batch_writes: true,
        }
    }

    /// Turns the batch fast path on or off. Off: one transaction per message, the baseline
    /// the benchmark compares against and the reference the tests compare with.
    pub fn with_batch_writes(mut self, on: bool) -> Self {
        self.batch_writes = on;
        self
    }

    /// Builds the consumer from the config. The pool is lazy and small (`db_max_connections`):
    /// a cold start never fails because the database is briefly away, and
    /// `MaximumConcurrency × db_max_connections` bounds what the database sees.
    pub async fn connect(config: Config) -> anyhow::Result<Self> {
        Ok(Self::new(Deps::connect(config).await?))
    }

    pub fn pool(&self) -> &PgPool {
        &self.deps.pool
    }

    pub fn redis(&self) -> &Redis {
        &self.deps.redis
    }

    /// Handles one SQS batch and answers with the ids of the messages to redeliver (partial
    /// batch failure). After the batch fast path, the remaining messages are processed
    /// concurrently, at most one per pooled connection; each one's outcome depends only on the
    /// database and its own ledger entry, so the order in which they finish does not matter.
    /// Emits one metrics line for the batch.
    pub async fn handle_batch(&self, event: SqsEvent) -> SqsBatchResponse {
        let (response, stats) = self.handle_batch_with_stats(event).await;
        seckill_shared::metrics::emit(
            FUNCTION,
            &[
                ("Committed", stats.committed as f64),
                ("Duplicates", stats.duplicates as f64),
                ("Compensations", stats.compensations as f64),
                ("Failed", stats.failed as f64),
                ("Retried", stats.retried as f64),
                ("Malformed", stats.malformed as f64),
                ("Batched", stats.batched as f64),
            ],
            &[],
        );
        response
    }

    /// [`Consumer::handle_batch`] without the metrics line, returning the counters as well.
    pub async fn handle_batch_with_stats(&self, event: SqsEvent) -> (SqsBatchResponse, BatchStats) {
        let mut results: Vec<(Option<String>, Result<Processed, ConsumeError>)> = Vec::new();
        let mut pending = Vec::with_capacity(event.records.len());
        for record in event.records {
            match parse(record.body.as_deref()) {
                Ok(m) => pending.push(Item {
                    message_id: record.message_id,
                    message: m,
                }),
                Err(e) => {
                    tracing::error!(
                        message_id = record.message_id.as_deref().unwrap_or("-"),
                        error = %e,
                        outcome = "malformed",
                        "order message rejected"
                    );
                    results.push((record.message_id, Err(e)));
                }
            }
        }

        let mut stats = BatchStats::default();
        if self.batch_writes {
            let (committed, rest) = self.write_batches(pending).await;
            stats.batched = committed.len() as u32;
            for item in committed {
                let result = Ok(Processed::new(Outcome::Committed, false));
                log_result(&item, &result, "batch");
                results.push((item.message_id, result));
            }
            pending = rest;
        }

        // What the batch path did not commit goes one by one: every case is decided there.
        let concurrency = self.config.db_max_connections.max(1) as usize;
        let one_by_one: Vec<(Option<String>, Result<Processed, ConsumeError>)> =
            futures::stream::iter(pending)
                .map(|item| async move {
                    let result = self.handle_message(&item.message).await;
                    log_result(&item, &result, "single");
                    (item.message_id, result)
                })
                .buffer_unordered(concurrency)
                .collect()
                .await;
        results.extend(one_by_one);

        let mut response = SqsBatchResponse::default();
        for (message_id, result) in results {
            match result {
                Ok(p) => {
                    stats.compensations += u32::from(p.compensated);
                    match p.outcome {
                        Outcome::Committed => stats.committed += 1,
                        Outcome::Duplicate => stats.duplicates += 1,
                        _ => stats.failed += 1,
                    }
                }
                Err(e) => {
                    match e {
                        ConsumeError::Malformed(_) => stats.malformed += 1,
                        ConsumeError::Retryable(_) => stats.retried += 1,
                    }
                    match message_id {
                        Some(id) => response.add_failure(id),
                        // Without an id SQS cannot be told; unacked, the message comes back
                        // after the visibility timeout anyway.
                        None => tracing::error!(error = %e, "failed message has no messageId"),
                    }
                }
            }
        }
        (response, stats)
    }

    /// The batch fast path: per activity, one transaction with one multi-row insert and one
    /// aggregated conditional stock update, instead of one transaction (and one turn on the
    /// hot activity row) per order. Returns the messages it committed and the rest, which
    /// the per-message path handles.
    ///
    /// It only commits what the per-message path would have committed: messages whose
    /// reservation is in the ledger and with no row yet (the insert skips request ids someone
    /// claimed meanwhile), one per user, when the database has stock for all of them and no
    /// one-per-user conflict. Anything else (a unique
    /// violation, not enough stock for the whole group, an error) rolls the whole group back
    /// and leaves it to the per-message path, which decides each message on its own.
    async fn write_batches(&self, items: Vec<Item>) -> (Vec<Item>, Vec<Item>) {
        let mut groups: BTreeMap<i64, Vec<Item>> = BTreeMap::new();
        for item in items {
            groups
                .entry(item.message.activity_id)
                .or_default()
                .push(item);
        }
        let outcomes =
            futures::future::join_all(groups.into_values().map(|g| self.write_group(g))).await;
        let mut committed = Vec::new();
        let mut rest = Vec::new();
        for (c, r) in outcomes {
            committed.extend(c);
            rest.extend(r);
        }
        (committed, rest)
    }

    async fn write_group(&self, group: Vec<Item>) -> (Vec<Item>, Vec<Item>) {
        if group.len() < 2 {
            return (Vec::new(), group);
        }
        let activity_id = group[0].message.activity_id;
        // One message per user: a second request of the same user, or the same message twice,
        // is left to the per-message path.
        let mut users = HashSet::new();
        let (candidates, mut rest): (Vec<Item>, Vec<Item>) = group
            .into_iter()
            .partition(|item| users.insert(item.message.user_id.clone()));

        // The reservation must be in the ledger, exactly as in the per-message path: one
        // HMGET per home bucket (one for a sale with one bucket).
        let entries = match self.ledger_entries(&candidates).await {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(activity_id, error = %e, "batch path skipped: ledger unreadable");
                rest.extend(candidates);
                return (Vec::new(), rest);
            }
        };
        let mut held = Vec::with_capacity(candidates.len());
        for (item, entry) in candidates.into_iter().zip(entries) {
            let request = entry
                .and_then(|v| LedgerEntry::parse(&item.message.user_id, &v))
                .and_then(|e| e.request_id());
            if request == Some(item.message.request_id) {
                held.push(item);
            } else {
                rest.push(item);
            }
        }
        if held.len() < 2 {
            rest.extend(held);
            return (Vec::new(), rest);
        }

        // A stable lock order (by user) between concurrent batches of the same activity.
        held.sort_by(|a, b| a.message.user_id.cmp(&b.message.user_id));
        let messages: Vec<&OrderMessage> = held.iter().map(|i| &i.message).collect();
        let inserted = match self.write_group_tx(activity_id, &messages).await {
            Ok(Some(inserted)) => inserted,
            Ok(None) => {
                tracing::debug!(activity_id, size = held.len(), "batch path fell back");
                rest.extend(held);
                return (Vec::new(), rest);
            }
            Err(e) => {
                tracing::debug!(activity_id, error = %e, "batch path failed; falling back");
                rest.extend(held);
                return (Vec::new(), rest);
            }
        };
        // Rows that already existed were not inserted: the per-message path finds them and
        // applies what they say.
        let (committed, existing): (Vec<Item>, Vec<Item>) = held
            .into_iter()
            .partition(|i| inserted.contains(&i.message.request_id));
        rest.extend(existing);
        futures::future::join_all(committed.iter().map(|i| self.settle(&i.message))).await;
        (committed, rest)
    }

    /// Each item's ledger entry in its home bucket, in the items' order.
    async fn ledger_entries(&self, items: &[Item]) -> Result<Vec<Option<String>>, CacheError> {
        let mut by_home: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (i, item) in items.iter().enumerate() {
            by_home
                .entry(item.message.home().index)
                .or_default()
                .push(i);
        }
        let mut entries = vec![None; items.len()];
        for at in by_home.into_values() {
            let home = items[at[0]].message.home();
            let mut hmget = redis::cmd("HMGET");
            hmget.arg(self.redis.bucket_keys(home).ledger);
            for &i in &at {
                hmget.arg(&items[i].message.user_id);
            }
            let found: Vec<Option<String>> = self.redis.cmd(&hmget).await?;
            for (i, entry) in at.into_iter().zip(found) {
                entries[i] = entry;
            }
        }
        Ok(entries)
    }

    /// The batch transaction. `Ok(None)`: rolled back, the group goes one by one.
    async fn write_group_tx(
        &self,
        activity_id: i64,
        messages: &[&OrderMessage],
    ) -> Result<Option<HashSet<Uuid>>, sqlx::Error> {
        // One epoch per transaction; a group that spans a reload goes one by one.
        let epoch = messages[0].load_epoch;
        if messages.iter().any(|m| m.load_epoch != epoch) {
            return Ok(None);
        }
        let request_ids: Vec<Uuid> = messages.iter().map(|m| m.request_id).collect();
        let users: Vec<String> = messages.iter().map(|m| m.user_id.clone()).collect();
        let quantities: Vec<i32> = messages.iter().map(|m| m.quantity).collect();
        let mut tx = self.pool.begin().await?;
        let inserted =
            order::insert_confirmed_batch(&mut tx, activity_id, &request_ids, &users, &quantities)
                .await;
        let inserted = match inserted {
            Ok(rows) => rows,
            Err(e)
                if db::is_unique_violation(&e, "orders_one_per_user")
                    || db::is_foreign_key_violation(&e) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        if inserted.is_empty() {
            tx.rollback().await?;
            return Ok(Some(HashSet::new()));
        }
        let units: i64 = inserted.iter().map(|(_, q)| i64::from(*q)).sum();
        let left = activity::take_stock(&mut tx, activity_id, units, epoch).await?;
        if left.is_none() {
            tx.rollback().await?;
            return Ok(None);
        }
        tx.commit().await?;
        Ok(Some(inserted.into_iter().map(|(r, _)| r).collect()))
    }

    /// Processes one parsed order message. Returns the outcome and whether this call gave
    /// units back to Redis. Safe to call any number of times for the same message, also
    /// concurrently.
    pub async fn handle_message(&self, m: &OrderMessage) -> Result<Processed, ConsumeError> {
        // 1. An earlier delivery or a give-back decided: apply that decision, nothing else.
        if let Some(row) = order::by_request(&self.pool, m.request_id).await? {
            return self.decided(m, &row).await;
        }

        // 2. A reservation that is not in the ledger was never granted, or Redis lost it (a
        //    restart with no data, or keys expired long after the sale): its units are not
        //    held in Redis, so committing would sell them twice. It fails. This read is a
        //    shortcut, not a guard: what holds is the claim (the order insert below) against
        //    every give-back, and the load epoch in the stock update against a Redis that lost
        //    the entry after this read.
        let entry = sale::ledger_entry(&self.redis, m.home(), &m.user_id).await?;
        if entry.and_then(|e| e.request_id()) != Some(m.request_id) {
            return self.expired(m).await;
        }

        // 3. The order transaction; its insert is the claim.
        seckill_shared::pause::point("consumer.before_write", m.activity_id).await;
        match self.write_order(m).await? {
            TxOutcome::Committed => {
                self.settle(m).await;
                Ok(Processed::new(Outcome::Committed, false))
            }
            TxOutcome::Duplicate => match order::by_request(&self.pool, m.request_id).await? {
                Some(row) => self.decided(m, &row).await,
                None => Err(ConsumeError::Retryable(anyhow::anyhow!(
                    "request {} conflicted but has no row",
                    m.request_id
                ))),
            },
            TxOutcome::SoldOut => self.refuse(m, reason::SOLD_OUT).await,
            TxOutcome::Reloaded => self.expired(m).await,
            TxOutcome::AlreadyPurchased => self.refuse(m, reason::ALREADY_PURCHASED).await,
            TxOutcome::UnknownActivity => {
                let given_back = self.compensate(m, Compensation::Full).await?;
                Ok(Processed::new(Outcome::UnknownActivity, given_back))
            }
        }
    }

    /// No reservation in the ledger: claim the request as `reservation_expired`.
    async fn expired(&self, m: &OrderMessage) -> Result<Processed, ConsumeError> {
        let why = reason::RESERVATION_EXPIRED;
        match giveback::give_back(&self.pool, &self.redis, m, why)
            .await
            .map_err(|e| ConsumeError::Retryable(e.into()))?
        {
            GiveBack::GivenBack(units) => Ok(Processed::new(Outcome::Expired, units.is_some())),
            GiveBack::Decided(_) => Ok(Processed::new(Outcome::Duplicate, false)),
            GiveBack::UnknownActivity(units) => {
                Ok(Processed::new(Outcome::UnknownActivity, units.is_some()))
            }
        }
    }

    /// A row for the request exists: apply it (a `failed` row's units go back, once).
    async fn decided(&self, m: &OrderMessage, row: &Order) -> Result<Processed, ConsumeError> {
        let given_back = giveback::apply(&self.redis, row).await?;
        tracing::debug!(request_id = %m.request_id, status = %row.status, "already decided");
        Ok(Processed::new(Outcome::Duplicate, given_back.is_some()))
    }

    /// One transaction: the order row, then the conditional stock update.
    ///
    /// The insert comes first for two reasons: the unique indexes classify a refusal before
    /// stock is looked at (a user who already holds an order gets a stock-only compensation
    /// even when the database is also sold out, so Redis keeps them in the user set), and
    /// the hot activity row is locked only for the update and the commit.
    async fn write_order(&self, m: &OrderMessage) -> Result<TxOutcome, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let inserted = order::insert_confirmed(&mut tx, m).await;
        if let Err(e) = inserted {
            // Dropping `tx` rolls back.
            return if db::is_unique_violation(&e, "orders_request_id_key") {
                Ok(TxOutcome::Duplicate)
            } else if db::is_unique_violation(&e, "orders_one_per_user") {
                Ok(TxOutcome::AlreadyPurchased)
            } else if db::is_foreign_key_violation(&e) {
                Ok(TxOutcome::UnknownActivity)
            } else {
                Err(e)
            };
        }
        let left =
            activity::take_stock(&mut tx, m.activity_id, i64::from(m.quantity), m.load_epoch)
                .await?;
        if left.is_none() {
            // The foreign key proved the activity exists: it is sold out in the database, or
            // Redis lost this reservation and loaded the sale again since.
            let epoch = activity::load_epoch(&mut *tx, m.activity_id)
                .await?
                .ok_or(sqlx::Error::RowNotFound)?;
            tx.rollback().await?;
            if m.load_epoch.is_some_and(|e| e != epoch) {
                return Ok(TxOutcome::Reloaded);
            }
            return Ok(TxOutcome::SoldOut);
        }
        // A commit that fails with the connection lost may or may not have applied: the
        // redelivery finds the row (duplicate) or retries, both correct.
        tx.commit().await?;
        Ok(TxOutcome::Committed)
    }

    /// A business refusal: give the reservation back through the arbiter (claim the request
    /// as failed; only the winner compensates Redis), then ack. If Redis is out of reach the
    /// message is retried, and the redelivery finds the `failed` row and applies it.
    async fn refuse(&self, m: &OrderMessage, why: &'static str) -> Result<Processed, ConsumeError> {
        let done = giveback::give_back(&self.pool, &self.redis, m, why)
            .await
            .map_err(|e| ConsumeError::Retryable(e.into()))?;
        seckill_shared::pause::point("consumer.after_give_back", m.activity_id).await;
        let outcome = if why == reason::SOLD_OUT {
            Outcome::SoldOut
        } else {
            Outcome::AlreadyPurchased
        };
        Ok(match done {
            GiveBack::GivenBack(units) => Processed::new(outcome, units.is_some()),
            GiveBack::Decided(_) => Processed::new(Outcome::Duplicate, false),
            GiveBack::UnknownActivity(units) => {
                Processed::new(Outcome::UnknownActivity, units.is_some())
            }
        })
    }

    async fn compensate(&self, m: &OrderMessage, mode: Compensation) -> Result<bool, CacheError> {
        let given = sale::compensate(&self.redis, m.home(), &m.user_id, m.request_id, mode).await?;
        Ok(given.is_some())
    }

    /// Drops the reservation's ledger entry once the database holds the outcome. A failure
    /// is only logged: reconcile drops entries whose order exists.
    async fn settle(&self, m: &OrderMessage) {
        let id = m.request_id.to_string();
        if let Err(e) = sale::settle(&self.redis, m.home(), &m.user_id, &id).await {
            tracing::warn!(
                request_id = %m.request_id,
                activity_id = m.activity_id,
                error = %e,
                "could not drop the ledger entry; reconcile will"
            );
        }
    }
}

/// A parsed message and the SQS id to report it by.
struct Item {
    message_id: Option<String>,
    message: OrderMessage,
}

/// The one log line per message.
fn log_result(item: &Item, result: &Result<Processed, ConsumeError>, path: &'static str) {
    let message_id = item.message_id.as_deref().unwrap_or("-");
    let m = &item.message;
    match result {
        Ok(p) => tracing::info!(
            message_id,
            request_id = %m.request_id,
            activity_id = m.activity_id,
            outcome = p.outcome.as_str(),
            compensated = p.compensated,
            path,
            "order message processed"
        ),
        Err(e) => tracing::warn!(
            message_id,
            request_id = %m.request_id,
            activity_id = m.activity_id,
            outcome = "retry",
            error = %e,
            path,
            "order message will be redelivered"
        ),
    }
}

/// Parses and checks one message body. The error says what is wrong without echoing the body.
pub fn parse(body: Option<&str>) -> Result<OrderMessage, ConsumeError> {
    let body = body.ok_or_else(|| ConsumeError::Malformed("message has no body".into()))?;
    let m: OrderMessage =
        serde_json::from_str(body).map_err(|e| ConsumeError::Malformed(e.to_string()))?;
    if m.quantity <= 0 {
        return Err(ConsumeError::Malformed(format!(
            "quantity must be positive, got {}",
            m.quantity
        )));
    }
    if m.activity_id <= 0 {
        return Err(ConsumeError::Malformed(format!(
            "activityId must be positive, got {}",
            m.activity_id
        )));
    }
    if m.user_id.trim().is_empty() {
        return Err(ConsumeError::Malformed("userId is empty".into()));
    }
    if m.request_id == Uuid::nil() {
        return Err(ConsumeError::Malformed("requestId is the nil uuid".into()));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_accepts_the_entry_functions_message() {
        let body = r#"{"requestId":"0f6a3e2b-8c1d-4b7e-a9f2-3d5c7e9b1a20","activityId":1,"userId":"alice","quantity":1,"reservedAtMs":1}"#;
        let m = parse(Some(body)).unwrap();
        assert_eq!(
            (m.activity_id, m.user_id.as_str(), m.quantity),
            (1, "alice", 1)
        );
    }

    #[test]
    fn parse_rejects_every_kind_of_bad_body() {
        let ok = r#""requestId":"0f6a3e2b-8c1d-4b7e-a9f2-3d5c7e9b1a20","reservedAtMs":1"#;
        for body in [
            "not json".to_string(),
            "{}".to_string(),
            format!(r#"{{{ok},"activityId":1,"userId":"a","quantity":0}}"#),
            format!(r#"{{{ok},"activityId":1,"userId":"a","quantity":-2}}"#),
            format!(r#"{{{ok},"activityId":0,"userId":"a","quantity":1}}"#),
            format!(r#"{{{ok},"activityId":1,"userId":"  ","quantity":1}}"#),
            format!(r#"{{{ok},"activityId":1,"userId":"a","quantity":"1"}}"#),
            format!(r#"{{{ok},"activityId":1,"userId":"a","quantity":1,"extra":1}}"#),
        ] {
            assert!(
                matches!(parse(Some(&body)), Err(ConsumeError::Malformed(_))),
                "{body}"
            );
        }
        assert!(matches!(parse(None), Err(ConsumeError::Malformed(_))));
    }
}
