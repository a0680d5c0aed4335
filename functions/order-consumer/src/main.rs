//! Lambda entry point of `order-consumer`: tracing, config and clients once per cold start,
//! then the SQS batch handler (partial batch failures), which stops short of the invocation's
//! deadline. All logic lives in `lib.rs`.

// The release profile's inlining nests the batch's futures past rustc's default query depth
// (128): without this, `cargo build --release` (and so `sam build`) stops at "queries overflow
// the depth limit" computing the layout of main's async block.
#![recursion_limit = "256"]

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use order_consumer::Consumer;
use seckill_shared::infra::shape::Function;

/// mimalloc: a request's few dozen small allocations cost about half what they do with the
/// system allocator (`make bench`, "the whole router" row).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> Result<(), Error> {
    seckill_shared::infra::telemetry::init();
    let config = Function::Consumer.load_config().await?;
    let consumer = Consumer::connect(config).await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let consumer = consumer.clone();
        let deadline = order_consumer::deadline_of(event.context.deadline);
        async move {
            Ok::<_, Error>(match deadline {
                Some(deadline) => consumer.handle_batch_by(event.payload, deadline).await,
                None => consumer.handle_batch(event.payload).await,
            })
        }
    }))
    .await
}
