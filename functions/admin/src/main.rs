//! The admin Lambda: tracing, config and clients once per cold start, then the router.

use admin::{router, AdminState};
use seckill_shared::infra::shape::Function;

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    seckill_shared::infra::telemetry::init();
    let config = Function::Admin.load_config().await?;
    let state = AdminState::connect(config).await?;
    lambda_http::run(router(state)).await
}
