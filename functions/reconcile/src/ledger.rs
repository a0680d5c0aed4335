//! The ledger's repairs: every ledger entry whose fate is decided, or that a crash left behind: a
//! reservation applied (its request has a row) or given back through the arbiter (older
//! than the grace period, no row), a stale cancel finished or aborted, a stale orphan-check
//! mark dropped, a transfer between buckets finished in its home bucket.
//! docs/invariants.md, "Reconcile", the ledger's repairs.

use crate::{is_stale, stale_entries, ActivityReport, Reconcile, Walk};
use anyhow::Context as _;
use chrono::{DateTime, Utc};
use seckill_shared::domain::order::{self, Order};
use seckill_shared::domain::purchase::Attempt;
use seckill_shared::domain::status::{FailureReason, OrderStatus};
use seckill_shared::infra::pause;
use seckill_shared::protocol::buckets;
use seckill_shared::protocol::cancel;
use seckill_shared::protocol::giveback::{self, GiveBack};
use seckill_shared::store::keys::Bucket;
use seckill_shared::store::ledger::{self, Snapshot};
use seckill_shared::store::purchase::Credited;
use seckill_shared::store::values::{EntryKind, LedgerEntry};
use std::collections::{HashMap, HashSet};
use uuid::Uuid;

impl Reconcile {
    /// The ledger's repairs: every ledger entry whose fate is decided, or that a crash left behind.
    ///
    /// - A reservation whose request has a row: the database decided, at any age. A `failed`
    ///   row's units go back (its claimer may have crashed before giving them back), a live
    ///   row's entry is dropped ([`giveback::apply`]).
    /// - A reservation with no row, older than the grace period: its message never arrived (or
    ///   never will). It is given back through the arbiter ([`giveback::give_back`]): the
    ///   claim makes a late consumer's commit fail as a duplicate.
    /// - A cancel older than the grace period: finished when the order row names its cancel
    ///   id, dropped otherwise (that attempt never committed).
    /// - An orphan check's mark older than the grace period: its check crashed; dropped.
    /// - A transfer between buckets older than the grace period: finished in its home bucket
    ///   ([`Reconcile::repair_transfers`]).
    ///
    /// A ledger of more than [`ledger::LEDGER_INLINE`] entries is walked by `HSCAN`, a chunk at a time
    /// (one database query each), until the sale's share is spent; what is left waits for the next run. Every
    /// repair removes its entry, so the next run's walk holds what this one did not reach.
    pub(crate) async fn repair_ledger(
        &self,
        bucket: Bucket,
        snap: &Snapshot,
        now: DateTime<Utc>,
        mut walk: Walk,
        r: &mut ActivityReport,
    ) -> anyhow::Result<()> {
        if snap.complete {
            if walk.stop(r) {
                return Ok(());
            }
            return self
                .repair_entries(bucket, snap, &snap.ledger, now, &walk, r)
                .await;
        }
        // A ledger too large for the snapshot's one step, walked a chunk at a time.
        let mut cursor = "0".to_string();
        loop {
            if walk.stop(r) {
                return Ok(());
            }
            let (next, entries) = ledger::scan_entries(&self.redis, bucket, &cursor)
                .await
                .context("failed to read the ledger")?;
            // Between a chunk's read and its repairs: the consumer may settle its entries.
            pause::point("reconcile.ledger.after_chunk", bucket.activity_id).await;
            self.repair_entries(bucket, snap, &entries, now, &walk, r)
                .await?;
            if next == "0" {
                return Ok(());
            }
            cursor = next;
        }
    }

    /// The ledger's repairs for `entries` (at most [`ledger::LEDGER_INLINE`], one database
    /// query for their rows), one entry at a time until the run's hard end (the entries left
    /// wait in the ledger for the next run).
    async fn repair_entries(
        &self,
        bucket: Bucket,
        snap: &Snapshot,
        entries: &[LedgerEntry],
        now: DateTime<Utc>,
        walk: &Walk,
        r: &mut ActivityReport,
    ) -> anyhow::Result<()> {
        self.repair_reservations(bucket, snap, entries, now, walk, r)
            .await?;
        let stale = stale_entries(entries, now, self.config.reconcile_grace);
        self.repair_cancels(bucket, &stale, now, walk, r).await?;
        self.drop_stale_checks(bucket, &stale, walk, r).await?;
        self.repair_transfers(bucket, &stale, walk, r).await
    }

