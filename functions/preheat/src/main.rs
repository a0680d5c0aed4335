//! The `preheat` Lambda: an EventBridge schedule invokes it; it loads due activities into Redis.
//!
//! Thin on purpose: tracing, config and clients once per cold start, then [`preheat::Preheat::run`].

use lambda_runtime::{service_fn, Error, LambdaEvent};
use preheat::Preheat;
use seckill_shared::infra::shape::Function;

#[tokio::main]
async fn main() -> Result<(), Error> {
    seckill_shared::infra::telemetry::init();
    let config = Function::Preheat.load_config().await?;
    let job = Preheat::connect(config).await?;
    let job = &job;
    lambda_runtime::run(service_fn(
        move |_event: LambdaEvent<serde_json::Value>| async move {
            // Boxed: the run's future is deep enough that, inlined into this block, computing
            // the block's layout overflows rustc's query depth in release builds.
            let report = Box::pin(job.run(chrono::Utc::now())).await?;
            Ok::<_, Error>(serde_json::to_value(report)?)
        },
    ))
    .await
}
