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

/// The crates that log what a request carries (the runtime's raw events with their bearer
/// tokens, origin secrets and webhook bodies; the HTTP stacks' headers) at `debug` and `trace`:
/// held at `info` whatever the level asked, so that no level puts a secret in the logs. A
/// target's own directive wins over the general level, wherever it stands in the filter.
const HELD_AT_INFO: &[&str] = &[
    "lambda_runtime",
    "lambda_runtime_api_client",
    "lambda_http",
    "hyper",
    "hyper_util",
    "h2",
    "reqwest",
    "rustls",
    "tower_http",
    "aws_smithy_runtime",
    "aws_smithy_runtime_api",
    "aws_smithy_http",
    "aws_sigv4",
    "aws_config",
];

/// The filter from the three sources, first one set wins, with [`HELD_AT_INFO`] appended.
/// Lambda's levels are `TRACE`, `DEBUG`, `INFO`, `WARN`, `ERROR` and `FATAL`; tracing has no
/// fatal, so that one keeps errors only.
fn filter_directive(
    rust_log: Option<&str>,
    lambda: Option<&str>,
    log_level: Option<&str>,
) -> String {
    let asked = if let Some(filter) = rust_log {
        filter.to_string()
    } else if let Some(level) = lambda {
        match level.trim().to_ascii_lowercase().as_str() {
            "fatal" => "error".to_string(),
            other => other.to_string(),
        }
    } else {
        log_level.unwrap_or("info").to_string()
    };
    let held: Vec<String> = HELD_AT_INFO.iter().map(|t| format!("{t}=info")).collect();
    format!("{asked},{}", held.join(","))
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
            let directive = filter_directive(rust_log, lambda, log_level);
            assert_eq!(
                directive.split(',').next(),
                want.split(',').next(),
                "RUST_LOG={rust_log:?} AWS_LAMBDA_LOG_LEVEL={lambda:?} LOG_LEVEL={log_level:?}"
            );
            assert!(directive.starts_with(want), "{directive}");
        }
    }

    /// At `TRACE` (the template's LogLevel allows it) the runtime and the HTTP stacks still log
    /// nothing below `info`: the raw event the runtime logs at trace carries bearer tokens.
    #[test]
    fn the_runtime_and_the_http_stacks_stay_at_info_at_any_level() {
        use tracing_subscriber::layer::SubscriberExt;
        for asked in ["TRACE", "DEBUG"] {
            let directive = filter_directive(None, Some(asked), None);
            let filter = tracing_subscriber::EnvFilter::try_new(&directive).unwrap();
            let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
            let layer = Recorder(seen.clone());
            let subscriber = tracing_subscriber::registry().with(filter).with(layer);
            tracing::subscriber::with_default(subscriber, || {
                tracing::trace!(target: "lambda_runtime", "raw event: Bearer eyJ...");
                tracing::debug!(target: "hyper::proto", "headers");
                tracing::info!(target: "lambda_runtime", "runtime started");
                tracing::debug!(target: "seckill_shared::protocol", "ours");
            });
            let seen = seen.lock().unwrap().clone();
            assert_eq!(seen, vec!["runtime started", "ours"], "at {asked}");
        }
    }

    /// Keeps each event's message.
    struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Recorder {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            struct Message(String);
            impl tracing::field::Visit for Message {
                fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                    if f.name() == "message" {
                        self.0 = format!("{v:?}");
                    }
                }
            }
            let mut m = Message(String::new());
            event.record(&mut m);
            self.0.lock().unwrap().push(m.0);
        }
    }
}
