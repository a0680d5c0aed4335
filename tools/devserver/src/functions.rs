//! The five functions, built once from one config, exactly as their Lambdas build them: each
//! logged in as its own database role and Redis ACL user (functions/shape.toml), and each
//! invocation stopped at its Lambda Timeout, as Lambda stops it.
//!
//! This is the only module that names the function crates: the rest of the dev server sees a
//! router, a batch handler and two scheduled jobs.

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use axum::Router;
use chrono::{DateTime, Utc};
use seckill_shared::infra::shape::Function;
use seckill_shared::{Config, Context};
use sqlx::PgPool;
use std::sync::Arc;
use tokio::time::Instant;

/// The connected functions.
#[derive(Clone)]
pub struct Functions {
    pub entry: Router,
    pub admin: Router,
    /// The entry's database pool: what the local payment provider reads a payment from.
    pub entry_pool: PgPool,
    consumer: Arc<order_consumer::Consumer>,
    preheat: Arc<preheat::Preheat>,
    reconcile: Arc<reconcile::Reconcile>,
}

impl Functions {
    /// Connects every function's clients (Redis, PostgreSQL, SQS), as each cold start would,
    /// each with its own logins on the local stack ([`Function::local_config`]).
    pub async fn connect(config: &Config) -> anyhow::Result<Self> {
        let as_function = |f: Function| f.local_config(config);
        let entry = seckill_entry::EntryState::connect(as_function(Function::Entry)?).await?;
        let admin = admin::AdminState::new(Context::connect(as_function(Function::Admin)?).await?);
        let consumer = order_consumer::Consumer::connect(as_function(Function::Consumer)?).await?;
        let preheat = preheat::Preheat::connect(as_function(Function::Preheat)?).await?;
        // The scripts before the first request, as seckill-migrate loads them at a deploy
        // (each preheat run loads them again).
        let scripts = preheat.load_scripts().await?;
        tracing::info!(scripts, "scripts loaded into redis as the loader");
        let reconcile = reconcile::Reconcile::connect(as_function(Function::Reconcile)?).await?;
        Ok(Self {
            entry_pool: entry.pool().clone(),
            entry: seckill_entry::router(entry),
            admin: admin::router(admin),
            consumer: Arc::new(consumer),
            preheat: Arc::new(preheat),
            reconcile: Arc::new(reconcile),
        })
    }

    /// The order consumer's handler, as the event source mapping invokes it: by its Lambda
    /// Timeout the batch has answered (it stops before it), or the invocation is stopped
    /// there and, as when Lambda kills one, no message of it is acknowledged.
    pub fn handle_batch(
        &self,
        event: SqsEvent,
    ) -> impl std::future::Future<Output = SqsBatchResponse> + Send + 'static {
        let consumer = self.consumer.clone();
        async move {
            let timeout = Function::Consumer.shape().timeout();
            let ids: Vec<String> = event
                .records
                .iter()
                .filter_map(|r| r.message_id.clone())
                .collect();
            let deadline = Instant::now() + timeout;
            let handled = consumer.handle_batch_by(event, deadline);
            match tokio::time::timeout_at(deadline, handled).await {
                Ok(response) => response,
                Err(_) => {
                    tracing::error!(
                        function = Function::Consumer.binary(),
                        ?timeout,
                        "invocation stopped at its Timeout; the batch comes back"
                    );
                    let mut response = SqsBatchResponse::default();
                    for id in ids {
                        response.add_failure(id);
                    }
                    response
                }
            }
        }
    }

    /// One preheat run, as its EventBridge schedule triggers it: with the deadline its
    /// invocation gets, stopped there.
    pub async fn preheat(&self, now: DateTime<Utc>) -> anyhow::Result<preheat::PreheatReport> {
        let deadline = std::time::Instant::now() + Function::Preheat.shape().timeout();
        within_timeout(Function::Preheat, self.preheat.run_by(now, deadline)).await
    }

    /// One reconcile run, as its EventBridge schedule triggers it: with the deadline its
    /// invocation gets, stopped there.
    pub async fn reconcile(
        &self,
        now: DateTime<Utc>,
    ) -> anyhow::Result<reconcile::ReconcileReport> {
        let deadline = std::time::Instant::now() + Function::Reconcile.shape().timeout();
        within_timeout(Function::Reconcile, self.reconcile.run_by(now, deadline)).await
    }
}

/// `run`, stopped at `function`'s Lambda Timeout as Lambda stops an invocation there.
async fn within_timeout<R>(
    function: Function,
    run: impl std::future::Future<Output = anyhow::Result<R>>,
) -> anyhow::Result<R> {
    let timeout = function.shape().timeout();
    match tokio::time::timeout(timeout, run).await {
        Ok(result) => result,
        Err(_) => anyhow::bail!("{} stopped at its Timeout ({timeout:?})", function.binary()),
    }
}
