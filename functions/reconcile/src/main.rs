//! The `reconcile` Lambda: an EventBridge schedule invokes it; it checks and repairs every
//! running (or recently ended) activity and releases unpaid orders.
//!
//! Thin on purpose: tracing, config and clients once per cold start, then
//! [`reconcile::Reconcile::run`].

use lambda_runtime::{service_fn, Error, LambdaEvent};
use reconcile::Reconcile;
use seckill_shared::infra::shape::Function;

#[tokio::main]
async fn main() -> Result<(), Error> {
    seckill_shared::infra::telemetry::init();
    let config = Function::Reconcile.load_config().await?;
    let job = Reconcile::connect(config).await?;
    let job = &job;
    lambda_runtime::run(service_fn(
        move |_event: LambdaEvent<serde_json::Value>| async move {
            let report = job.run(chrono::Utc::now()).await?;
            Ok::<_, Error>(serde_json::to_value(report)?)
        },
    ))
    .await
}
