//! Reconcile: keeps Redis honest against the database (`docs/invariants.md`, "Reconcile").
//!
//! On its schedule, for every activity running or ended within the key expiry buffer
//! ([`activity::due_for_reconcile`]), [`Reconcile::run`]:
//!
//! 1. **Snapshots** the activity's Redis state in one script (`lua/snapshot.lua`). A running
//!    sale missing from Redis is loaded here, fenced under its lock and with its `users`
//!    rebuilt from the live orders (`seckill_shared::load`), so a flushed or failed-over cache
//!    does not wait for the next preheat; an upcoming sale is left to preheat.
//! 2. **Repairs the ledger**:
//!    - a reservation `r|requestId` whose request has a row, at any age, gets what the row
//!      says (`giveback::apply`): a `failed` row's units go back (its claimer may have crashed
//!      before giving them back), a live row's entry is dropped;
//!    - a reservation older than `reconcile_grace` with no row is given back through the
//!      arbiter (`giveback::give_back`, `reservation_expired`): the claim makes a late
//!      consumer's commit fail as a duplicate;
//!    - a stale cancel `c|cancelId|..|orderId` is finished (`sale::cancel_finish`) when the
//!      order row records that cancel id, and dropped otherwise (that attempt never
//!      committed); a stale orphan-check mark is dropped.
//! 3. **Drops orphan users**: in the Redis `users` hash with neither a ledger entry nor a live order.
//!    Candidates are marked in the ledger before the database is read, and removed only while
//!    the mark is still there (`lua/mark_users.lua`, `lua/drop_user.lua`).
//! 4. **Checks the database against itself**: under `select ... for update` on the activity
//!    row, `remaining_stock` must equal `total_stock - sold`; if not, the database is fixed.
//! 5. **Corrects Redis stock** from the database, but only when the ledger is quiet, under the
//!    activity's lock, and only if the stock sequence is still the one read with the stock
//!    (`lua/fix_stock.lua`).
//! 6. **Persists** the numbers to `activity_stats` and 7. **reports** drift and repairs as
//!    structured logs and an EMF metric line per activity.
//!
//! Before the activities, it **releases unpaid orders**: `confirmed` orders older than
//! `payment_timeout` are cancelled with [`lifecycle::cancel_order`] (a bounded batch per run).
//!
//! # Why it is safe while purchases run, and against itself
//!
//! Reconcile never decides anything from a Redis read that another actor could have
//! invalidated in between: every Redis change it makes is one script that re-checks its
//! precondition atomically, and every give-back is claimed in the database first.
//!
//! - Compensate, settle and cancel-finish are guarded by the exact ledger entry and remove it,
//!   so two reconciles, or reconcile and the consumer, apply each at most once. The grace period
//!   keeps reconcile away from reservations whose message is simply still on its way; the
//!   claim keeps it from racing a consumer that is committing one.
//! - An orphan user is dropped only if its mark, written before the database was read, is
//!   still there: a cancel overwrites it, so a user who cancelled and bought again meanwhile
//!   is kept.
//! - The stock is corrected only while the ledger is empty: then nothing is between Redis and
//!   the database, and the database's remaining stock is exactly what Redis may sell. The
//!   order of reads matters: Redis (stock and sequence) first, then the database, then a
//!   script that writes only if the ledger is still empty and the sequence unchanged. Any
//!   purchase, give-back or cancel finish in between bumped the sequence, even when the stock
//!   value came back to what was read, and the write is skipped. So reconcile can never set
//!   Redis stock from a database read that a concurrent move made stale. The activity's lock
//!   keeps an admin's stock change from interleaving, and a second reconcile that finds the
//!   lock busy skips the step for this run.
//! - The database fix holds the activity row lock while it sums the orders, so a consumer or a
//!   cancel committing concurrently is either fully counted or not at all.

