//! The database's count and the stock fix: the database against itself (`remaining = total - sold`, under the row
//! lock), then Redis's stock from the database, only under the sale's lock, only while the
//! ledger is quiet, and only if no script moved the stock since it was read (the stock
//! sequence). docs/invariants.md, "Reconcile", the database's count and the stock fix.

use crate::report::{all_loaded, quiet, stock_sum};
use crate::{Reconcile, StockCheck};
use anyhow::Context as _;
use seckill_shared::domain::activity::{self, Activity};
use seckill_shared::domain::order;
use seckill_shared::infra::pause;
use seckill_shared::protocol::{load, lock};
use seckill_shared::store::keys::Bucket;
use seckill_shared::store::ledger::Snapshot;
use seckill_shared::store::repair;
use std::time::Duration;

/// How long reconcile waits for an activity's lock before skipping the stock correction.
const LOCK_WAIT: Duration = Duration::from_millis(300);

impl Reconcile {
    /// The database's count: `remaining_stock = total_stock - sold`, checked and fixed in one transaction that
    /// holds the activity row. Returns (sold, remaining after the check, remaining before a fix).
    pub(crate) async fn check_database(&self, id: i64) -> anyhow::Result<(i64, i64, Option<i64>)> {
        let mut tx = self.pool.begin().await?;
        let (total, remaining) = activity::lock_stock(&mut tx, id)
            .await
            .context("failed to lock the activity row")?;
        // Summed inside the transaction, after the row lock: every order transaction that
        // changed the stock committed before we got the lock (and is counted), or waits for
        // us (and is not).
        let sold = order::sold_quantity(&mut *tx, id)
            .await
            .context("failed to sum the sold quantity")?;
        let expected = total - sold;
        if expected == remaining {
            tx.commit().await?;
            return Ok((sold, remaining, None));
        }
        if expected < 0 {
            // More sold than the activity ever had: nothing automatic can make that right.
            tx.rollback().await?;
            anyhow::bail!("activity {id} is oversold in the database: total {total}, sold {sold}");
        }
        activity::set_remaining_stock(&mut *tx, id, expected)
            .await
            .context("failed to fix the remaining stock")?;
        tx.commit().await?;
        tracing::warn!(
            before = remaining,
            after = expected,
            total,
            sold,
            repair = "db_stock_fixed",
            "database remaining stock did not match total - sold"
        );
        Ok((sold, expected, Some(remaining)))
    }

    /// The stock fix: Redis stock := database remaining stock, only while nothing is in flight.
    pub(crate) async fn correct_stock(&self, a: &Activity) -> anyhow::Result<StockCheck> {
        let id = a.id;
        pause::point("reconcile.stock.before_lock", id).await;
        // A cheap look first, so the lock is taken only when there is something to correct.
        let snaps = self.snapshots(a).await?;
        if !all_loaded(&snaps) {
            return Ok(StockCheck::NotLoaded);
        }
        if !quiet(&snaps) {
            return Ok(StockCheck::LedgerBusy);
        }
        if Some(stock_sum(&snaps)) == Some(self.db_remaining(id).await?) {
            return Ok(StockCheck::InSync);
        }

        let guard = match lock::acquire(
            &self.redis,
            &self.pool,
            id,
            self.config.lock_ttl,
            LOCK_WAIT.min(self.config.lock_wait),
        )
        .await
        {
            Ok(g) => g,
            Err(lock::LockError::Busy) => {
                tracing::info!("activity lock busy; stock correction left to the next run");
                return Ok(StockCheck::LockBusy);
            }
            Err(e) => return Err(e).context("failed to take the activity lock"),
        };
        let outcome = self.correct_stock_locked(a, &guard).await;
        if let Err(e) = guard.release().await {
            tracing::warn!(error = %e, "failed to release the activity lock; it expires by itself");
        }
        outcome
    }

    /// Under the lock: Redis first, then the database (see the module docs for why this
    /// order). In a bucketed sale no script sees every bucket, so the buckets are read again
    /// after the database: only when every one is still quiet with the sequence it had before
    /// the database read does the sum read describe the moment of that read, and then
    /// `database - sum` is exactly what Redis lacks (or holds too much). Every later step of
    /// any actor keeps that difference, so it can be put right in any one bucket whose own
    /// sequence is still the one read.
    async fn correct_stock_locked(
        &self,
        a: &Activity,
        guard: &lock::LockGuard,
    ) -> anyhow::Result<StockCheck> {
        let id = a.id;
        let before = self.snapshots(a).await?;
        pause::point("reconcile.stock.after_snapshot", id).await;
        if !all_loaded(&before) {
            return Ok(StockCheck::NotLoaded);
        }
        if !quiet(&before) {
            return Ok(StockCheck::LedgerBusy);
        }
        // Fenced like an admin write: a holder whose lease ran out (an admin lower between its
        // Redis step and its commit, say) can no longer commit once this token is recorded,
        // so the remaining stock read here stays the truth the fix writes.
        let target = load::fence_and_read(&self.pool, guard, false)
            .await
            .context("failed to fence and read the activity")?
            .remaining_stock;
        let snaps = if before.len() > 1 {
            let after = self.snapshots(a).await?;
            let unmoved = before
                .iter()
                .zip(&after)
                .all(|((_, b), (_, a))| a.loaded && a.quiet() && a.seq == b.seq);
            if !unmoved {
                return Ok(StockCheck::Moved);
            }
            after
        } else {
            before
        };
        pause::point("reconcile.stock.before_fix", id).await;
        let from = stock_sum(&snaps);
        if from == target {
            return Ok(StockCheck::InSync);
        }
        // The difference, into the buckets that can take it: a surplus from the fullest.
        let mut by_stock: Vec<&(Bucket, Snapshot)> = snaps.iter().collect();
        by_stock.sort_by_key(|(b, s)| (-s.stock.unwrap_or(0), b.index));
        let mut left = target - from;
        for (bucket, snap) in by_stock {
            let stock = snap.stock.unwrap_or(0);
            let step = left.max(-stock);
            if step == 0 {
                continue;
            }
            let fixed =
                repair::fix_stock(&self.redis, *bucket, &guard.owner, snap.seq, stock + step)
                    .await?;
            if !fixed {
                return Ok(StockCheck::Moved);
            }
            left -= step;
            if left == 0 {
                break;
            }
        }
        tracing::warn!(
            from,
            to = target,
            repair = "redis_stock_fixed",
            "redis stock corrected from the database"
        );
        Ok(StockCheck::Corrected {
            from: Some(from),
            to: target,
        })
    }

    async fn db_remaining(&self, id: i64) -> anyhow::Result<i64> {
        activity::remaining_stock(&self.pool, id)
            .await
            .and_then(|r| r.ok_or(sqlx::Error::RowNotFound))
            .context("failed to read the remaining stock")
    }
}
