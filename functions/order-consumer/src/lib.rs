//! order-consumer: turns the order messages `seckill-entry` sends into rows of the system of
//! record, one SQS batch at a time, reporting only the failed messages.
//!
//! Each message is a reservation Redis granted; its fate is decided once, by the database's
//! `request_id` key ([`seckill_shared::protocol::giveback`]): a row already there is applied, a
//! reservation missing from the ledger is claimed `reservation_expired`, otherwise one
//! transaction inserts the order and takes the stock (under the message's load epoch), and a
//! business refusal gives the units back through the arbiter. Anything transient is retried
//! by SQS. Every step is safe to repeat. The batch fast path ([`batch`]) writes a batch's
//! messages of one sale in one transaction. docs/invariants.md, "Consumer: an order message".

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use futures::StreamExt;
use seckill_shared::domain::activity;
use seckill_shared::domain::draw::{self as kept, Entry};
use seckill_shared::domain::order::{self, reason, Order};
use seckill_shared::domain::purchase::{MessageKind, OrderMessage};
use seckill_shared::infra::{db, metrics, pause};
use seckill_shared::protocol::giveback::{self, GiveBack};
use seckill_shared::store::conn::{Redis, StoreError};
use seckill_shared::store::draw::{self as pool, Restore, RestoreCursor};
use seckill_shared::store::keys::Home;
use seckill_shared::store::ledger::{self, Compensation};
use seckill_shared::{Config, Context};
use sqlx::PgPool;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;
use uuid::Uuid;

/// The function name used in metrics.
pub const FUNCTION: &str = "order-consumer";

/// How long before its invocation's deadline a batch stops: what has not finished by then is
/// reported for redelivery, so Lambda never kills an invocation mid-batch (its answer would be
/// lost, and the whole batch, committed messages too, would come back after the visibility
/// timeout). Stopping a message anywhere is what a crash there does, which every step
/// tolerates (docs/invariants.md, "Consumer: an order message"). docs/capacity.md, "Time
/// budgets", checks that the slowest message still fits after the slowest batch write.
pub const STOP_BEFORE_DEADLINE: Duration = Duration::from_secs(2);

mod batch;

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
    /// A draw sale's entry, kept in the database (or found kept, or claimed after a 503), and
    /// its pool entry made sure of.
    Entered,
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
            Outcome::Entered => "entered",
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

impl ConsumeError {
    /// The batch stopped before its invocation's deadline with this message unfinished or
    /// not started ([`STOP_BEFORE_DEADLINE`]).
    fn stopped() -> Self {
        ConsumeError::Retryable(anyhow::anyhow!(
            "the batch stopped before the invocation's deadline"
        ))
    }
}

/// The Lambda context's deadline (milliseconds since the Unix epoch) on this process's
/// monotonic clock, for [`Consumer::handle_batch_by`]. `None` for a deadline that is not in the
/// future: Lambda hands an invocation its deadline ahead of it, so such a value comes from a
/// runtime that sets none (`cargo lambda watch` sends a constant 600000, in 1970).
pub fn deadline_of(deadline_epoch_ms: u64) -> Option<Instant> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let left = deadline_epoch_ms.checked_sub(now_ms).filter(|ms| *ms > 0)?;
    Some(Instant::now() + Duration::from_millis(left))
}

/// `work` if it finishes before `stop` (and is started only before it); `None` otherwise,
/// `work` dropped wherever it was.
async fn before_stop<F: Future>(stop: Option<Instant>, work: F) -> Option<F::Output> {
    match stop {
        None => Some(work.await),
        Some(stop) if Instant::now() >= stop => None,
        Some(stop) => tokio::time::timeout_at(stop, work).await.ok(),
    }
}

impl From<sqlx::Error> for ConsumeError {
    fn from(e: sqlx::Error) -> Self {
        ConsumeError::Retryable(anyhow::Error::new(e))
    }
}

