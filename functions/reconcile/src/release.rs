//! Unpaid orders past the payment timeout go back on sale: each is cancelled as its owner
//! would cancel it, except that it never waits for another attempt
//! ([`cancel::Canceller::PaymentTimeout`]), a bounded batch per run within the release's share
//! of the run. The batches walk the unpaid orders in `(created_at, id)` order from where the
//! last run stopped (`release_cursor`), and start again from the oldest at the end: an order
//! that cannot be released yet waits for the next lap instead of holding back every order
//! behind it. An order whose buyer's entry in flight is a stale cancel entry (an attempt that
//! never finished) has that entry repaired first, as the ledger's repairs would, and is
//! released in the same lap.

use crate::budget::Share;
use crate::{is_stale, Reconcile, ReconcileFailure, ReconcileReport};
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use futures::StreamExt;
use seckill_shared::domain::order::{self, Order, UnpaidKey};
use seckill_shared::domain::status::OrderStatus;
use seckill_shared::protocol::cancel::{self, CancelOutcome, Canceller};
use seckill_shared::protocol::pay;
use seckill_shared::store::keys::Home;
use seckill_shared::store::ledger;
use seckill_shared::store::values::EntryKind;
use std::collections::{HashMap, HashSet};
use std::time::Instant;

/// Cancellations of unpaid orders in flight at once.
const RELEASE_CONCURRENCY: usize = 8;

/// The walk's beginning: before every order.
const OLDEST: UnpaidKey = (DateTime::UNIX_EPOCH, 0);

/// What the release did with one order.
struct Released {
    outcome: CancelOutcome,
    /// The buyer's stale cancel entry was repaired before the order was tried again.
    repaired: bool,
}

impl Reconcile {
    /// Cancels up to `release_batch` orders left unpaid past the payment timeout, the next
    /// ones of the walk, within the configured budget from now. Returns how many were
    /// released per activity. [`Self::run_by`] gives it its share of the run instead.
    pub async fn release_unpaid(
        &self,
        now: DateTime<Utc>,
        report: &mut ReconcileReport,
    ) -> HashMap<i64, usize> {
        let until = Instant::now() + self.config.reconcile_budget;
        let share = Share { until, hard: until };
        self.release_unpaid_in(now, share, report).await
    }

    /// The release within `share`: the orders of the batch are started in the walk's order
    /// while the share lasts (the first one whatever the time, none past the run's hard
    /// end); when it stops early the cursor goes back to just after the last order started,
    /// so the next run goes on with the rest of the batch.
    pub(crate) async fn release_unpaid_in(
        &self,
        now: DateTime<Utc>,
        share: Share,
        report: &mut ReconcileReport,
    ) -> HashMap<i64, usize> {
        let mut released = HashMap::new();
        let timeout = ChronoDuration::from_std(self.config.payment_timeout)
            .unwrap_or(ChronoDuration::minutes(15));
        let (from, unpaid) = match self.next_unpaid(now - timeout).await {
            Ok(batch) => batch,
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
        let keys: Vec<UnpaidKey> = unpaid.iter().map(Order::unpaid_key).collect();
        // Owned orders: a closure over `&Order` would make the run's future not `Send` for any
        // lifetime, which a spawned task (the dev server's schedule) needs.
        let mut results = futures::stream::iter(unpaid.into_iter().enumerate())
            .take_while(|(i, _)| {
                futures::future::ready(!share.over() && (*i == 0 || !share.spent()))
            })
            .map(|(i, o)| async move {
                let result = self.release(&o, now).await;
                (i, o, result)
            })
            .buffer_unordered(RELEASE_CONCURRENCY);
        let mut tried = 0;
        while let Some((i, o, result)) = results.next().await {
            tried = tried.max(i + 1);
            self.count_release(&o, result, report, &mut released);
        }
        if tried < keys.len() {
            report.release_deferred += keys.len() - tried;
            let after = tried.checked_sub(1).map_or(from, |last| keys[last]);
            if let Err(e) = order::save_release_cursor(&self.pool, after).await {
                tracing::warn!(error = %e, "failed to move the release's cursor back");
            }
        }
        released
    }

    /// One unpaid order, its payment closed at the provider first (`pay::close`: an order the
    /// provider says was paid waits for its event), then cancelled as the payment timeout does
    /// (never waiting for another attempt). `Busy` because the buyer's entry in flight is a cancel entry older than the
    /// grace period (an attempt that crashed or lost its database between its announcement
    /// and its commit): that entry is repaired first, as the ledger's repairs would (aborted
    /// in the database, then dropped, or finished when it had committed), and the order tried
    /// once more.
    async fn release(&self, o: &Order, now: DateTime<Utc>) -> anyhow::Result<Released> {
        let (pool, redis) = (&self.pool, &self.redis);
        let by = Canceller::PaymentTimeout;
        // The payment closed at the provider once, before either attempt below: the provider is
        // asked at most once per order and run.
        let not_closed = match pay::close(pool, self.payments.as_deref(), o, now).await? {
            pay::Closing::Closed { .. } => None,
            pay::Closing::Paid => Some(CancelOutcome::NotCancellable(OrderStatus::Paid)),
            pay::Closing::PaidAwaitingEvent | pay::Closing::Open => Some(CancelOutcome::Busy),
        };
        if let Some(outcome) = not_closed {
            return Ok(Released {
                outcome,
                repaired: false,
            });
        }
        let outcome = cancel::cancel_as(pool, redis, o, now, by).await?;
        if outcome != CancelOutcome::Busy {
            return Ok(Released {
                outcome,
                repaired: false,
            });
        }
        let bucket = o.home();
        let entry = ledger::entry(redis, bucket, &o.user_id).await?;
        let Some(e) = entry.filter(|e| {
            e.kind == EntryKind::Cancel && is_stale(e, now, self.config.reconcile_grace)
        }) else {
            return Ok(Released {
                outcome,
                repaired: false,
            });
        };
        self.repair_cancel(bucket, &e, &HashSet::new(), now).await?;
        Ok(Released {
            outcome: cancel::cancel_as(pool, redis, o, now, by).await?,
            repaired: true,
        })
    }

    /// Counts what the release did with order `o` into the run's report.
    fn count_release(
        &self,
        o: &Order,
        result: anyhow::Result<Released>,
        report: &mut ReconcileReport,
        released: &mut HashMap<i64, usize>,
    ) {
        let result = result.map(|r| {
            report.release_repaired += usize::from(r.repaired);
            r.outcome
        });
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
                tracing::warn!(
                    order_id = o.id,
                    error = format!("{e:#}"),
                    "failed to release unpaid order"
                );
                report.errors.push(ReconcileFailure {
                    activity_id: Some(o.activity_id),
                    order_id: Some(o.id),
                    message: format!("{e:#}"),
                });
            }
        }
    }

    /// The next batch of the walk over the orders unpaid since before `deadline`: those after
    /// the cursor, then, once the end is reached, from the oldest up to where this lap began.
    /// The cursor moves before the batch is tried, so a batch that fails or crashes every time
    /// cannot stop the walk; its orders come round again on the next lap. Answers where the
    /// batch began (the cursor before it) and the batch.
    async fn next_unpaid(
        &self,
        deadline: DateTime<Utc>,
    ) -> Result<(UnpaidKey, Vec<Order>), sqlx::Error> {
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
        Ok((from, unpaid))
    }
}