    /// The reservations among `entries` (of `snap`): applied when the database
    /// decided, given back when stale.
    async fn repair_reservations(
        &self,
        bucket: Bucket,
        snap: &Snapshot,
        entries: &[LedgerEntry],
        now: DateTime<Utc>,
        walk: &Walk,
        r: &mut ActivityReport,
    ) -> anyhow::Result<()> {
        let request_ids: Vec<Uuid> = entries.iter().filter_map(|e| e.request_id()).collect();
        if request_ids.is_empty() {
            return Ok(());
        }
        let rows: HashMap<Uuid, Order> = order::by_requests(&self.pool, &request_ids)
            .await
            .context("failed to look up the orders of pending reservations")?
            .into_iter()
            .map(|o| (o.request_id, o))
            .collect();
        for e in entries.iter().filter(|e| e.kind == EntryKind::Reservation) {
            if walk.over(r) {
                return Ok(());
            }
            let Some(request_id) = e.request_id() else {
                tracing::error!(user = %e.user_id, entry_id = %e.id, "unreadable reservation entry left alone");
                continue;
            };
            match rows.get(&request_id) {
                Some(row) => self.apply_decided(row, r).await?,
                // A draw's winner whose order the drawer has not written yet: not late.
                None if snap.held => {}
                None if is_stale(e, now, self.config.reconcile_grace) => {
                    self.give_back_stale(bucket, e, request_id, now, r).await?
                }
                None => {}
            }
        }
        Ok(())
    }

    /// Transfers between buckets older than the grace period: the buyer who borrowed the
    /// units never confirmed them in its home bucket (a crash between the two steps, or the
    /// answer lost). The home bucket is credited (it takes a transfer id once, so a buyer who
    /// did credit them, or does so later, adds nothing) and the entry dropped. Never given
    /// back to the donor: the buyer may still credit them, and the units would count twice.
    async fn repair_transfers(
        &self,
        donor: Bucket,
        stale: &[&LedgerEntry],
        walk: &Walk,
        r: &mut ActivityReport,
    ) -> anyhow::Result<()> {
        for e in stale.iter().filter(|e| e.kind == EntryKind::Transfer) {
            if walk.over(r) {
                return Ok(());
            }
            let (Some(id), Some((home, _))) = (e.transfer_id(), e.transfer) else {
                tracing::error!(field = %e.user_id, entry_id = %e.id, "unreadable transfer entry left alone");
                continue;
            };
            let home = donor.sibling(home);
            match buckets::finish_by_id(&self.redis, donor, home, id).await? {
                Some((credited @ (Credited::Now | Credited::Before), quantity)) => {
                    tracing::warn!(transfer = %id, from = donor.index, to = home.index, quantity, ?credited, repair = "transfer_finished", "transfer between buckets finished");
                    r.transfers_finished += 1;
                }
                Some((other, _)) => {
                    // A load from scratch is under way: it empties every bucket's ledger.
                    tracing::info!(transfer = %id, ?other, "transfer left to the load in progress");
                }
                None => {}
            }
        }
        Ok(())
    }

    /// Stale orphan-check marks: their check crashed; dropped.
    async fn drop_stale_checks(
        &self,
        bucket: Bucket,
        stale: &[&LedgerEntry],
        walk: &Walk,
        r: &mut ActivityReport,
    ) -> anyhow::Result<()> {
        for e in stale.iter().filter(|e| e.kind == EntryKind::Check) {
            if walk.over(r) {
                return Ok(());
            }
            if ledger::settle(&self.redis, bucket, &e.user_id, &e.id).await? {
                tracing::warn!(user = %e.user_id, repair = "check_dropped", "crashed orphan check's mark dropped");
                r.settled += 1;
            }
        }
        Ok(())
    }

    /// A reservation the database has decided: a `failed` row gives its units back (once), a
    /// live one drops the entry.
    async fn apply_decided(&self, row: &Order, r: &mut ActivityReport) -> anyhow::Result<()> {
        let user = row.user_id.as_str();
        let request_id = row.request_id;
        match giveback::apply(&self.redis, row).await? {
            Some(qty) => {
                tracing::warn!(user, %request_id, quantity = qty, reason = ?row.failure_reason, repair = "compensated", "failed request's units given back");
                r.compensated += 1;
            }
            None if row.status != OrderStatus::Failed => {
                tracing::info!(user, %request_id, repair = "settled", "reservation with an order dropped");
                r.settled += 1;
            }
            None => {}
        }
        Ok(())
    }

