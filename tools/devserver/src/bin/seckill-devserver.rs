//! `seckill-devserver`: the HTTP API on 127.0.0.1:3000 plus the queue poller and the schedules,
//! in one process (`make serve`). Parses arguments and hands them to the library.

use clap::Parser;
use seckill_devserver::{serve, DevArgs};

/// mimalloc: a request's few dozen small allocations cost about half what they do with the
/// system allocator (`make bench`, "the whole router" row).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    seckill_shared::infra::telemetry::init();
    let config = DevArgs::parse().into_config()?;
    serve(config).await
}
