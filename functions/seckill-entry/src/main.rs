//! Lambda entry point of `seckill-entry`: tracing, config and clients once per cold start,
//! then the router (all logic lives in the library, where the tests call it).

use seckill_entry::{router, EntryState};
use seckill_shared::Config;

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    seckill_shared::init_tracing();
    let config = Config::load().await?;
    let state = EntryState::connect(config).await?;
    lambda_http::run(router(state)).await
}
