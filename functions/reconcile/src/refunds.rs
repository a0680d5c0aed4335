//! Payments owed back are refunded through the provider, exactly once each: a bounded batch per
//! run, at the start of the release's share (before the release, whose backlog could otherwise
//! leave them no time). Each payment of the run's provider is claimed first (`refunding`, one
//! attempt counted, a lease), then refunded whole with an idempotency key of the payment and
//! the attempt (a retry within the attempt gets the same refund; a later attempt that meets a
//! refund made before is told so, and records it), then recorded `refunded` with the
//! provider's refund id. A refusal keeps its error; after [`MAX_REFUND_ATTEMPTS`] the payment
//! is `failed`, for the operator (metric `RefundsFailed`).
//! docs/invariants.md, "Refunds".

use crate::budget::Share;
use crate::report::FUNCTION;
use crate::{Reconcile, ReconcileFailure, ReconcileReport};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use seckill_shared::domain::payment::{self, RefundClaim};
use seckill_shared::infra::metrics;
use seckill_shared::infra::payments::{Provider, PROVIDER_TIMEOUT};

/// Payments claimed per run.
const REFUND_BATCH: i64 = 10;
/// Refunds asked at once.
const REFUND_CONCURRENCY: usize = 5;
/// How long a claim keeps other runs off a payment: well past one provider call and its
/// record, so a refund in flight is never asked twice at once.
const REFUND_LEASE_SECS: i64 = 60;
/// Attempts before a refund is `failed` and left to the operator.
pub const MAX_REFUND_ATTEMPTS: i32 = 5;
/// Counted up to this many for the metrics.
const COUNT_CAP: i64 = 10_000;

impl Reconcile {
    /// Refunds the next batch of payments owed back, within the configured budget from now.
    /// [`Self::run_by`] gives it what is left of the release's share instead.
    pub async fn refund_owed(&self, now: DateTime<Utc>, report: &mut ReconcileReport) {
        let until = std::time::Instant::now() + self.config.reconcile_budget;
        self.refund_owed_in(now, Share { until, hard: until }, report)
            .await;
    }

    /// Refunds the next payments owed back, within `share` (none once its hard end has passed,
    /// nor when what is left of it cannot hold two provider calls: they wait for the next run),
    /// and counts what waits.
    pub(crate) async fn refund_owed_in(
        &self,
        now: DateTime<Utc>,
        share: Share,
        report: &mut ReconcileReport,
    ) {
        let Some(provider) = self.payments.as_deref() else {
            return;
        };
        let room = share
            .until
            .saturating_duration_since(std::time::Instant::now());
        if !share.over() && room >= PROVIDER_TIMEOUT * 2 {
            self.refund_batch(provider, now, report).await;
        }
        // Counted every run, refunds made or not: a run with no time for them still reports
        // what waits (the alarm on `RefundsOwed` treats a missing point as fine).
        match payment::refund_counts(&self.pool, COUNT_CAP).await {
            Ok((open, failed)) => metrics::emit(
                FUNCTION,
                &[
                    ("RefundsOwed", open as f64),
                    ("RefundsFailed", failed as f64),
                ],
                &[],
            ),
            Err(e) => tracing::warn!(error = %e, "failed to count refunds"),
        }
    }

    /// One claimed batch, refunded and recorded.
    async fn refund_batch(
        &self,
        provider: &dyn Provider,
        now: DateTime<Utc>,
        report: &mut ReconcileReport,
    ) {
        let lease = chrono::Duration::seconds(REFUND_LEASE_SECS);
        let claimed = payment::claim_refunds(&self.pool, provider.name(), now, lease, REFUND_BATCH);
        let claims = match claimed.await {
            Ok(claims) => claims,
            Err(e) => {
                report.errors.push(ReconcileFailure {
                    activity_id: None,
                    order_id: None,
                    message: format!("failed to claim refunds: {e}"),
                });
                return;
            }
        };
        let results: Vec<(RefundClaim, Result<Option<String>, String>)> =
            futures::stream::iter(claims)
                .map(|c| async move {
                    let request = c.request();
                    let refund = provider.refund(&request);
                    let refunded = match tokio::time::timeout(PROVIDER_TIMEOUT, refund).await {
                        Ok(r) => r.map_err(|e| e.to_string()),
                        Err(_) => Err("no answer within the provider timeout".to_string()),
                    };
                    (c, refunded)
                })
                .buffer_unordered(REFUND_CONCURRENCY)
                .collect()
                .await;
        for (c, refunded) in results {
            self.record_refund(&c, refunded, now, report).await;
        }
    }

    async fn record_refund(
        &self,
        c: &RefundClaim,
        refunded: Result<Option<String>, String>,
        now: DateTime<Utc>,
        report: &mut ReconcileReport,
    ) {
        let recorded = match &refunded {
            Ok(refund_id) => {
                let write = async {
                    let mut tx = self.pool.begin().await?;
                    payment::mark_refunded(&mut tx, c.order_id, refund_id.as_deref(), now).await?;
                    tx.commit().await
                };
                write.await.map(|()| {
                    report.refunded += 1;
                    tracing::info!(order_id = c.order_id, refund_id = refund_id.as_deref(),
                        amount_minor = c.amount_minor, currency = %c.currency, "payment refunded");
                })
            }
            Err(error) => {
                payment::refund_refused(&self.pool, c.order_id, error, MAX_REFUND_ATTEMPTS)
                    .await
                    .map(|failed| {
                        tracing::warn!(order_id = c.order_id, attempts = c.attempts, failed,
                            error = %error, "refund refused by the provider");
                        report.errors.push(ReconcileFailure {
                            activity_id: None,
                            order_id: Some(c.order_id),
                            message: format!("refund: {error}"),
                        });
                    })
            }
        };
        if let Err(e) = recorded {
            // The claim's lease runs out and a later run asks again: the same idempotency key
            // answers the same refund.
            tracing::warn!(order_id = c.order_id, error = %e, "refund not recorded yet");
        }
    }
}