    /// A reservation older than the grace period with no row: claim and give it back.
    async fn give_back_stale(
        &self,
        bucket: Bucket,
        e: &LedgerEntry,
        request_id: Uuid,
        now: DateTime<Utc>,
        r: &mut ActivityReport,
    ) -> anyhow::Result<()> {
        let reservation = Attempt {
            request_id,
            activity_id: bucket.activity_id,
            user_id: e.user_id.clone(),
            quantity: e.quantity,
            buckets: bucket.count,
        };
        let age_ms = now.timestamp_millis() - e.at_ms;
        let done = giveback::give_back(
            &self.pool,
            &self.redis,
            &reservation,
            FailureReason::ReservationExpired,
        )
        .await?;
        match done {
            GiveBack::GivenBack(Some(qty)) | GiveBack::UnknownActivity(Some(qty)) => {
                tracing::warn!(user = %e.user_id, %request_id, quantity = qty, age_ms, repair = "compensated", "stale reservation given back");
                r.compensated += 1;
            }
            // The consumer committed (or refused) it between our read and our claim.
            GiveBack::Decided(_) => r.settled += 1,
            _ => {}
        }
        Ok(())
    }

    /// Stale cancel entries: finished when the order row names the entry's cancel id (that
    /// attempt committed and crashed before its Redis half), dropped otherwise.
    async fn repair_cancels(
        &self,
        bucket: Bucket,
        stale: &[&LedgerEntry],
        now: DateTime<Utc>,
        walk: &Walk,
        r: &mut ActivityReport,
    ) -> anyhow::Result<()> {
        let cancels: Vec<&LedgerEntry> = stale
            .iter()
            .copied()
            .filter(|e| e.kind == EntryKind::Cancel)
            .collect();
        if cancels.is_empty() {
            return Ok(());
        }
        let order_ids: Vec<i64> = cancels.iter().filter_map(|e| e.order_id).collect();
        let committed: HashSet<Uuid> = order::committed_cancel_ids(&self.pool, &order_ids)
            .await
            .context("failed to look up the orders of stale cancels")?
            .into_iter()
            .collect();
        for e in cancels {
            if walk.over(r) {
                return Ok(());
            }
            match self.repair_cancel(bucket, e, &committed, now).await? {
                CancelRepair::Finished => r.cancels_finished += 1,
                CancelRepair::Dropped => r.settled += 1,
                CancelRepair::Nothing => {}
            }
        }
        Ok(())
    }

    /// One stale cancel entry (the ledger's repairs, and the release when the entry holds
    /// back an unpaid order). Reconcile cannot tell a crashed attempt from a slow one, so
    /// before dropping the entry it aborts the attempt in the database (the attempt's commit
    /// then finds itself aborted); if the abort finds the order no longer confirmed, the row
    /// says whether this very attempt committed meanwhile, and then its half is finished.
    /// `committed`: cancel ids known to have committed (one query for a chunk; an empty set
    /// costs the abort's statement instead).
    pub(crate) async fn repair_cancel(
        &self,
        bucket: Bucket,
        e: &LedgerEntry,
        committed: &HashSet<Uuid>,
        now: DateTime<Utc>,
    ) -> anyhow::Result<CancelRepair> {
        let age_ms = now.timestamp_millis() - e.at_ms;
        let user = e.user_id.as_str();
        let (Some(cancel_id), Some(order_id)) = (e.cancel_id(), e.order_id) else {
            tracing::error!(user, entry_id = %e.id, "unreadable cancel entry left alone");
            return Ok(CancelRepair::Nothing);
        };
        let finish = committed.contains(&cancel_id)
            || (!cancel::abort_cancel(&self.pool, order_id, cancel_id).await?
                && order::get(&self.pool, order_id)
                    .await?
                    .is_some_and(|o| o.cancel_id == Some(cancel_id)));
        if finish {
            if let Some(qty) = ledger::cancel_finish(&self.redis, bucket, user, cancel_id).await? {
                tracing::warn!(user, %cancel_id, quantity = qty, age_ms, repair = "cancel_finished", "committed cancel finished in redis");
                return Ok(CancelRepair::Finished);
            }
        } else if ledger::settle(&self.redis, bucket, user, &e.id).await? {
            tracing::warn!(user, %cancel_id, age_ms, repair = "cancel_dropped", "cancel that never committed aborted and dropped");
            return Ok(CancelRepair::Dropped);
        }
        Ok(CancelRepair::Nothing)
    }
}

/// What [`Reconcile::repair_cancel`] did with a stale cancel entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CancelRepair {
    /// The attempt had committed: its Redis half is done now.
    Finished,
    /// The attempt never committed: aborted in the database, its entry dropped.
    Dropped,
    /// Someone else got there first (the entry was gone or changed).
    Nothing,
}
