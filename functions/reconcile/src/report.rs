//! What one run found and did: the Lambda's JSON result, one log line and one EMF line per
//! sale, and the stats row reconcile keeps per sale.

use chrono::{DateTime, Utc};
use seckill_shared::infra::metrics;
use seckill_shared::store::keys::Bucket;
use seckill_shared::store::ledger::Snapshot;
use seckill_shared::store::values::LedgerEntry;
use serde::Serialize;
use serde_json::json;
use std::time::Duration;

/// The function name used in metrics.
pub const FUNCTION: &str = "reconcile";

/// What one run did, returned as the Lambda's JSON result.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReconcileReport {
    pub activities: Vec<ActivityReport>,
    /// Unpaid orders cancelled by this run.
    pub released_unpaid: usize,
    /// Unpaid orders left for the next run (the user had another entry in flight, or the
    /// release's share ran out before them).
    pub release_deferred: usize,
    /// Stale cancel entries (of attempts that never finished) the release met and repaired
    /// before releasing their orders.
    pub release_repaired: usize,
    /// Payments owed back that this run refunded through the provider.
    pub refunded: usize,
    /// Due sales this run had no time left for: the next run checks them first.
    pub deferred_ids: Vec<i64>,
    /// Activities or orders that failed this run (the next run retries them).
    pub errors: Vec<ReconcileFailure>,
}

impl ReconcileReport {
    /// The report of one activity, if this run checked it.
    pub fn activity(&self, activity_id: i64) -> Option<&ActivityReport> {
        self.activities
            .iter()
            .find(|a| a.activity_id == activity_id)
    }
}

/// Something reconcile could not do this run.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReconcileFailure {
    pub activity_id: Option<i64>,
    pub order_id: Option<i64>,
    pub message: String,
}

/// What happened to the Redis stock of one activity (the stock fix).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "status")]
pub enum StockCheck {
    /// Redis already matches the database.
    InSync,
    /// Redis stock set from `from` (`None`: the key was missing) to the database's `to`.
    Corrected { from: Option<i64>, to: i64 },
    /// Entries in flight: Redis and the database legitimately differ; checked next run.
    LedgerBusy,
    /// Someone (an admin, another reconcile) held the lock.
    LockBusy,
    /// A purchase or cancel moved the stock between the read and the write; next run.
    Moved,
    /// The activity is not in Redis (upcoming, or ended and expired).
    NotLoaded,
}

