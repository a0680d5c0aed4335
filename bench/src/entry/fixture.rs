//! What every loop of the entry section shares: the request body, one measured loop's row,
//! the section's sizes, and the entry state with what the loops need around it.

use crate::util::Run;
use axum::Router;
use seckill_shared::store::conn::Redis;
use seckill_shared::Config;
use serde::Serialize;
use std::sync::Arc;

pub(crate) const BODY: &str = r#"{"quantity":1}"#;

/// One measured loop.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Measure {
    pub what: String,
    pub attempts: usize,
    pub concurrency: usize,
    pub per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Redis commands the server executed per attempt (INFO commandstats delta), where
    /// measured.
    pub redis_commands_per_attempt: Option<f64>,
    pub errors: u64,
}

impl Measure {
    pub(crate) fn from_run(
        what: &str,
        run: &Run,
        concurrency: usize,
        commands: Option<u64>,
    ) -> Self {
        run.warn_errors(what);
        let m = Self {
            what: what.to_string(),
            attempts: run.attempts,
            concurrency,
            per_s: run.per_sec(),
            p50_ms: run.p50_ms(),
            p99_ms: run.p99_ms(),
            redis_commands_per_attempt: commands.map(|c| c as f64 / run.attempts as f64),
            errors: run.counts.errors,
        };
        eprintln!(
            "  {:<44} {:>9.0}/s  p50 {:.3} ms  p99 {:.3} ms{}",
            m.what,
            m.per_s,
            m.p50_ms,
            m.p99_ms,
            m.redis_commands_per_attempt
                .map(|c| format!("  cmds/attempt {c:.2}"))
                .unwrap_or_default()
        );
        m
    }
}

/// `GET /activities/{id}` on the dev server, against sold-out purchases on the same server at
/// the same concurrency, and the database transactions the view row caused.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PublicView {
    pub view: Measure,
    pub sold_out: Measure,
    pub view_vs_sold_out: f64,
    /// `xact_commit + xact_rollback` of the bench's database (pg_stat_database) over the view
    /// row, less the reads of the counter itself.
    pub db_transactions: i64,
    pub db_transactions_per_request: f64,
    /// `GET /activities/{id}` of a different id above the highest one per request, and the
    /// database transactions that row caused.
    pub unknown: Measure,
    pub unknown_db_transactions: i64,
    pub unknown_db_transactions_per_request: f64,
}

pub struct Sizes {
    pub concurrency: usize,
    pub rejections: usize,
    pub sold_out: usize,
    pub http: usize,
    pub sqs_sends: usize,
    pub sqs_concurrency: usize,
}

/// The entry state and what the section needs around it.
pub(crate) struct Bench {
    pub(crate) config: Config,
    pub(crate) redis: Redis,
    pub(crate) router: Router,
    pub(crate) client: redis::Client,
    pub(crate) admin: redis::aio::MultiplexedConnection,
    pub(crate) users: Arc<Vec<String>>,
    pub(crate) purchase_sha: String,
}
