//! Reconcile: keeps Redis honest against the database, on a schedule
//! (docs/invariants.md, "Reconcile"). [`Reconcile::run_by`] runs within a budget counted from
//! the invocation's start and ending before its deadline (`budget`): first the release of
//! unpaid orders past the payment timeout (`release`), then for every sale running or ended
//! within the key expiry buffer, each in its share: a draw sale's draw part (`draw`: its
//! rebuild, draw, record and winners' orders), the snapshot (a running sale Redis lost is loaded again), the
//! ledger's repairs (`ledger`), orphan users (`orphans`) and the lost fields of live
//! orders' holders (`fields`), the database against itself and Redis's stock against the
//! database (`stock`), and the numbers (`report`). Every Redis change is one guarded script
//! and every give-back is claimed in the database first, so it is safe while purchases run,
//! against a second reconcile, and when a run is cut short anywhere.

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use futures::FutureExt;
use seckill_shared::domain::activity::{self, Activity, Phase};
use seckill_shared::infra::shape::Function;
use seckill_shared::infra::sqs::{self, OrderQueue};
use seckill_shared::protocol::load;
use seckill_shared::store::buckets;
use seckill_shared::store::conn::Redis;
use seckill_shared::store::keys::Bucket;
use seckill_shared::store::ledger::Snapshot;
use seckill_shared::store::meta::PreheatOutcome;
use seckill_shared::{Config, Context};
use sqlx::PgPool;
use std::time::Instant;

mod budget;
mod draw;
mod fields;
mod ledger;
mod orphans;
mod refunds;
mod release;
mod report;
mod stock;

use budget::{Budget, Share};
use report::all_loaded;

pub use budget::FINISH_MARGIN;
pub use report::{
    drift, is_stale, stale_entries, ActivityReport, ReconcileFailure, ReconcileReport, StockCheck,
    FUNCTION,
};

/// The job's clients and settings, built once per cold start.
pub struct Reconcile {
    config: Config,
    pool: PgPool,
    redis: Redis,
    /// The draw entries' queue (`Config::entry_queue`), whose backlog a rebuilt draw sale's
    /// draw waits on (built on first use: most runs never ask).
    queue: tokio::sync::OnceCell<OrderQueue>,
    /// The payment provider, whose payments the release closes before an order's unit comes
    /// back (`None`: no provider configured).
    payments: Option<std::sync::Arc<dyn seckill_shared::infra::payments::Provider>>,
}

impl Reconcile {
    pub fn new(context: Context) -> Self {
        Self {
            payments: context.config.payments.provider(),
            config: context.config,
            pool: context.pool,
            redis: context.redis,
            queue: tokio::sync::OnceCell::new(),
        }
    }

    async fn queue(&self) -> &OrderQueue {
        self.queue
            .get_or_init(|| async {
                let client = sqs::sqs_client().await;
                OrderQueue::new(client, self.config.entry_queue(), self.config.sqs_timeout)
            })
            .await
    }

    /// Builds the clients the config names. The pool connects lazily, so a container whose
    /// database is briefly out of reach still starts and reports the failure per run.
    pub async fn connect(config: Config) -> anyhow::Result<Self> {
        Ok(Self::new(Context::connect(config).await?))
    }

    /// One reconcile pass at `now` (a parameter so tests can step past the grace period and the
    /// payment timeout without sleeping), in an invocation that starts now: its deadline is the
    /// function's Lambda Timeout (functions/shape.toml) away. See [`Self::run_by`].
    pub async fn run(&self, now: DateTime<Utc>) -> anyhow::Result<ReconcileReport> {
        let deadline = Instant::now() + Function::Reconcile.shape().timeout();
        self.run_by(now, deadline).await
    }

