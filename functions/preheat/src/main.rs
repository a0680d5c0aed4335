//! The `preheat` Lambda: an EventBridge schedule invokes it; it loads due activities into Redis.
//!
//! Thin on purpose: tracing, config and clients once per cold start, then [`preheat::Preheat::run`].

use lambda_runtime::{service_fn, Error, LambdaEvent};
use preheat::Preheat;
use seckill_shared::infra::deadline;
use seckill_shared::infra::shape::Function;

#[tokio::main]
async fn main() -> Result<(), Error> {
    seckill_shared::infra::telemetry::init();
    let config = Function::Preheat.load_config().await?;
    let job = Preheat::connect(config).await?;
    let job = &job;
    lambda_runtime::run(service_fn(
        move |event: LambdaEvent<serde_json::Value>| async move {
            let now = chrono::Utc::now();
            // Boxed: the run's future is deep enough that, inlined into this block, computing
            // the block's layout overflows rustc's query depth in release builds.
            let report = match deadline::from_epoch_ms(event.context.deadline) {
                Some(deadline) => Box::pin(job.run_by(now, deadline)).await?,
                // A runtime that sets no deadline (`cargo lambda watch`): its Timeout's.
                None => Box::pin(job.run(now)).await?,
            };
            Ok::<_, Error>(serde_json::to_value(report)?)
        },
    ))
    .await
}