use anyhow::Context;
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use futures::{FutureExt, StreamExt};
use seckill_shared::activity::{self, Activity, Phase};
use seckill_shared::cache::{CacheError, Redis};
use seckill_shared::giveback::{self, GiveBack};
use seckill_shared::keys::{Bucket, SENTINEL};
use seckill_shared::lifecycle::{self, CancelOutcome};
use seckill_shared::order::Order;
use seckill_shared::order::{reason, OrderStatus};
use seckill_shared::queue::{self, OrderMessage, OrderQueue};
use seckill_shared::sale::{self, EntryKind, LedgerEntry, Snapshot};
use seckill_shared::{buckets, draw, load, lock, order, Config, Deps};
use serde::Serialize;
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use uuid::Uuid;

/// The function name used in metrics.
pub const FUNCTION: &str = "reconcile";

/// Unpaid orders released per run at most; the rest wait for the next run.
pub const RELEASE_BATCH: i64 = 500;

/// Cancellations of unpaid orders in flight at once.
const RELEASE_CONCURRENCY: usize = 8;

/// Users checked against the database per query.
const USER_CHUNK: usize = 1000;

/// How long reconcile waits for an activity's lock before skipping the stock correction.
const LOCK_WAIT: Duration = Duration::from_millis(300);

/// The job's clients and settings, built once per cold start: the [`Deps`] and nothing else
/// (`self.pool`, `self.config`, `self.redis` read through it).
pub struct Reconcile {
    deps: Deps,
    /// The order queue, for a draw sale's winners (built on first use: most runs send nothing).
    queue: tokio::sync::OnceCell<OrderQueue>,
}

impl std::ops::Deref for Reconcile {
    type Target = Deps;

    fn deref(&self) -> &Deps {
        &self.deps
    }
}

/// What one run did, returned as the Lambda's JSON result.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReconcileReport {
    pub activities: Vec<ActivityReport>,
    /// Unpaid orders cancelled by this run.
    pub released_unpaid: usize,
    /// Unpaid orders left for the next run (the user had another entry in flight).
    pub release_deferred: usize,
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

/// What happened to the Redis stock of one activity (step 5).
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
    /// Order messages of a draw's winners this run sent from the outbox.
    pub winners_sent: usize,
    /// Entries of a draw's pool answered 503 and left there, taken out by this run.
    pub pool_left: usize,
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
    /// `redis_stock + pending_qty + transfer_qty + sold - total` (0 when conserved); with the
    /// activity not in Redis, the database's own `db_remaining + sold - total`.
    pub drift: i64,
    /// Everything this run changed for the activity (the release of unpaid orders excluded).
    pub repairs: usize,
}

impl Reconcile {
    pub fn new(deps: Deps) -> Self {
        Self {
            deps,
            queue: tokio::sync::OnceCell::new(),
        }
    }

    async fn queue(&self) -> &OrderQueue {
        self.queue
            .get_or_init(|| async {
                let client = queue::sqs_client().await;
                OrderQueue::new(
                    client,
                    &self.config.order_queue_url,
                    self.config.sqs_timeout,
                )
            })
            .await
    }

    /// Builds the clients the config names. The pool connects lazily, so a container whose
    /// database is briefly out of reach still starts and reports the failure per run.
    pub async fn connect(config: Config) -> anyhow::Result<Self> {
        Ok(Self::new(Deps::connect(config).await?))
    }

