//! The `reconcile` Lambda: an EventBridge schedule invokes it; it checks and repairs every
//! running (or recently ended) activity and releases unpaid orders.
//!
//! Thin on purpose: tracing, config and clients once per cold start, then
//! [`reconcile::Reconcile::run_by`] with the invocation's deadline (the Lambda context's),
//! so the run's budget counts from the invocation's start and ends before Lambda's Timeout.

// The release profile's inlining nests the run's futures past rustc's default query depth (128):
// without this, `cargo build --release` (and so `sam build`) stops at "queries overflow the
// depth limit" computing the layout of main's async block.
#![recursion_limit = "256"]

use lambda_runtime::{service_fn, Error, LambdaEvent};
use reconcile::Reconcile;
use seckill_shared::infra::deadline;
use seckill_shared::infra::shape::Function;

#[tokio::main]
async fn main() -> Result<(), Error> {
    seckill_shared::infra::telemetry::init();
    let config = Function::Reconcile.load_config().await?;
    let job = Reconcile::connect(config).await?;
    let job = &job;
    lambda_runtime::run(service_fn(
        move |event: LambdaEvent<serde_json::Value>| async move {
            let now = chrono::Utc::now();
            let report = match deadline::from_epoch_ms(event.context.deadline) {
                Some(deadline) => job.run_by(now, deadline).await?,
                // A runtime that sets no deadline (`cargo lambda watch`): the budget alone.
                None => job.run(now).await?,
            };
            Ok::<_, Error>(serde_json::to_value(report)?)
        },
    ))
    .await
}
