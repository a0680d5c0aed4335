//! The five functions, built once from one config, exactly as their Lambdas build them.
//!
//! This is the only module that names the function crates: the rest of the dev server sees a
//! router, a batch handler and two scheduled jobs.

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use axum::Router;
use chrono::{DateTime, Utc};
use seckill_shared::Config;
use std::sync::Arc;

/// The connected functions.
#[derive(Clone)]
pub struct Functions {
    pub entry: Router,
    pub admin: Router,
    consumer: Arc<order_consumer::Consumer>,
    preheat: Arc<preheat::Preheat>,
    reconcile: Arc<reconcile::Reconcile>,
}

impl Functions {
    /// Connects every function's clients (Redis, PostgreSQL, SQS), as each cold start would.
    pub async fn connect(config: &Config) -> anyhow::Result<Self> {
        let entry = seckill_entry::EntryState::connect(config.clone()).await?;
        let admin = admin::AdminState::connect(config.clone()).await?;
        let consumer = order_consumer::Consumer::connect(config.clone()).await?;
        let preheat = preheat::Preheat::connect(config.clone()).await?;
        let reconcile = reconcile::Reconcile::connect(config.clone()).await?;
        Ok(Self {
            entry: seckill_entry::router(entry),
            admin: admin::router(admin),
            consumer: Arc::new(consumer),
            preheat: Arc::new(preheat),
            reconcile: Arc::new(reconcile),
        })
    }

    /// The order consumer's handler, as the event source mapping invokes it.
    pub fn handle_batch(
        &self,
        event: SqsEvent,
    ) -> impl std::future::Future<Output = SqsBatchResponse> + Send + 'static {
        let consumer = self.consumer.clone();
        async move { consumer.handle_batch(event).await }
    }

    /// One preheat run, as its EventBridge schedule triggers it.
    pub async fn preheat(&self, now: DateTime<Utc>) -> anyhow::Result<preheat::PreheatReport> {
        self.preheat.run(now).await
    }

    /// One reconcile run, as its EventBridge schedule triggers it.
    pub async fn reconcile(
        &self,
        now: DateTime<Utc>,
    ) -> anyhow::Result<reconcile::ReconcileReport> {
        self.reconcile.run(now).await
    }
}
