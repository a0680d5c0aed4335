//! Preheat: loads every published sale that starts within the lead time (or runs and is
//! missing from Redis) into Redis, idempotently: each load is fenced under the sale's lock
//! ([`seckill_shared::protocol::load`]) and `lua/preheat.lua` never touches the stock of a
//! loaded sale, only replaces a meta version the database does not hold (older, or newer from a
//! change whose commit never happened), puts missing sentinels back and re-expires
//! every key. A sale Redis already holds at its current version is left alone without the
//! lock. The keys must never be evicted: docs/invariants.md, "Key lifetimes".

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use seckill_shared::domain::activity::{self, Activity};
use seckill_shared::infra::metrics;
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol::load::{self, LoadError};
use seckill_shared::protocol::lock::LockError;
use seckill_shared::store::buckets;
use seckill_shared::store::conn::Redis;
use seckill_shared::store::keys::Bucket;
use seckill_shared::store::meta::{self, PreheatOutcome};
use seckill_shared::store::scripts;
use seckill_shared::{Config, Context};
use serde::Serialize;
use sqlx::PgPool;
use std::time::{Duration, Instant};

/// What a run keeps free before its deadline: the load in flight's last calls and the report.
pub const FINISH_MARGIN: Duration = Duration::from_secs(5);

/// The most of a run the scripts' load may take (a connection and one SCRIPT LOAD a script).
pub const SCRIPT_LOAD_SHARE: Duration = Duration::from_secs(8);

/// The job's clients and settings, built once per cold start.
pub struct Preheat {
    config: Config,
    pool: PgPool,
    redis: Redis,
}

/// What one run did, returned as the Lambda's JSON result and logged.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreheatReport {
    /// Activities loaded into Redis by this run.
    pub loaded: usize,
    /// Activities already in Redis, left exactly as they were.
    pub already_loaded: usize,
    /// Activities already in Redis whose meta was replaced by the database's config version.
    pub refreshed: usize,
    pub loaded_ids: Vec<i64>,
    pub already_loaded_ids: Vec<i64>,
    pub refreshed_ids: Vec<i64>,
    /// Activities someone was changing (their lock was held): the next run loads them.
    pub busy_ids: Vec<i64>,
    /// Activities not begun before the run's time was spent: the next run loads them.
    pub deferred_ids: Vec<i64>,
    /// Activities that could not be loaded this time (the next run retries them).
    pub errors: Vec<PreheatFailure>,
    /// Scripts loaded on every Redis node as the loader (all of them, each run); 0 when this
    /// process has no loader login or the load failed (`script_error`).
    pub scripts_loaded: usize,
    pub script_error: Option<String>,
}

/// One activity preheat could not load.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreheatFailure {
    pub activity_id: i64,
    pub message: String,
}

impl Preheat {
    /// One activity: nothing to do when Redis holds its current config version, the
    /// sentinels of `users` and the ledger and the terms of the meta's fields; otherwise a
    /// fenced load under its lock (`seckill_shared::protocol::load`), which also puts missing
    /// sentinels and terms back.
    async fn preheat_one(&self, a: &Activity, end: Instant) -> Result<PreheatOutcome, LoadError> {
        if self.is_current(a).await? {
            return Ok(PreheatOutcome::AlreadyLoaded);
        }
        let (outcome, _) =
            load::load_under_lock(&self.redis, &self.pool, &self.config, a.id, end).await?;
        Ok(outcome)
    }

    /// Whether every bucket of the sale holds its current config version, its bucket count,
    /// both sentinels, its ticket secret and its terms.
    async fn is_current(&self, a: &Activity) -> Result<bool, LoadError> {
        let count = a.bucket_count();
        if !buckets::all_loaded(&self.redis, a.id, count).await? {
            return Ok(false);
        }
        for bucket in Bucket::all(a.id, count) {
            let version = meta::loaded_version(&self.redis, bucket).await?;
            if version != Some(a.config_version)
                || !meta::has_sentinels(&self.redis, bucket).await?
                || !meta::terms_current(&self.redis, bucket).await?
            {
                return Ok(false);
            }
        }
        Ok(true)
    }