/// Numbers and repairs of one activity.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ActivityReport {
    pub activity_id: i64,
    /// This run loaded the activity into Redis (it was running and missing).
    pub preheated: bool,
    /// This run drew a draw sale's winners (nobody had since its window closed).
    pub drawn: bool,
    /// Orders of a draw's winners this run wrote from the recorded outcome.
    pub winners_ordered: usize,
    /// A drawn sale whose winners' orders are not all written after this run: the next run
    /// goes on from the record's cursor (their reservations are never given back meanwhile).
    pub orders_pending: bool,
    /// Entries of a draw's pool answered 503 and left there, taken out by this run.
    pub pool_left: usize,
    /// Entries and winners of a draw's pool put back from the database by this run (a
    /// rebuild an earlier load did not finish).
    pub pool_rebuilt: usize,
    /// This run loaded a draw sale from scratch: Redis held a draw that is not the recorded
    /// one.
    pub draw_reloaded: bool,
    /// A draw sale's entrants (holders of a ticket), and how full its pool is in percent of
    /// its `maxEntrants`; `None` for a first-come sale or one not loaded.
    pub draw_entrants: Option<i64>,
    pub pool_fill_percent: Option<f64>,
    /// Stale reservations with no order, given back (stock and user).
    pub compensated: usize,
    /// Stale entries dropped because the database already holds their outcome.
    pub settled: usize,
    /// Stale cancels the database had committed, finished in Redis.
    pub cancels_finished: usize,
    /// Transfers between buckets a buyer left half done, finished in their home bucket.
    pub transfers_finished: usize,
    /// Users in `users` with nothing behind them, removed.
    pub users_dropped: usize,
    /// Holders of a live order whose field in `users` was lost, restored.
    pub fields_restored: usize,
    /// The sale's share of the run ran out before its draw part (the rebuild, the draw's steps,
    /// the sends) or its walks (the ledger's repairs, the orphan check, the lost fields)
    /// reached their end: the next run goes on.
    pub out_of_time: bool,
    /// The database's remaining stock before this run fixed it, when it was wrong.
    pub db_stock_fixed_from: Option<i64>,
    pub stock_check: StockCheck,
    /// Unpaid orders of this activity released by this run.
    pub released_unpaid: usize,
    pub participants: i64,
    /// Confirmed + paid quantity in the database.
    pub sold: i64,
    pub db_remaining: i64,
    pub redis_stock: Option<i64>,
    pub pending_qty: i64,
    /// Units on their way between two buckets of a bucketed sale.
    pub transfer_qty: i64,
    /// Whether every bucket's ledger was counted in the snapshot's one step (at most
    /// `LEDGER_INLINE` entries): only then do `pending_qty`, `transfer_qty` and the stock
    /// describe one moment, and `drift` compare Redis with the database.
    pub ledger_counted: bool,
    /// `redis_stock + pending_qty + transfer_qty + sold - total` (0 when conserved); with the
    /// activity not in Redis, or a ledger too large to count in one step, the database's own
    /// `db_remaining + sold - total`.
    pub drift: i64,
    /// Everything this run changed for the activity (the release of unpaid orders excluded).
    pub repairs: usize,
}

/// One structured log line and one EMF line per activity.
pub(crate) fn publish(r: &ActivityReport) {
    if r.drift != 0 || r.repairs > 0 {
        tracing::warn!(
            activity_id = r.activity_id,
            drift = r.drift,
            repairs = r.repairs,
            released_unpaid = r.released_unpaid,
            redis_stock = ?r.redis_stock,
            pending_qty = r.pending_qty,
            sold = r.sold,
            db_remaining = r.db_remaining,
            "activity reconciled with drift or repairs"
        );
    } else {
        tracing::info!(
            activity_id = r.activity_id,
            drift = r.drift,
            repairs = r.repairs,
            released_unpaid = r.released_unpaid,
            "activity reconciled"
        );
    }
    metrics::emit(
        FUNCTION,
        &[
            ("Drift", r.drift as f64),
            ("Repairs", r.repairs as f64),
            ("ReleasedUnpaid", r.released_unpaid as f64),
        ],
        &[("activityId", json!(r.activity_id))],
    );
    if let (Some(entrants), Some(fill)) = (r.draw_entrants, r.pool_fill_percent) {
        metrics::emit(
            FUNCTION,
            &[("DrawEntrants", entrants as f64), ("DrawPoolFill", fill)],
            &[("activityId", json!(r.activity_id))],
        );
    }
}

impl ActivityReport {
    /// A report with nothing found yet.
    pub(crate) fn new(activity_id: i64) -> Self {
        Self {
            activity_id,
            preheated: false,
            drawn: false,
            winners_ordered: 0,
            orders_pending: false,
            pool_left: 0,
            pool_rebuilt: 0,
            draw_reloaded: false,
            draw_entrants: None,
            pool_fill_percent: None,
            compensated: 0,
            settled: 0,
            cancels_finished: 0,
            transfers_finished: 0,
            users_dropped: 0,
            fields_restored: 0,
            out_of_time: false,
            db_stock_fixed_from: None,
            stock_check: StockCheck::NotLoaded,
            released_unpaid: 0,
            participants: 0,
            sold: 0,
            db_remaining: 0,
            redis_stock: None,
            pending_qty: 0,
            transfer_qty: 0,
            ledger_counted: true,
            drift: 0,
            repairs: 0,
        }
    }

