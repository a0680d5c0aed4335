//! Tracing, set up once per process.

/// JSON lines when `AWS_LAMBDA_LOG_FORMAT=JSON` (as Lambda sets it), human-readable text
/// otherwise. The level: `RUST_LOG` (a full filter) when set, else Lambda's logging config
/// (`AWS_LAMBDA_LOG_LEVEL`, which Lambda sets from the function's `ApplicationLogLevel`), else
/// `LOG_LEVEL` (a filter, for local runs), else `info`.
pub fn init() {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let directive = filter_directive(
        var("RUST_LOG").as_deref(),
        var("AWS_LAMBDA_LOG_LEVEL").as_deref(),
        var("LOG_LEVEL").as_deref(),
    );
    let filter = tracing_subscriber::EnvFilter::try_new(&directive)
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

/// The filter from the three sources, first one set wins. Lambda's levels are `TRACE`, `DEBUG`,
/// `INFO`, `WARN`, `ERROR` and `FATAL`; tracing has no fatal, so that one keeps errors only.
fn filter_directive(
    rust_log: Option<&str>,
    lambda: Option<&str>,
    log_level: Option<&str>,
) -> String {
    if let Some(filter) = rust_log {
        return filter.to_string();
    }
    if let Some(level) = lambda {
        return match level.trim().to_ascii_lowercase().as_str() {
            "fatal" => "error".to_string(),
            other => other.to_string(),
        };
    }
    log_level.unwrap_or("info").to_string()
}

#[cfg(test)]
mod tests {
    use super::filter_directive;

    /// `RUST_LOG`, `AWS_LAMBDA_LOG_LEVEL`, `LOG_LEVEL`, and the filter they make.
    type Case = (
        Option<&'static str>,
        Option<&'static str>,
        Option<&'static str>,
        &'static str,
    );

    #[rustfmt::skip]
    const CASES: &[Case] = &[
        (None, None, None, "info"),
        (None, None, Some("seckill=debug,info"), "seckill=debug,info"),
        (None, Some("DEBUG"), Some("warn"), "debug"),
        (None, Some("FATAL"), None, "error"),
        (None, Some("WARN"), None, "warn"),
        (Some("trace"), Some("ERROR"), Some("warn"), "trace"),
    ];

    #[test]
    fn the_lambda_logging_config_wins_over_log_level_and_rust_log_over_both() {
        for &(rust_log, lambda, log_level, want) in CASES {
            assert_eq!(
                filter_directive(rust_log, lambda, log_level),
                want,
                "RUST_LOG={rust_log:?} AWS_LAMBDA_LOG_LEVEL={lambda:?} LOG_LEVEL={log_level:?}"
            );
        }
    }
}