    /// One reconcile pass at `now`, in an invocation that ends at `deadline` (the Lambda
    /// context's). The run's budget (`RECONCILE_BUDGET_MS`) counts from now and ends before the
    /// deadline less a margin ([`FINISH_MARGIN`]) for the last call in flight and the report.
    /// The release takes up to a quarter of it; the due sales, least recently checked first,
    /// share what is left evenly, and a sale past the budget is not started: it is checked
    /// first by the next run. Fails only when the list of activities cannot be read; one
    /// activity's failure is logged and reported and does not stop the others.
    #[tracing::instrument(skip_all, fields(now = %now))]
    pub async fn run_by(
        &self,
        now: DateTime<Utc>,
        deadline: Instant,
    ) -> anyhow::Result<ReconcileReport> {
        let budget = Budget::starting_now(self.config.reconcile_budget, deadline);
        let mut report = ReconcileReport::default();
        let release = budget.release();
        self.refund_owed_in(now, release, &mut report).await;
        let released = self.release_unpaid_in(now, release, &mut report).await;

        let due = activity::due_for_reconcile(
            &self.pool,
            now,
            self.config.preheat_lead,
            self.config.expiry_buffer,
        )
        .await
        .context("failed to list activities due for reconcile")?;
        for (i, a) in due.iter().enumerate() {
            let Some(share) = budget.sale(i, due.len()) else {
                report.deferred_ids.push(a.id);
                continue;
            };
            // Boxed: each activity's future is deep (many awaited Redis and SQL steps), and
            // inlined into the run's future its layout needs more than the compiler's default
            // query depth.
            match self.reconcile_activity(a, now, share).boxed().await {
                Ok(mut r) => {
                    r.released_unpaid = released.get(&a.id).copied().unwrap_or(0);
                    report::publish(&r);
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
            release_repaired = report.release_repaired,
            deferred = report.deferred_ids.len(),
            errors = report.errors.len(),
            "reconcile finished"
        );
        Ok(report)
    }

    /// Every check of one activity, within its `share` of the run: the draw part takes the
    /// first half of it; the ledger's repairs and the orphan check per bucket, and the lost
    /// fields, stop when it is spent (one bucket's after a chunk at least) and go on next run;
    /// the fixed steps after them (the database's count, the stock fix, the numbers) always run,
    /// so a sale whose share ran out still records what was checked and goes behind the others.
    #[tracing::instrument(skip_all, fields(activity_id = a.id))]
    async fn reconcile_activity(
        &self,
        a: &Activity,
        now: DateTime<Utc>,
        share: Share,
    ) -> anyhow::Result<ActivityReport> {
        let id = a.id;
        let mut r = ActivityReport::new(id);

        // The draw part (a draw sale): its rebuild, its draw if due, and its winners' messages.
        // Before the snapshot, so that the ledger it reads shows every sent reservation
        // restamped.
        if a.draw_end_ms() > 0 {
            self.draw_and_order(a, share.first_half(), &mut r).await?;
        }

        // The snapshot; a running sale missing from Redis is loaded now.
        let snaps = self.snapshot_loading(a, now, share.hard, &mut r).await?;

        if all_loaded(&snaps) {
            // One bucket a run, in turn, starts its walks even past the share: every walk
            // of the sale progresses each run, by one chunk at least, not one per bucket.
            let count = i64::from(a.bucket_count());
            let favoured = now.timestamp().div_euclid(60).rem_euclid(count);
            for (bucket, snap) in &snaps {
                let start = Walk::new(share, i64::from(bucket.index) == favoured);
                // The ledger's repairs: stale entries, and transfers between buckets left half done.
                self.repair_ledger(*bucket, snap, now, start, &mut r)
                    .await?;
                // The orphan check: users with nothing behind them.
                r.users_dropped += self.drop_orphan_users(*bucket, now, start, &mut r).await?;
            }
            // The lost fields, the other way: holders of a live order whose field Redis lost.
            let start = Walk::new(share, true);
            r.fields_restored = self.restore_lost_fields(a, now, start, &mut r).await?;
        }

        // The database's count: the database against itself.
        let (sold, db_remaining, fixed_from) = self.check_database(id).await?;
        r.db_stock_fixed_from = fixed_from;

        // The stock fix: Redis stock from the database, only when the ledger is quiet.
        r.stock_check = self.correct_stock(a).await?;

        // The numbers, as they stand after the repairs.
        let snaps = self.snapshots(a).await?;
        r.count(&snaps, a.total_stock, sold, db_remaining);
        self.persist(&r).await?;
        Ok(r)
    }

    /// Every bucket's snapshot, bucket 0 first: each one bounded call, a ledger of more than
    /// `LEDGER_INLINE` entries not read (the ledger's repairs walk it).
    async fn snapshots(&self, a: &Activity) -> anyhow::Result<Vec<(Bucket, Snapshot)>> {
        buckets::heads(&self.redis, a.id, a.bucket_count())
            .await
            .context("failed to snapshot redis")
    }

    /// The snapshot: the sale's snapshots; a running sale missing from Redis (any bucket of it) is
    /// loaded first.
    async fn snapshot_loading(
        &self,
        a: &Activity,
        now: DateTime<Utc>,
        hard: Instant,
        r: &mut ActivityReport,
    ) -> anyhow::Result<Vec<(Bucket, Snapshot)>> {
        let snaps = self.snapshots(a).await?;
        if all_loaded(&snaps) || a.phase(now) != Phase::Running {
            return Ok(snaps);
        }
        // Not begun past the run's hard end; a draw sale's pool rebuild stops there (the next
        // run's draw part goes on from its cursor).
        let (outcome, _) = load::load_under_lock(&self.redis, &self.pool, &self.config, a.id, hard)
            .await
            .context("failed to load the running sale into redis")?;
        tracing::warn!(
            ?outcome,
            repair = "preheated",
            "running sale was missing from redis"
        );
        r.preheated = outcome == PreheatOutcome::Loaded;
        self.snapshots(a).await
    }

    /// The numbers: upserts the activity's row of `activity_stats`.
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

/// When one of a sale's walks (over a bucket's ledger or `users`, or the live orders) stops.
#[derive(Clone, Copy)]
pub(crate) struct Walk {
    /// The sale's share of the run.
    pub share: Share,
    /// Whether the first chunk runs even past the share's end (never past the run's hard end).
    pub first_anyway: bool,
    /// Whether a chunk ran already.
    pub started: bool,
}

impl Walk {
    pub fn new(share: Share, first_anyway: bool) -> Self {
        Self {
            share,
            first_anyway,
            started: false,
        }
    }

    /// Whether the walk stops before its next chunk; a stop is recorded in the sale's report.
    pub fn stop(&mut self, r: &mut ActivityReport) -> bool {
        let stop =
            self.share.over() || ((self.started || !self.first_anyway) && self.share.spent());
        self.started = true;
        r.out_of_time |= stop;
        stop
    }

    /// Whether the repairs within a chunk stop before the next entry: the run's hard end has
    /// passed (what is left stays in the ledger for the next run).
    pub fn over(&self, r: &mut ActivityReport) -> bool {
        let over = self.share.over();
        r.out_of_time |= over;
        over
    }
}