    /// One reconcile pass at `now` (a parameter so tests can step past the grace period and the
    /// payment timeout without sleeping). Fails only when the list of activities cannot be
    /// read; one activity's failure is logged and reported and does not stop the others.
    #[tracing::instrument(skip_all, fields(now = %now))]
    pub async fn run(&self, now: DateTime<Utc>) -> anyhow::Result<ReconcileReport> {
        let mut report = ReconcileReport::default();
        let released = self.release_unpaid(now, &mut report).await;

        let due = activity::due_for_reconcile(
            &self.pool,
            now,
            self.config.preheat_lead,
            self.config.expiry_buffer,
        )
        .await
        .context("failed to list activities due for reconcile")?;
        for a in &due {
            // Boxed: each activity's future is deep (many awaited Redis and SQL steps), and
            // inlined into the run's future its layout needs more than the compiler's default
            // query depth.
            match self.reconcile_activity(a, now).boxed().await {
                Ok(mut r) => {
                    r.released_unpaid = released.get(&a.id).copied().unwrap_or(0);
                    publish(&r);
                    report.activities.push(r);
                }
                Err(e) => {
                    tracing::error!(
                        activity_id = a.id,
                        error = format!("{e:#}"),
                        "reconcile of activity failed"
                    );
                    report.errors.push(ReconcileFailure {
                        activity_id: Some(a.id),
                        order_id: None,
                        message: format!("{e:#}"),
                    });
                }
            }
        }
        tracing::info!(
            activities = report.activities.len(),
            released_unpaid = report.released_unpaid,
            release_deferred = report.release_deferred,
            errors = report.errors.len(),
            "reconcile finished"
        );
        Ok(report)
    }

