//! Preheat: loads every published activity that starts within the lead time (or is already
//! running and missing from Redis) into Redis, so the purchase script finds its stock, window
//! and limit (all in the meta hash), and `users` and the ledger already there with the sale's
//! expiry (each holds a sentinel field, so it never empties out and loses it) when it opens.
//!
//! # Idempotent by construction
//!
//! Each activity is loaded by one Lua script (`lua/preheat.lua`, via [`sale::preheat`]) that
//! writes the stock only into a meta it creates, never `INCR` and never over a loaded sale:
//! running preheat twice, concurrently with itself, or while purchases decrement the stock,
//! never resets a loaded sale. A meta hash that is already there is only replaced by a newer
//! `config_version` (an admin change). The keys expire `expiry_buffer` after the sale ends, so nothing lingers.
//!
//! A load is fenced like an admin write (`seckill_shared::load`): it holds the sale's lock,
//! records its token while reading the row, and rebuilds `users` from the live orders
//! when Redis does not hold the sale, so a sale Redis lost keeps its one-order-per-user memory.
//!
//! # Why the stock keys must not be evictable
//!
//! Redis holds the sale's live truth between the purchase and the order row: the stock, the
//! set of users who bought, the ledger of in-flight reservations. The cache must run with
//! `maxmemory-policy noeviction` (writes fail loudly when memory is full, and the entry answers
//! 503). Under any `volatile-*` or `allkeys-*` policy, and on ElastiCache Serverless, which evicts
//! keys carrying a TTL under memory pressure (ours all carry one), Redis may silently drop them:
//!
//! - a lost **meta** (which holds the stock) makes the sale look not loaded until it is
//!   re-seeded from the database's remaining stock, which does not know the reservations still
//!   in flight;
//! - a lost **`users`** lets a user who already bought try again; only the database's unique
//!   index on `(activity_id, user_id)` catches the second order;
//! - a lost **ledger** hides crashed reservations from reconcile, so their units stay lost until
//!   the stock is corrected from the database.
//!
//! So the cache is sized for every running sale and its eviction policy is part of the
//! deployment (a node-based cluster with a `noeviction` parameter group), not a tuning knob.

use anyhow::Context;
use chrono::{DateTime, Utc};
use seckill_shared::activity::{self, Activity};
use seckill_shared::keys::Bucket;
use seckill_shared::load::{self, LoadError};
use seckill_shared::lock::LockError;
use seckill_shared::sale::{self, PreheatOutcome};
use seckill_shared::{buckets, Config, Deps};
use serde::Serialize;

/// The job's clients and settings, built once per cold start: the [`Deps`] and nothing else
/// (`self.pool`, `self.config`, `self.redis` read through it).
pub struct Preheat {
    deps: Deps,
}

impl std::ops::Deref for Preheat {
    type Target = Deps;

    fn deref(&self) -> &Deps {
        &self.deps
    }
}

/// What one run did, returned as the Lambda's JSON result and logged.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreheatReport {
    /// Activities loaded into Redis by this run.
    pub loaded: usize,
    /// Activities already in Redis, left exactly as they were.
    pub already_loaded: usize,
    /// Activities already in Redis whose meta was replaced by a newer config version.
    pub refreshed: usize,
    pub loaded_ids: Vec<i64>,
    pub already_loaded_ids: Vec<i64>,
    pub refreshed_ids: Vec<i64>,
    /// Activities someone was changing (their lock was held): the next run loads them.
    pub busy_ids: Vec<i64>,
    /// Activities that could not be loaded this time (the next run retries them).
    pub errors: Vec<PreheatFailure>,
}

/// One activity preheat could not load.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreheatFailure {
    pub activity_id: i64,
    pub message: String,
}

impl Preheat {
    /// One activity: nothing to do when Redis holds its current config version and the
    /// sentinels of `users` and the ledger; otherwise a fenced load under its lock
    /// (`seckill_shared::load`), which also puts missing sentinels back.
    async fn preheat_one(&self, a: &Activity) -> Result<PreheatOutcome, LoadError> {
        if self.is_current(a).await? {
            return Ok(PreheatOutcome::AlreadyLoaded);
        }
        let (outcome, _) =
            load::load_under_lock(&self.redis, &self.pool, &self.config, a.id).await?;
        Ok(outcome)
    }

    /// Whether every bucket of the sale holds its current config version, its bucket count
    /// and both sentinels.
    async fn is_current(&self, a: &Activity) -> Result<bool, LoadError> {
        let count = a.bucket_count();
        if !buckets::all_loaded(&self.redis, a.id, count).await? {
            return Ok(false);
        }
        for bucket in Bucket::all(a.id, count) {
            let version = sale::loaded_version(&self.redis, bucket).await?;
            if version.is_none_or(|v| v < a.config_version)
                || !sale::has_sentinels(&self.redis, bucket).await?
            {
                return Ok(false);
            }
        }
        Ok(true)
    }

    pub fn new(deps: Deps) -> Self {
        Self { deps }
    }

    /// Builds the clients the config names. The pool connects lazily, so a container whose
    /// database is briefly out of reach still starts and reports the failure per run.
    pub async fn connect(config: Config) -> anyhow::Result<Self> {
        Ok(Self::new(Deps::connect(config).await?))
    }

    /// Loads every activity due at `now`. Fails only when the list of activities cannot be
    /// read; an activity that cannot be loaded is logged, reported and retried next run, and
    /// does not stop the others.
    #[tracing::instrument(skip_all, fields(now = %now))]
    pub async fn run(&self, now: DateTime<Utc>) -> anyhow::Result<PreheatReport> {
        let due = activity::due_for_preheat(&self.pool, now, self.config.preheat_lead)
            .await
            .context("failed to list activities due for preheat")?;
        let mut report = PreheatReport::default();
        for a in &due {
            match self.preheat_one(a).await {
                Ok(PreheatOutcome::Loaded) => {
                    tracing::info!(
                        activity_id = a.id,
                        stock = a.remaining_stock,
                        outcome = "loaded",
                        "activity loaded into redis"
                    );
                    report.loaded_ids.push(a.id);
                }
                Ok(PreheatOutcome::MetaRefreshed) => {
                    tracing::info!(
                        activity_id = a.id,
                        version = a.config_version,
                        outcome = "refreshed",
                        "activity meta refreshed"
                    );
                    report.refreshed_ids.push(a.id);
                }
                Ok(PreheatOutcome::AlreadyLoaded) => report.already_loaded_ids.push(a.id),
                Ok(PreheatOutcome::NotOwner) | Err(LoadError::Lock(LockError::Busy)) => {
                    tracing::info!(activity_id = a.id, "sale being changed; loaded next run");
                    report.busy_ids.push(a.id);
                }
                Err(e) => {
                    tracing::error!(activity_id = a.id, error = %e, "failed to preheat activity");
                    report.errors.push(PreheatFailure {
                        activity_id: a.id,
                        message: e.to_string(),
                    });
                }
            }
        }
        report.loaded = report.loaded_ids.len();
        report.already_loaded = report.already_loaded_ids.len();
        report.refreshed = report.refreshed_ids.len();
        seckill_shared::metrics::emit(
            "preheat",
            &[
                ("Loaded", report.loaded as f64),
                ("Refreshed", report.refreshed as f64),
                ("PreheatErrors", report.errors.len() as f64),
            ],
            &[],
        );
        tracing::info!(
            due = due.len(),
            loaded = report.loaded,
            already_loaded = report.already_loaded,
            refreshed = report.refreshed,
            errors = report.errors.len(),
            "preheat finished"
        );
        Ok(report)
    }
}