impl From<StoreError> for ConsumeError {
    fn from(e: StoreError) -> Self {
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

/// The consumer's clients, built once per container and shared by every batch.
#[derive(Clone)]
pub struct Consumer {
    config: Config,
    pool: PgPool,
    redis: Redis,
    /// Whether batches take the one-transaction-per-activity fast path (on by default).
    batch_writes: bool,
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
    /// Draw entries kept in the database.
    pub entered: u32,
}

impl Consumer {
    pub fn new(context: Context) -> Self {
        Self {
            config: context.config,
            pool: context.pool,
            redis: context.redis,
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
        Ok(Self::new(Context::connect(config).await?))
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn redis(&self) -> &Redis {
        &self.redis
    }

    /// Handles one SQS batch and answers with the ids of the messages to redeliver (partial
    /// batch failure). After the batch fast path, the remaining messages are processed
    /// concurrently, at most one per pooled connection; each one's outcome depends only on the
    /// database and its own ledger entry, so the order in which they finish does not matter.
    /// Emits one metrics line for the batch.
    pub async fn handle_batch(&self, event: SqsEvent) -> SqsBatchResponse {
        self.handle_batch_until(event, None).await
    }

    /// [`Consumer::handle_batch`] within an invocation that ends at `deadline` (the Lambda
    /// context's): the batch stops [`STOP_BEFORE_DEADLINE`] before it, and the messages not
    /// finished by then are reported for redelivery.
    pub async fn handle_batch_by(&self, event: SqsEvent, deadline: Instant) -> SqsBatchResponse {
        let stop = deadline
            .checked_sub(STOP_BEFORE_DEADLINE)
            .unwrap_or(deadline);
        self.handle_batch_until(event, Some(stop)).await
    }

    async fn handle_batch_until(&self, event: SqsEvent, stop: Option<Instant>) -> SqsBatchResponse {
        let (response, stats) = self.handle_batch_with_stats_until(event, stop).await;
        metrics::emit(
            FUNCTION,
            &[
                ("Committed", stats.committed as f64),
                ("Duplicates", stats.duplicates as f64),
                ("Compensations", stats.compensations as f64),
                ("Failed", stats.failed as f64),
                ("Retried", stats.retried as f64),
                ("Malformed", stats.malformed as f64),
                ("Batched", stats.batched as f64),
                ("Entered", stats.entered as f64),
            ],
            &[],
        );
        response
    }

    /// [`Consumer::handle_batch`] without the metrics line, returning the counters as well.
    pub async fn handle_batch_with_stats(&self, event: SqsEvent) -> (SqsBatchResponse, BatchStats) {
        self.handle_batch_with_stats_until(event, None).await
    }

    /// The batch, with no work done past `stop` (none: no bound).
    async fn handle_batch_with_stats_until(
        &self,
        event: SqsEvent,
        stop: Option<Instant>,
    ) -> (SqsBatchResponse, BatchStats) {
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
        // A draw's entries: one transaction per sale, then their pool entries made sure of.
        let (entries, rest): (Vec<Item>, Vec<Item>) = pending
            .into_iter()
            .partition(|i| i.message.kind == MessageKind::Entry);
        pending = rest;
        let mut by_sale: std::collections::BTreeMap<i64, Vec<Item>> = Default::default();
        for item in entries {
            by_sale
                .entry(item.message.attempt.activity_id)
                .or_default()
                .push(item);
        }
        for (activity_id, items) in by_sale {
            let messages: Vec<&OrderMessage> = items.iter().map(|i| &i.message).collect();
            let kept = before_stop(stop, self.keep_entries(activity_id, &messages))
                .await
                .unwrap_or_else(|| Err(ConsumeError::stopped()));
            for item in items {
                let result = match &kept {
                    Ok(()) => Ok(Processed::new(Outcome::Entered, false)),
                    Err(ConsumeError::Malformed(e)) => Err(ConsumeError::Malformed(e.clone())),
                    Err(ConsumeError::Retryable(e)) => {
                        Err(ConsumeError::Retryable(anyhow::anyhow!("{e:#}")))
                    }
                };
                log_result(&item, &result, "entries");
                results.push((item.message_id, result));
            }
        }
        if self.batch_writes {
            let ids: Vec<Option<String>> = pending.iter().map(|i| i.message_id.clone()).collect();
            match before_stop(stop, self.write_batches(pending)).await {
                Some((committed, rest)) => {
                    stats.batched = committed.len() as u32;
                    for item in committed {
                        let result = Ok(Processed::new(Outcome::Committed, false));
                        log_result(&item, &result, "batch");
                        results.push((item.message_id, result));
                    }
                    pending = rest;
                }
                // What the batch transactions committed comes back as duplicates.
                None => {
                    tracing::warn!(
                        messages = ids.len(),
                        "batch stopped before its deadline during the batch write"
                    );
                    results.extend(ids.into_iter().map(|id| (id, Err(ConsumeError::stopped()))));
                    pending = Vec::new();
                }
            }
        }

        // What the batch path did not commit goes one by one: every case is decided there.
        let concurrency = self.config.db_max_connections.max(1) as usize;
        let one_by_one: Vec<(Option<String>, Result<Processed, ConsumeError>)> =
            futures::stream::iter(pending)
                .map(|item| async move {
                    let result = before_stop(stop, self.handle_message(&item.message))
                        .await
                        .unwrap_or_else(|| Err(ConsumeError::stopped()));
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
                        Outcome::Entered => stats.entered += 1,
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

    /// Processes one parsed order message. Returns the outcome and whether this call gave
    /// units back to Redis. Safe to call any number of times for the same message, also
    /// concurrently.
    pub async fn handle_message(&self, m: &OrderMessage) -> Result<Processed, ConsumeError> {
        if m.kind == MessageKind::Entry {
            self.keep_entries(m.attempt.activity_id, &[m]).await?;
            return Ok(Processed::new(Outcome::Entered, false));
        }
        // 1. An earlier delivery or a give-back decided: apply that decision, nothing else.
        if let Some(row) = order::by_request(&self.pool, m.attempt.request_id).await? {
            return self.decided(m, &row).await;
        }

        // 2. A reservation that is not in the ledger was never granted, or Redis lost it (a
        //    restart with no data, or keys expired long after the sale): its units are not
        //    held in Redis, so committing would sell them twice. It fails. This read is a
        //    shortcut, not a guard: what holds is the claim (the order insert below) against
        //    every give-back, and the load epoch in the stock update against a Redis that lost
        //    the entry after this read.
        //    A draw's winner is held by the recorded outcome instead: a Redis that lost the
        //    sale loads it with the winner's units left out and its reservation put back.
        if m.kind != MessageKind::Winner {
            let entry = ledger::entry(&self.redis, m.home(), &m.attempt.user_id).await?;
            if entry.and_then(|e| e.request_id()) != Some(m.attempt.request_id) {
                return self.expired(m).await;
            }
        }

        // 3. The order transaction; its insert is the claim.
        pause::point("consumer.before_write", m.attempt.activity_id).await;
        match self.write_order(m).await? {
            TxOutcome::Committed => {
                self.settle(m).await;
                Ok(Processed::new(Outcome::Committed, false))
            }
            TxOutcome::Duplicate => {
                match order::by_request(&self.pool, m.attempt.request_id).await? {
                    Some(row) => self.decided(m, &row).await,
                    None => Err(ConsumeError::Retryable(anyhow::anyhow!(
                        "request {} conflicted but has no row",
                        m.attempt.request_id
                    ))),
                }
            }
            TxOutcome::SoldOut => self.refuse(m, reason::SOLD_OUT).await,
            TxOutcome::Reloaded => self.expired(m).await,
            TxOutcome::AlreadyPurchased => self.refuse(m, reason::ALREADY_PURCHASED).await,
            TxOutcome::UnknownActivity => {
                let given_back = self.compensate(m, Compensation::Full).await?;
                Ok(Processed::new(Outcome::UnknownActivity, given_back))
            }
        }
    }

    /// Keeps the draw entries `messages` of sale `activity_id` in the database, in one
    /// transaction (an entry claimed after a 503 is not kept), then makes sure each live one
    /// is in the pool (`lua/pool_restore.lua`, which adds only to a user with no field there:
    /// a sale Redis lost and loaded again before the row was written gets the entry back). A
    /// sale Redis does not hold gets nothing: its load rebuilds the pool from the rows.
    async fn keep_entries(
        &self,
        activity_id: i64,
        messages: &[&OrderMessage],
    ) -> Result<(), ConsumeError> {
        let entries: Vec<Entry> = messages
            .iter()
            .map(|m| Entry {
                request_id: m.attempt.request_id,
                user_id: m.attempt.user_id.clone(),
                quantity: m.attempt.quantity,
            })
            .collect();
        let mut tx = self.pool.begin().await?;
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
            pool::restore(
                &self.redis,
                activity_id,
                None,
                Restore::Entries,
                RestoreCursor::None,
                &live,
            )
            .await?;
        }
        Ok(())
    }

    /// No reservation in the ledger: claim the request as `reservation_expired`.
    async fn expired(&self, m: &OrderMessage) -> Result<Processed, ConsumeError> {
        let why = reason::RESERVATION_EXPIRED;
        match giveback::give_back(&self.pool, &self.redis, &m.attempt, why)
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
        tracing::debug!(request_id = %m.attempt.request_id, status = %row.status, "already decided");
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
        let inserted = order::insert_confirmed(&mut tx, &m.attempt).await;
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
        let left = activity::take_stock(
            &mut tx,
            m.attempt.activity_id,
            m.attempt.quantity,
            m.load_epoch,
        )
        .await?;
        if left.is_none() {
            // The foreign key proved the activity exists: it is sold out in the database, or
            // Redis lost this reservation and loaded the sale again since.
            let epoch = activity::load_epoch(&mut *tx, m.attempt.activity_id)
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
        let done = giveback::give_back(&self.pool, &self.redis, &m.attempt, why)
            .await
            .map_err(|e| ConsumeError::Retryable(e.into()))?;
        pause::point("consumer.after_give_back", m.attempt.activity_id).await;
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

    async fn compensate(&self, m: &OrderMessage, mode: Compensation) -> Result<bool, StoreError> {
        let a = &m.attempt;
        let given =
            ledger::compensate(&self.redis, m.home(), &a.user_id, a.request_id, mode).await?;
        Ok(given.is_some())
    }

    /// Drops the reservation's ledger entry once the database holds the outcome. A failure
    /// is only logged: reconcile drops entries whose order exists.
    async fn settle(&self, m: &OrderMessage) {
        let id = m.attempt.request_id.to_string();
        if let Err(e) = ledger::settle(&self.redis, m.home(), &m.attempt.user_id, &id).await {
            tracing::warn!(
                request_id = %m.attempt.request_id,
                activity_id = m.attempt.activity_id,
                error = %e,
                "could not drop the ledger entry; reconcile will"
            );
        }
    }
}

/// A parsed message and the SQS id to report it by.
pub(crate) struct Item {
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
            request_id = %m.attempt.request_id,
            activity_id = m.attempt.activity_id,
            outcome = p.outcome.as_str(),
            compensated = p.compensated,
            path,
            "order message processed"
        ),
        Err(e) => tracing::warn!(
            message_id,
            request_id = %m.attempt.request_id,
            activity_id = m.attempt.activity_id,
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
    if m.attempt.quantity <= 0 {
        return Err(ConsumeError::Malformed(format!(
            "quantity must be positive, got {}",
            m.attempt.quantity
        )));
    }
    if m.attempt.activity_id <= 0 {
        return Err(ConsumeError::Malformed(format!(
            "activityId must be positive, got {}",
            m.attempt.activity_id
        )));
    }
    if m.attempt.user_id.trim().is_empty() {
        return Err(ConsumeError::Malformed("userId is empty".into()));
    }
    if m.attempt.request_id == Uuid::nil() {
        return Err(ConsumeError::Malformed("requestId is the nil uuid".into()));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lambda_deadline_is_read_on_the_monotonic_clock_and_none_when_not_ahead() {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let left = deadline_of(now_ms + 5_000).unwrap() - Instant::now();
        assert!(
            left > Duration::from_millis(4_500) && left <= Duration::from_secs(5),
            "{left:?}"
        );
        for unset in [0, 600_000, now_ms - 5_000] {
            assert!(deadline_of(unset).is_none(), "{unset}");
        }
    }

    #[tokio::test]
    async fn work_past_its_stop_is_not_started_and_work_at_it_is_dropped() {
        assert_eq!(before_stop(None, async { 1 }).await, Some(1));
        let past = Instant::now();
        let started = std::sync::atomic::AtomicBool::new(false);
        let work = async { started.store(true, std::sync::atomic::Ordering::SeqCst) };
        assert_eq!(before_stop(Some(past), work).await, None);
        assert!(!started.load(std::sync::atomic::Ordering::SeqCst));
        let soon = Instant::now() + Duration::from_millis(50);
        let forever = std::future::pending::<()>();
        assert_eq!(before_stop(Some(soon), forever).await, None);
    }

    #[test]
    fn parse_accepts_the_entry_functions_message() {
        let body = r#"{"requestId":"0f6a3e2b-8c1d-4b7e-a9f2-3d5c7e9b1a20","activityId":1,"userId":"alice","quantity":1,"reservedAtMs":1}"#;
        let m = parse(Some(body)).unwrap();
        assert_eq!(
            (
                m.attempt.activity_id,
                m.attempt.user_id.as_str(),
                m.attempt.quantity
            ),
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
