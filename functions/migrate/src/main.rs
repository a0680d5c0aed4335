//! Entry point of `seckill-migrate`: tracing and config once, then one migration run per Lambda
//! invocation, or one run and exit on the command line. All logic lives in `lib.rs`.

use lambda_runtime::{service_fn, LambdaEvent};
use seckill_migrate::{migrate, MigrateConfig};
use serde_json::Value;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    seckill_shared::infra::telemetry::init();
    // Parsed once (`--help` lists every setting); the secrets are read per run.
    let config = MigrateConfig::load()?;
    if std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some() {
        let config = &config;
        lambda_runtime::run(service_fn(|_: LambdaEvent<Value>| async move {
            migrate(config)
                .await
                .map_err(|e| lambda_runtime::Error::from(format!("{e:#}")))
        }))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))
    } else {
        let report = migrate(&config).await?;
        println!("{report}");
        Ok(())
    }
}