    /// The numbers after the repairs, from the final snapshot and the database check.
    pub(crate) fn count(
        &mut self,
        snaps: &[(Bucket, Snapshot)],
        total_stock: i64,
        sold: i64,
        db_remaining: i64,
    ) {
        self.sold = sold;
        self.db_remaining = db_remaining;
        self.participants = snaps.iter().map(|(_, s)| s.participants).sum();
        self.pending_qty = snaps.iter().map(|(_, s)| s.pending_quantity()).sum();
        self.transfer_qty = snaps.iter().map(|(_, s)| s.transfer_quantity()).sum();
        self.redis_stock = all_loaded(snaps).then(|| stock_sum(snaps));
        self.ledger_counted = snaps.iter().all(|(_, s)| s.complete);
        let total = total_stock;
        self.drift = match self.redis_stock {
            Some(stock) if self.ledger_counted => {
                drift(stock, self.pending_qty + self.transfer_qty, sold, total)
            }
            _ => db_remaining + sold - total,
        };
        self.repairs = self.compensated
            + usize::from(self.drawn)
            + self.winners_ordered
            + self.pool_left
            + self.pool_rebuilt
            + usize::from(self.draw_reloaded)
            + self.settled
            + self.cancels_finished
            + self.transfers_finished
            + self.users_dropped
            + self.fields_restored
            + usize::from(self.db_stock_fixed_from.is_some())
            + usize::from(matches!(self.stock_check, StockCheck::Corrected { .. }));
    }
}

/// `redis_stock + pending + sold - total`: 0 when every unit is accounted for exactly once.
/// Positive means units counted twice (Redis may oversell; the database refuses), negative
/// means units lost (a crash leaked them; reconcile gives them back).
pub fn drift(redis_stock: i64, pending_qty: i64, sold: i64, total: i64) -> i64 {
    redis_stock + pending_qty + sold - total
}

/// Whether a ledger entry is older than `grace` at `now` (its timestamp is Redis server time).
pub fn is_stale(entry: &LedgerEntry, now: DateTime<Utc>, grace: Duration) -> bool {
    entry.at_ms < now.timestamp_millis() - grace.as_millis() as i64
}

/// Ledger entries older than `grace` at `now`.
pub fn stale_entries(
    ledger: &[LedgerEntry],
    now: DateTime<Utc>,
    grace: Duration,
) -> Vec<&LedgerEntry> {
    ledger.iter().filter(|e| is_stale(e, now, grace)).collect()
}

/// Whether nothing is in flight in any bucket (no ledger entry but the sentinel).
pub(crate) fn quiet(snaps: &[(Bucket, Snapshot)]) -> bool {
    snaps.iter().all(|(_, s)| s.quiet())
}

/// The stock of all buckets together.
pub(crate) fn stock_sum(snaps: &[(Bucket, Snapshot)]) -> i64 {
    snaps.iter().filter_map(|(_, s)| s.stock).sum()
}

/// Whether every bucket is loaded.
pub(crate) fn all_loaded(snaps: &[(Bucket, Snapshot)]) -> bool {
    snaps.iter().all(|(_, s)| s.loaded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_entries_older_than_the_grace_period_are_stale() {
        let now = DateTime::from_timestamp_millis(1_000_000).unwrap();
        let entry = |user: &str, at: i64| LedgerEntry::parse(user, &format!("x|t|0|{at}")).unwrap();
        let ledger = vec![
            entry("old", 1_000_000 - 5_001),
            entry("young", 1_000_000 - 4_999),
        ];
        let stale = stale_entries(&ledger, now, Duration::from_secs(5));
        assert_eq!(stale.len(), 1);
        assert_eq!(stale[0].user_id, "old");
    }

    #[test]
    fn drift_is_zero_when_every_unit_is_accounted_for() {
        assert_eq!(drift(90, 4, 6, 100), 0);
        assert_eq!(drift(91, 4, 6, 100), 1);
        assert_eq!(drift(88, 4, 6, 100), -2);
    }
}
