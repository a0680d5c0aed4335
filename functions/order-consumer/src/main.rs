//! Lambda entry point of `order-consumer`: tracing, config and clients once per cold start,
//! then the SQS batch handler (partial batch failures). All logic lives in `lib.rs`.

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use order_consumer::Consumer;
use seckill_shared::Config;

/// mimalloc: a request's few dozen small allocations cost about half what they do with the
/// system allocator (`make bench`, "the whole router" row).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> Result<(), Error> {
    seckill_shared::infra::telemetry::init();
    let config = Config::load().await?;
    let consumer = Consumer::connect(config).await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let consumer = consumer.clone();
        async move { Ok::<_, Error>(consumer.handle_batch(event.payload).await) }
    }))
    .await
}
