//! Lambda entry point of `seckill-entry`: tracing, config and clients once per cold start,
//! then the router (all logic lives in the library, where the tests call it).

use seckill_entry::{router, EntryState};
use seckill_shared::infra::shape::Function;

/// mimalloc: a request's few dozen small allocations cost about half what they do with the
/// system allocator (`make bench`, "the whole router" row).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    seckill_shared::infra::telemetry::init();
    let config = Function::Entry.load_config().await?;
    let state = EntryState::connect(config).await?;
    lambda_http::run(router(state)).await
}
