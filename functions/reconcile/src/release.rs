//! Unpaid orders past the payment timeout go back on sale: each is cancelled as its owner
//! would cancel it ([`cancel::cancel_order`]), a bounded batch per run (`RELEASE_BATCH`),
//! oldest first.

use crate::{Reconcile, ReconcileFailure, ReconcileReport};
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use futures::StreamExt;
use seckill_shared::domain::order;
use seckill_shared::protocol::cancel::{self, CancelOutcome};
use std::collections::HashMap;

/// Cancellations of unpaid orders in flight at once.
const RELEASE_CONCURRENCY: usize = 8;

impl Reconcile {
    /// Cancels up to `release_batch` orders left unpaid past the payment timeout, oldest
    /// first. Returns how many were released per activity.
    pub async fn release_unpaid(
        &self,
        now: DateTime<Utc>,
        report: &mut ReconcileReport,
    ) -> HashMap<i64, usize> {
        let mut released = HashMap::new();
        let timeout = ChronoDuration::from_std(self.config.payment_timeout)
            .unwrap_or(ChronoDuration::minutes(15));
        let unpaid =
            order::unpaid_before(&self.pool, now - timeout, self.config.release_batch).await;
        let unpaid = match unpaid {
            Ok(rows) => rows,
            Err(e) => {
                tracing::error!(error = %e, "failed to list unpaid orders");
                report.errors.push(ReconcileFailure {
                    activity_id: None,
                    order_id: None,
                    message: format!("failed to list unpaid orders: {e}"),
                });
                return released;
            }
        };
        let pool = &self.pool;
        let redis = &self.redis;
        // Owned orders: a closure over `&Order` would make the run's future not `Send` for any
        // lifetime, which a spawned task (the dev server's schedule) needs.
        let mut results = futures::stream::iter(unpaid)
            .map(|o| async move {
                let result = cancel::cancel_order(pool, redis, &o, now).await;
                (o, result)
            })
            .buffer_unordered(RELEASE_CONCURRENCY);
        while let Some((o, result)) = results.next().await {
            match result {
                Ok(CancelOutcome::Cancelled { quantity }) => {
                    tracing::info!(
                        order_id = o.id,
                        activity_id = o.activity_id,
                        quantity,
                        repair = "released_unpaid",
                        "unpaid order released after the payment timeout"
                    );
                    report.released_unpaid += 1;
                    *released.entry(o.activity_id).or_insert(0) += 1;
                }
                // Paid or cancelled meanwhile: the owner decided first.
                Ok(CancelOutcome::AlreadyCancelled | CancelOutcome::NotCancellable(_)) => {}
                Ok(CancelOutcome::Busy) => report.release_deferred += 1,
                Err(e) => {
                    tracing::warn!(order_id = o.id, error = %e, "failed to release unpaid order");
                    report.errors.push(ReconcileFailure {
                        activity_id: Some(o.activity_id),
                        order_id: Some(o.id),
                        message: e.to_string(),
                    });
                }
            }
        }
        released
    }
}
