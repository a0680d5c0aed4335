//! order-consumer: turns the order messages `seckill-entry` sends into rows of the system of
//! record, one SQS batch at a time, reporting only the failed messages.
//!
//! What each message comes to is the protocol's decision
//! ([`seckill_shared::protocol::consume`]); this crate is its batch driver: it parses the
//! batch, keeps a draw's entries per sale, writes the orders of one sale in one transaction
//! where it can (`batch`), decides the rest one by one, stops before the invocation's
//! deadline, and reports the messages to redeliver and the batch's counters. Anything
//! transient is retried by SQS. docs/invariants.md, "Consumer: an order message".

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use futures::StreamExt;
use seckill_shared::domain::purchase::{MessageKind, OrderMessage};
use seckill_shared::infra::metrics;
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol::consume::{self, DecideError, Decided, Decision};
use seckill_shared::store::conn::Redis;
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
/// future ([`seckill_shared::infra::deadline::from_epoch_ms`]).
pub fn deadline_of(deadline_epoch_ms: u64) -> Option<Instant> {
    seckill_shared::infra::deadline::from_epoch_ms(deadline_epoch_ms).map(Instant::from_std)
}

/// The deadline of an invocation that starts now: the function's Lambda Timeout away.
fn invoked_now() -> Instant {
    Instant::now() + Function::Consumer.shape().timeout()
}

/// When a batch of an invocation that ends at `deadline` stops.
fn stop_before(deadline: Instant) -> Instant {
    deadline
        .checked_sub(STOP_BEFORE_DEADLINE)
        .unwrap_or(deadline)
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

impl From<DecideError> for ConsumeError {
    fn from(e: DecideError) -> Self {
        ConsumeError::Retryable(anyhow::Error::new(e))
    }
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
    /// batch failure), as an invocation that starts now: by the function's Lambda Timeout
    /// (functions/shape.toml), the deadline Lambda would give it. After the batch fast path,
    /// the remaining messages are processed concurrently, at most one per pooled connection;
    /// each one's outcome depends only on the database and its own ledger entry, so the order
    /// in which they finish does not matter. Emits one metrics line for the batch.
    pub async fn handle_batch(&self, event: SqsEvent) -> SqsBatchResponse {
        self.handle_batch_by(event, invoked_now()).await
    }

    /// [`Consumer::handle_batch`] within an invocation that ends at `deadline` (the Lambda
    /// context's): the batch stops [`STOP_BEFORE_DEADLINE`] before it, and the messages not
    /// finished by then are reported for redelivery.
    pub async fn handle_batch_by(&self, event: SqsEvent, deadline: Instant) -> SqsBatchResponse {
        self.handle_batch_until(event, Some(stop_before(deadline)))
            .await
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
        let stop = stop_before(invoked_now());
        self.handle_batch_with_stats_until(event, Some(stop)).await
    }

    /// The batch, with no work done past `stop` (none: no bound).
    async fn handle_batch_with_stats_until(
        &self,
        event: SqsEvent,
        stop: Option<Instant>,
    ) -> (SqsBatchResponse, BatchStats) {
        let mut results: Vec<(Option<String>, Result<Decided, ConsumeError>)> = Vec::new();
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
        let mut by_activity: std::collections::BTreeMap<i64, Vec<Item>> = Default::default();
        for item in entries {
            by_activity
                .entry(item.message.attempt.activity_id)
                .or_default()
                .push(item);
        }
        for (activity_id, items) in by_activity {
            let messages: Vec<&OrderMessage> = items.iter().map(|i| &i.message).collect();
            let keep = consume::keep_entries(&self.pool, &self.redis, activity_id, &messages);
            let kept = before_stop(stop, async { Ok::<_, ConsumeError>(keep.await?) })
                .await
                .unwrap_or_else(|| Err(ConsumeError::stopped()));
            for item in items {
                let result = match &kept {
                    Ok(()) => Ok(Decided {
                        decision: Decision::Entered,
                        compensated: false,
                    }),
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
                        let result = Ok(Decided {
                            decision: Decision::Committed,
                            compensated: false,
                        });
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
        let one_by_one: Vec<(Option<String>, Result<Decided, ConsumeError>)> =
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
                    match p.decision {
                        Decision::Committed => stats.committed += 1,
                        Decision::Entered => stats.entered += 1,
                        Decision::Duplicate => stats.duplicates += 1,
                        Decision::Failed(_) => stats.failed += 1,
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

    /// Decides one parsed order message ([`consume::decide`]): its decision and whether this
    /// call gave units back to Redis. Safe to call any number of times for the same message,
    /// also concurrently.
    pub async fn handle_message(&self, m: &OrderMessage) -> Result<Decided, ConsumeError> {
        Ok(consume::decide(&self.pool, &self.redis, m).await?)
    }
}

/// A parsed message and the SQS id to report it by.
pub(crate) struct Item {
    message_id: Option<String>,
    message: OrderMessage,
}

/// The one log line per message.
fn log_result(item: &Item, result: &Result<Decided, ConsumeError>, path: &'static str) {
    let message_id = item.message_id.as_deref().unwrap_or("-");
    let m = &item.message;
    match result {
        Ok(p) => tracing::info!(
            message_id,
            request_id = %m.attempt.request_id,
            activity_id = m.attempt.activity_id,
            outcome = p.decision.as_str(),
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