    /// Cancels up to [`RELEASE_BATCH`] orders left unpaid past the payment timeout, oldest
    /// first. Returns how many were released per activity.
    pub async fn release_unpaid(
        &self,
        now: DateTime<Utc>,
        report: &mut ReconcileReport,
    ) -> HashMap<i64, usize> {
        let mut released = HashMap::new();
        let timeout = ChronoDuration::from_std(self.config.payment_timeout)
            .unwrap_or(ChronoDuration::minutes(15));
        let unpaid = order::unpaid_before(&self.pool, now - timeout, RELEASE_BATCH).await;
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
                let result = lifecycle::cancel_order(pool, redis, &o, now).await;
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

    /// Steps 1-6 for one activity; steps 2, 3 and the transfers per bucket.
    #[tracing::instrument(skip_all, fields(activity_id = a.id))]
    async fn reconcile_activity(
        &self,
        a: &Activity,
        now: DateTime<Utc>,
    ) -> anyhow::Result<ActivityReport> {
        let id = a.id;
        let mut r = ActivityReport::new(id);

        // 0. A draw sale: its draw, if due and not run, and its winners' messages. Before the
        // snapshot, so that the ledger it reads shows every sent reservation restamped.
        if a.draw_end_ms() > 0 {
            self.draw_and_send(a, &mut r).await?;
        }

        // 1. Snapshot; a running sale missing from Redis is loaded now.
        let snaps = self.snapshot_loading(a, now, &mut r).await?;

        if all_loaded(&snaps) {
            for (bucket, snap) in &snaps {
                // 2. Stale ledger entries, and transfers between buckets left half done.
                self.repair_ledger(*bucket, snap, now, &mut r).await?;
                self.repair_transfers(*bucket, snap, now, &mut r).await?;
                // 3. Users with nothing behind them.
                r.users_dropped += self.drop_orphan_users(*bucket, now).await?;
            }
        }

        // 4. The database against itself.
        let (sold, db_remaining, fixed_from) = self.check_database(id).await?;
        r.db_stock_fixed_from = fixed_from;

        // 5. Redis stock from the database, only when the ledger is quiet.
        r.stock_check = self.correct_stock(a).await?;

        // 6. The numbers, as they stand after the repairs.
        let snaps = self.snapshots(a).await?;
        r.count(&snaps, a.total_stock, sold, db_remaining);
        self.persist(&r).await?;
        Ok(r)
    }

    /// Step 0: the draw nobody has run since the window closed, and the outbox's sends.
    async fn draw_and_send(&self, a: &Activity, r: &mut ActivityReport) -> anyhow::Result<()> {
        // Entries answered 503 whose give-back a stalled Redis or a frozen container left.
        let left = draw::leave_unanswered(&self.redis, &self.pool, a.id)
            .await
            .context("failed to take unanswered entries out of the pool")?;
        r.pool_left = left;
        let drawn = draw::draw(&self.redis, a.id, draw::seed())
            .await
            .context("failed to run the draw")?;
        if let draw::Drawn::Now {
            winners,
            units,
            entrants,
        } = drawn
        {
            tracing::warn!(
                winners,
                units,
                entrants,
                repair = "drawn",
                "draw ran from reconcile"
            );
            r.drawn = true;
        }
        if !drawn.is_done() || draw::unsent(&self.redis, a.id).await? == 0 {
            return Ok(());
        }
        match draw::drain(&self.redis, self.queue().await, a.id, usize::MAX).await {
            Ok(d) => r.winners_sent = d.sent,
            // Left in the outbox for the next drainer; nothing is given back for it.
            Err(e) => tracing::warn!(error = %e, "draw winners not all sent"),
        }
        Ok(())
    }

    /// Every bucket's snapshot, bucket 0 first.
    async fn snapshots(&self, a: &Activity) -> anyhow::Result<Vec<(Bucket, Snapshot)>> {
        buckets::snapshots(&self.redis, a.id, a.bucket_count())
            .await
            .context("failed to snapshot redis")
    }

    /// Step 1: the sale's snapshots; a running sale missing from Redis (any bucket of it) is
    /// loaded first.
    async fn snapshot_loading(
        &self,
        a: &Activity,
        now: DateTime<Utc>,
        r: &mut ActivityReport,
    ) -> anyhow::Result<Vec<(Bucket, Snapshot)>> {
        let snaps = self.snapshots(a).await?;
        if all_loaded(&snaps) || a.phase(now) != Phase::Running {
            return Ok(snaps);
        }
        let (outcome, _) = load::load_under_lock(&self.redis, &self.pool, &self.config, a.id)
            .await
            .context("failed to load the running sale into redis")?;
        tracing::warn!(
            ?outcome,
            repair = "preheated",
            "running sale was missing from redis"
        );
        r.preheated = outcome == sale::PreheatOutcome::Loaded;
        self.snapshots(a).await
    }

    /// Step 2: every ledger entry whose fate is decided, or that a crash left behind.
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
    async fn repair_ledger(
        &self,
        bucket: Bucket,
        snap: &Snapshot,
        now: DateTime<Utc>,
        r: &mut ActivityReport,
    ) -> anyhow::Result<()> {
        self.repair_reservations(bucket, snap, now, r).await?;
        let stale = stale_entries(&snap.ledger, now, self.config.reconcile_grace);
        self.repair_cancels(bucket, &stale, now, r).await?;
        self.drop_stale_checks(bucket, &stale, r).await
    }

    /// The reservations of step 2: applied when the database decided, given back when stale.
    async fn repair_reservations(
        &self,
        bucket: Bucket,
        snap: &Snapshot,
        now: DateTime<Utc>,
        r: &mut ActivityReport,
    ) -> anyhow::Result<()> {
        let request_ids: Vec<Uuid> = snap.ledger.iter().filter_map(|e| e.request_id()).collect();
        if request_ids.is_empty() {
            return Ok(());
        }
        let rows: HashMap<Uuid, Order> = order::by_requests(&self.pool, &request_ids)
            .await
            .context("failed to look up the orders of pending reservations")?
            .into_iter()
            .map(|o| (o.request_id, o))
            .collect();
        for e in snap
            .ledger
            .iter()
            .filter(|e| e.kind == EntryKind::Reservation)
        {
            let Some(request_id) = e.request_id() else {
                tracing::error!(user = %e.user_id, entry_id = %e.id, "unreadable reservation entry left alone");
                continue;
            };
            match rows.get(&request_id) {
                Some(row) => self.apply_decided(row, r).await?,
                // A draw's winner whose message waits in the outbox: not late, only unsent.
                None if snap.is_unsent(&e.id) => {}
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
        snap: &Snapshot,
        now: DateTime<Utc>,
        r: &mut ActivityReport,
    ) -> anyhow::Result<()> {
        let stale = stale_entries(&snap.ledger, now, self.config.reconcile_grace);
        for e in stale.iter().filter(|e| e.kind == EntryKind::Transfer) {
            let (Some(id), Some((home, _))) = (e.transfer_id(), e.transfer) else {
                tracing::error!(field = %e.user_id, entry_id = %e.id, "unreadable transfer entry left alone");
                continue;
            };
            let home = donor.sibling(home);
            match buckets::finish_by_id(&self.redis, donor, home, id).await? {
                Some((credited @ (sale::Credited::Now | sale::Credited::Before), quantity)) => {
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

    /// Stale orphan-check marks of step 2: their check crashed; dropped.
    async fn drop_stale_checks(
        &self,
        bucket: Bucket,
        stale: &[&LedgerEntry],
        r: &mut ActivityReport,
    ) -> anyhow::Result<()> {
        for e in stale.iter().filter(|e| e.kind == EntryKind::Check) {
            if sale::settle(&self.redis, bucket, &e.user_id, &e.id).await? {
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
            None if row.status != OrderStatus::Failed.as_str() => {
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
        let reservation = OrderMessage {
            request_id,
            activity_id: bucket.activity_id,
            user_id: e.user_id.clone(),
            quantity: e.quantity as i32,
            reserved_at_ms: e.at_ms,
            load_epoch: None,
            buckets: Some(bucket.count),
        };
        let age_ms = now.timestamp_millis() - e.at_ms;
        let done = giveback::give_back(
            &self.pool,
            &self.redis,
            &reservation,
            reason::RESERVATION_EXPIRED,
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
            self.repair_cancel(bucket, e, &committed, now, r).await?;
        }
        Ok(())
    }

    /// One stale cancel entry. Reconcile cannot tell a crashed attempt from a slow one, so
    /// before dropping the entry it aborts the attempt in the database (the attempt's commit
    /// then finds itself aborted); if the abort finds the order no longer confirmed, the row
    /// says whether this very attempt committed meanwhile, and then its half is finished.
    async fn repair_cancel(
        &self,
        bucket: Bucket,
        e: &LedgerEntry,
        committed: &HashSet<Uuid>,
        now: DateTime<Utc>,
        r: &mut ActivityReport,
    ) -> anyhow::Result<()> {
        let age_ms = now.timestamp_millis() - e.at_ms;
        let user = e.user_id.as_str();
        let (Some(cancel_id), Some(order_id)) = (e.cancel_id(), e.order_id) else {
            tracing::error!(user, entry_id = %e.id, "unreadable cancel entry left alone");
            return Ok(());
        };
        let finish = committed.contains(&cancel_id)
            || (!lifecycle::abort_cancel(&self.pool, order_id, cancel_id).await?
                && order::get(&self.pool, order_id)
                    .await?
                    .is_some_and(|o| o.cancel_id == Some(cancel_id)));
        if finish {
            if let Some(qty) = sale::cancel_finish(&self.redis, bucket, user, cancel_id).await? {
                tracing::warn!(user, %cancel_id, quantity = qty, age_ms, repair = "cancel_finished", "committed cancel finished in redis");
                r.cancels_finished += 1;
            }
        } else if sale::settle(&self.redis, bucket, user, &e.id).await? {
            tracing::warn!(user, %cancel_id, age_ms, repair = "cancel_dropped", "cancel that never committed aborted and dropped");
            r.settled += 1;
        }
        Ok(())
    }

    /// Step 3: removes users in a bucket's `users` with neither a ledger entry nor a live
    /// order.
    ///
    /// `users` is scanned first and the ledger read after it; each candidate then gets a mark
    /// in the ledger (`lua/mark_users.lua`) *before* the database is read, and is removed only
    /// if the mark is still there (`lua/drop_user.lua`). Anything the user does meanwhile (a
    /// cancel, which begins by overwriting the mark, and so any re-purchase after it) removes
    /// the mark, and the user is kept.
    async fn drop_orphan_users(&self, bucket: Bucket, now: DateTime<Utc>) -> anyhow::Result<usize> {
        let id = bucket.activity_id;
        let users = scan_users(&self.redis, bucket)
            .await
            .context("failed to scan the users")?;
        if users.is_empty() {
            return Ok(0);
        }
        let keys = self.redis.bucket_keys(bucket);
        let ledger: Vec<String> = self
            .redis
            .cmd(redis::cmd("HKEYS").arg(&keys.ledger))
            .await
            .context("failed to read the ledger")?;
        let ledger: HashSet<String> = ledger.into_iter().collect();
        let candidates: Vec<String> = users.into_iter().filter(|u| !ledger.contains(u)).collect();

        let token = Uuid::new_v4().simple().to_string();
        let mut dropped = 0;
        for chunk in candidates.chunks(USER_CHUNK) {
            let marked =
                sale::mark_users(&self.redis, bucket, &token, now.timestamp_millis(), chunk)
                    .await
                    .context("failed to mark the orphan candidates")?;
            seckill_shared::pause::point("reconcile.orphans.before_db_check", id).await;
            let active: HashSet<String> = order::live_holders_among(&self.pool, id, &marked)
                .await
                .context("failed to look up the orders of users in `users`")?
                .into_iter()
                .collect();
            seckill_shared::pause::point("reconcile.orphans.before_drop", id).await;
            for user in &marked {
                let orphan = !active.contains(user);
                if sale::drop_user(&self.redis, bucket, user, &token, orphan).await? {
                    tracing::warn!(
                        user = user.as_str(),
                        repair = "user_dropped",
                        "user with nothing behind them removed from users"
                    );
                    dropped += 1;
                }
            }
        }
        Ok(dropped)
    }

    /// Step 4: `remaining_stock = total_stock - sold`, checked and fixed in one transaction that
    /// holds the activity row. Returns (sold, remaining after the check, remaining before a fix).
    async fn check_database(&self, id: i64) -> anyhow::Result<(i64, i64, Option<i64>)> {
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
        let (total, remaining) = (i64::from(total), i64::from(remaining));
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
        activity::set_remaining_stock(&mut *tx, id, expected as i32)
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

    /// Step 5: Redis stock := database remaining stock, only while nothing is in flight.
    async fn correct_stock(&self, a: &Activity) -> anyhow::Result<StockCheck> {
        let id = a.id;
        seckill_shared::pause::point("reconcile.stock.before_lock", id).await;
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
        seckill_shared::pause::point("reconcile.stock.after_snapshot", id).await;
        if !all_loaded(&before) {
            return Ok(StockCheck::NotLoaded);
        }
        if !quiet(&before) {
            return Ok(StockCheck::LedgerBusy);
        }
        // Fenced like an admin write: a holder whose lease ran out (an admin lower between its
        // Redis step and its commit, say) can no longer commit once this token is recorded,
        // so the remaining stock read here stays the truth the fix writes.
        let target = i64::from(
            load::fence_and_read(&self.pool, guard, false)
                .await
                .context("failed to fence and read the activity")?
                .remaining_stock,
        );
        let snaps = if before.len() > 1 {
            let after = self.snapshots(a).await?;
            let unmoved = before
                .iter()
                .zip(&after)
                .all(|((_, b), (_, a))| a.loaded && a.ledger.is_empty() && a.seq == b.seq);
            if !unmoved {
                return Ok(StockCheck::Moved);
            }
            after
        } else {
            before
        };
        seckill_shared::pause::point("reconcile.stock.before_fix", id).await;
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
                sale::fix_stock(&self.redis, *bucket, &guard.owner, snap.seq, stock + step).await?;
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
        let remaining = activity::remaining_stock(&self.pool, id)
            .await
            .and_then(|r| r.ok_or(sqlx::Error::RowNotFound))
            .context("failed to read the remaining stock")?;
        Ok(i64::from(remaining))
    }

    /// Step 6: upserts the activity's row of `activity_stats`.
    async fn persist(&self, r: &ActivityReport) -> anyhow::Result<()> {
        let stats = activity::Stats {
            participants: r.participants,
            sold: r.sold,
            db_remaining: r.db_remaining,
            redis_stock: r.redis_stock,
            pending_qty: r.pending_qty,
            drift: r.drift,
            repairs: r.repairs as i64,
        };
        activity::record_stats(&self.pool, r.activity_id, &stats)
            .await
            .context("failed to persist activity stats")?;
        Ok(())
    }
}

/// Step 7: one structured log line and one EMF line per activity.
fn publish(r: &ActivityReport) {
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
    seckill_shared::metrics::emit(
        FUNCTION,
        &[
            ("Drift", r.drift as f64),
            ("Repairs", r.repairs as f64),
            ("ReleasedUnpaid", r.released_unpaid as f64),
        ],
        &[("activityId", json!(r.activity_id))],
    );
}

impl ActivityReport {
    /// A report with nothing found yet.
    fn new(activity_id: i64) -> Self {
        Self {
            activity_id,
            preheated: false,
            drawn: false,
            winners_sent: 0,
            pool_left: 0,
            compensated: 0,
            settled: 0,
            cancels_finished: 0,
            transfers_finished: 0,
            users_dropped: 0,
            db_stock_fixed_from: None,
            stock_check: StockCheck::NotLoaded,
            released_unpaid: 0,
            participants: 0,
            sold: 0,
            db_remaining: 0,
            redis_stock: None,
            pending_qty: 0,
            transfer_qty: 0,
            drift: 0,
            repairs: 0,
        }
    }

    /// Step 6: the numbers after the repairs, from the final snapshot and the database check.
    fn count(
        &mut self,
        snaps: &[(Bucket, Snapshot)],
        total_stock: i32,
        sold: i64,
        db_remaining: i64,
    ) {
        self.sold = sold;
        self.db_remaining = db_remaining;
        self.participants = snaps.iter().map(|(_, s)| s.participants).sum();
        self.pending_qty = snaps.iter().map(|(_, s)| s.pending_quantity()).sum();
        self.transfer_qty = snaps.iter().map(|(_, s)| s.transfer_quantity()).sum();
        self.redis_stock = all_loaded(snaps).then(|| stock_sum(snaps));
        let total = i64::from(total_stock);
        self.drift = match self.redis_stock {
            Some(stock) => drift(stock, self.pending_qty + self.transfer_qty, sold, total),
            None => db_remaining + sold - total,
        };
        self.repairs = self.compensated
            + usize::from(self.drawn)
            + self.winners_sent
            + self.pool_left
            + self.settled
            + self.cancels_finished
            + self.transfers_finished
            + self.users_dropped
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

/// Whether every bucket is loaded.
fn all_loaded(snaps: &[(Bucket, Snapshot)]) -> bool {
    snaps.iter().all(|(_, s)| s.loaded)
}

/// Whether nothing is in flight in any bucket (no ledger entry but the sentinel).
fn quiet(snaps: &[(Bucket, Snapshot)]) -> bool {
    snaps.iter().all(|(_, s)| s.ledger.is_empty())
}

/// The stock of all buckets together.
fn stock_sum(snaps: &[(Bucket, Snapshot)]) -> i64 {
    snaps.iter().filter_map(|(_, s)| s.stock).sum()
}

/// Every user of a bucket's `users` hash, by `HSCAN` (never one huge `HKEYS` reply), without
/// the sentinel field.
async fn scan_users(redis: &Redis, bucket: Bucket) -> Result<Vec<String>, CacheError> {
    let keys = redis.bucket_keys(bucket);
    let mut cursor = "0".to_string();
    let mut users = Vec::new();
    loop {
        let (next, batch): (String, Vec<String>) = redis
            .cmd(
                redis::cmd("HSCAN")
                    .arg(&keys.users)
                    .arg(&cursor)
                    .arg("COUNT")
                    .arg(1000),
            )
            .await?;
        // Field, value, field, value... (`NOVALUES` needs Redis 7.4).
        let fields = batch.into_iter().step_by(2);
        users.extend(fields.filter(|u| u != SENTINEL));
        if next == "0" {
            break;
        }
        cursor = next;
    }
    // HSCAN may return a field more than once.
    users.sort_unstable();
    users.dedup();
    Ok(users)
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