    pub fn new(context: Context) -> Self {
        Self {
            config: context.config,
            pool: context.pool,
            redis: context.redis,
        }
    }

    /// Loads every script on every Redis node as the loader (a node restarted or replaced
    /// empty has them again), when this process holds the loader's login. Answers how many.
    /// Connected anew each run: a cluster client learns the nodes when it connects, and a warm
    /// container's would miss a node added or replaced since.
    pub async fn load_scripts(&self) -> anyhow::Result<usize> {
        let Some(loader) = Redis::connect_loader(&self.config)
            .await
            .context("failed to connect to redis as the script loader")?
        else {
            return Ok(0);
        };
        scripts::load_all(&loader).await
    }

    /// Builds the clients the config names. The pool connects lazily, so a container whose
    /// database is briefly out of reach still starts and reports the failure per run.
    pub async fn connect(config: Config) -> anyhow::Result<Self> {
        Ok(Self::new(Context::connect(config).await?))
    }

    /// [`Preheat::run_by`] for an invocation that starts now: by the function's Lambda
    /// Timeout (functions/shape.toml).
    pub async fn run(&self, now: DateTime<Utc>) -> anyhow::Result<PreheatReport> {
        let deadline = Instant::now() + Function::Preheat.shape().timeout();
        self.run_by(now, deadline).await
    }

    /// Loads every activity due at `now`, within an invocation that ends at `deadline` (the
    /// Lambda context's): no load begins past the deadline less [`FINISH_MARGIN`], and a draw
    /// sale's pool rebuild stops there (reconcile's draw part goes on from its cursor); the
    /// sales not begun are the next run's (`deferred_ids`). Fails only when the list of
    /// activities cannot be read; an activity that cannot be loaded is logged, reported and
    /// retried next run, and does not stop the others.
    #[tracing::instrument(skip_all, fields(now = %now))]
    pub async fn run_by(
        &self,
        now: DateTime<Utc>,
        deadline: Instant,
    ) -> anyhow::Result<PreheatReport> {
        let end = deadline
            .checked_sub(FINISH_MARGIN)
            .unwrap_or(deadline)
            .max(Instant::now());
        let mut report = PreheatReport::default();
        // First the scripts, which every function's call needs and none may load itself; within
        // a share of the run, so the loads of the sales keep their time.
        let share = SCRIPT_LOAD_SHARE.min(end.saturating_duration_since(Instant::now()));
        let loaded = tokio::time::timeout(share, self.load_scripts())
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("loading the scripts took over {share:?}")));
        match loaded {
            Ok(n) => report.scripts_loaded = n,
            Err(e) => {
                tracing::error!(
                    error = format!("{e:#}"),
                    "failed to load the scripts into redis"
                );
                report.script_error = Some(format!("{e:#}"));
            }
        }
        let due = activity::due_for_preheat(&self.pool, now, self.config.preheat_lead)
            .await
            .context("failed to list activities due for preheat")?;
        for a in &due {
            match self.preheat_one(a, end).await {
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
                Err(LoadError::OutOfTime) => report.deferred_ids.push(a.id),
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
        metrics::emit(
            "preheat",
            &[
                ("Loaded", report.loaded as f64),
                ("Refreshed", report.refreshed as f64),
                ("PreheatErrors", report.errors.len() as f64),
                (
                    "ScriptLoadFailures",
                    f64::from(u8::from(report.script_error.is_some())),
                ),
            ],
            &[],
        );
        tracing::info!(
            due = due.len(),
            loaded = report.loaded,
            already_loaded = report.already_loaded,
            refreshed = report.refreshed,
            deferred = report.deferred_ids.len(),
            errors = report.errors.len(),
            scripts_loaded = report.scripts_loaded,
            "preheat finished"
        );
        Ok(report)
    }
}
