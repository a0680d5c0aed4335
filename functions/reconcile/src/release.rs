//! Unpaid orders past the payment timeout go back on sale: each is cancelled as its owner
//! would cancel it ([`cancel::cancel_order`]), a bounded batch per run. The batches walk the
//! unpaid orders in `(created_at, id)` order from where the last run stopped
//! (`release_cursor`), and start again from the oldest at the end: an order that cannot be
//! released yet waits for the next lap instead of holding back every order behind it.

use crate::{Reconcile, ReconcileFailure, ReconcileReport};
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use futures::StreamExt;
use seckill_shared::domain::order::{self, Order, UnpaidKey};
use seckill_shared::protocol::cancel::{self, CancelOutcome};
use std::collections::HashMap;

/// Cancellations of unpaid orders in flight at once.
const RELEASE_CONCURRENCY: usize = 8;

/// The walk's beginning: before every order.
const OLDEST: UnpaidKey = (DateTime::UNIX_EPOCH, 0);

impl Reconcile {
    /// Cancels up to `release_batch` orders left unpaid past the payment timeout, the next
    /// ones of the walk. Returns how many were released per activity.
    pub async fn release_unpaid(
        &self,
        now: DateTime<Utc>,
        report: &mut ReconcileReport,
    ) -> HashMap<i64, usize> {
        let mut released = HashMap::new();
        let timeout = ChronoDuration::from_std(self.config.payment_timeout)
            .unwrap_or(ChronoDuration::minutes(15));
        let unpaid = match self.next_unpaid(now - timeout).await {
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

    /// The next batch of the walk over the orders unpaid since before `deadline`: those after
    /// the cursor, then, once the end is reached, from the oldest up to where this lap began.
    /// The cursor moves before the batch is tried, so a batch that fails or crashes every time
    /// cannot stop the walk; its orders come round again on the next lap.
    async fn next_unpaid(&self, deadline: DateTime<Utc>) -> Result<Vec<Order>, sqlx::Error> {
        let batch = self.config.release_batch;
        let from = order::release_cursor(&self.pool).await?.unwrap_or(OLDEST);
        let mut unpaid = order::unpaid_after(&self.pool, deadline, from, batch).await?;
        if (unpaid.len() as i64) < batch && from != OLDEST {
            let left = batch - unpaid.len() as i64;
            let again = order::unpaid_after(&self.pool, deadline, OLDEST, left).await?;
            unpaid.extend(again.into_iter().take_while(|o| o.unpaid_key() <= from));
        }
        let next = match unpaid.last() {
            Some(last) if unpaid.len() as i64 == batch => last.unpaid_key(),
            // The whole lap fitted in this batch: the next one starts from the oldest again.
            _ => OLDEST,
        };
        order::save_release_cursor(&self.pool, next).await?;
        Ok(unpaid)
    }
}
