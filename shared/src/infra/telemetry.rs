//! Tracing, set up once per process.

/// JSON lines when `AWS_LAMBDA_LOG_FORMAT=JSON` (as Lambda sets it), human-readable text
/// otherwise; the level comes from `RUST_LOG` / `LOG_LEVEL`.
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| {
            tracing_subscriber::EnvFilter::try_new(
                std::env::var("LOG_LEVEL").unwrap_or_else(|_| "info".into()),
            )
        })
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let json = std::env::var("AWS_LAMBDA_LOG_FORMAT")
        .map(|v| v.eq_ignore_ascii_case("json"))
        .unwrap_or(false);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    let _ = if json {
        builder.json().with_current_span(false).try_init()
    } else {
        builder.without_time().try_init()
    };
}
