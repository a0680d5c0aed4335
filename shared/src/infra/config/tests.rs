//! The settings read as the template and the local stack give them.

use super::*;

/// What the SAM template's Globals set, as variables (the lookup stands in for the process
/// environment, so these tests never touch the real one).
const TEMPLATE: [(&str, &str); 8] = [
    (
        "DATABASE_SECRET_ARN",
        "arn:aws:secretsmanager:us-east-1:1:secret:db",
    ),
    ("DATABASE_HOST", "proxy.example"),
    (
        "REDIS_AUTH_SECRET_ARN",
        "arn:aws:secretsmanager:us-east-1:1:secret:redis",
    ),
    ("REDIS_URL", "rediss://clustercfg.example:6379"),
    ("REDIS_CLUSTER", "true"),
    (
        "ORDER_QUEUE_URL",
        "https://sqs.us-east-1.amazonaws.com/1/orders",
    ),
    ("PAYMENT_TIMEOUT_SECS", "900"),
    ("DB_MAX_CONNECTIONS", "1"),
];

/// Parses `vars` as if they were the whole environment: each becomes the flag of the
/// argument that reads it, and every argument's `env` is rebound to a variable nobody sets,
/// so the real environment (scripts/env.sh under `make test`) plays no part.
fn parse(vars: &[(&str, &str)]) -> Result<Config, String> {
    use clap::{CommandFactory, FromArgMatches};
    let mut argv = vec!["seckill".to_string()];
    let cmd = Config::command().mut_args(|arg| {
        let Some(name) = arg.get_env().map(|n| n.to_string_lossy().into_owned()) else {
            return arg;
        };
        if let Some((_, value)) = vars.iter().find(|(k, _)| *k == name) {
            let long = arg.get_long().expect("every setting has a flag");
            argv.push(format!("--{long}={value}"));
        }
        arg.env("SECKILL_CONFIG_TEST_NEVER_SET")
    });
    let config = cmd
        .try_get_matches_from(argv)
        .and_then(|m| Config::from_arg_matches(&m))
        .map_err(|e| e.render().to_string())?;
    config.check().map_err(|e| e.to_string())
}

fn local() -> Vec<(&'static str, &'static str)> {
    vec![
        ("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/seckill"),
        ("REDIS_URL", "redis://127.0.0.1:6379"),
        (
            "ORDER_QUEUE_URL",
            "http://127.0.0.1:4566/123456789012/seckill-orders",
        ),
    ]
}

#[test]
fn the_template_environment_parses_with_the_database_from_its_secret() {
    let config = parse(&TEMPLATE).unwrap();
    assert_eq!(config.database_url, "", "filled in by resolve_secrets");
    assert_eq!(
        config.redis,
        RedisTopology::Cluster(vec!["rediss://clustercfg.example:6379".into()])
    );
    assert_eq!(config.db_max_connections, 1);
    assert_eq!(config.payment_timeout, Duration::from_secs(900));
    assert_eq!(
        config.secrets.database_host.as_deref(),
        Some("proxy.example")
    );
}

/// `sam local invoke` with samconfig's `events/env.json`: its variables for every
/// function over the template's.
#[test]
fn the_sam_local_environment_runs_on_the_local_stack_and_reads_no_secret() {
    let local: serde_json::Value =
        serde_json::from_str(include_str!("../../../../events/env.json")).unwrap();
    // The first of a name wins in `parse`: env.json's values, then the template's.
    let vars: Vec<(&str, &str)> = local["Parameters"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_str().unwrap()))
        .chain(TEMPLATE)
        .collect();
    let config = parse(&vars).unwrap();
    assert_eq!(config.secrets, SecretRefs::default());
    assert_eq!(
        config.database_url,
        "postgres://postgres@127.0.0.1:5432/seckill"
    );
    assert_eq!(
        config.redis,
        RedisTopology::Standalone("redis://127.0.0.1:6379".into())
    );
}

#[test]
fn a_missing_database_url_is_named() {
    let vars: Vec<_> = local()
        .into_iter()
        .filter(|(k, _)| *k != "DATABASE_URL")
        .collect();
    let err = parse(&vars).unwrap_err();
    assert!(err.contains("DATABASE_URL"), "{err}");
}

#[test]
fn an_empty_database_url_is_refused() {
    let mut vars = local();
    vars[0] = ("DATABASE_URL", "");
    let err = parse(&vars).unwrap_err();
    assert!(err.contains("DATABASE_URL"), "{err}");
    vars[0] = ("DATABASE_URL", "  ");
    let err = parse(&vars).unwrap_err();
    assert!(err.contains("DATABASE_URL"), "{err}");
}

#[test]
fn a_missing_order_queue_url_is_named() {
    let vars: Vec<_> = TEMPLATE
        .into_iter()
        .filter(|(k, _)| *k != "ORDER_QUEUE_URL")
        .collect();
    let err = parse(&vars).unwrap_err();
    assert!(err.contains("ORDER_QUEUE_URL"), "{err}");
}

#[test]
fn durations_are_read_in_the_unit_their_variable_names() {
    let mut vars = local();
    vars.extend([("REDIS_TIMEOUT_MS", " 250 "), ("PREHEAT_LEAD_SECS", "60")]);
    let config = parse(&vars).unwrap();
    assert_eq!(config.redis_timeout, Duration::from_millis(250));
    assert_eq!(config.preheat_lead, Duration::from_secs(60));
    assert_eq!(config.sqs_timeout, Duration::from_millis(2000), "default");
    assert_eq!(config.lock_ttl, Duration::from_millis(5000), "default");
}

#[test]
fn the_public_view_cache_defaults_to_and_stops_at_250_ms() {
    let config = parse(&local()).unwrap();
    assert_eq!(config.public_view_cache_ttl, Duration::from_millis(250));
    let mut vars = local();
    vars.push(("PUBLIC_VIEW_CACHE_MS", "0"));
    assert_eq!(parse(&vars).unwrap().public_view_cache_ttl, Duration::ZERO);
    let mut vars = local();
    vars.push(("PUBLIC_VIEW_CACHE_MS", "251"));
    let err = parse(&vars).unwrap_err();
    assert!(err.contains("PUBLIC_VIEW_CACHE_MS"), "{err}");
}

#[test]
fn the_user_db_rate_defaults_to_5_is_off_at_0_and_stops_at_1000() {
    assert_eq!(parse(&local()).unwrap().user_db_rate_per_sec, 5);
    for (value, want) in [
        ("0", Some(0)),
        ("1000", Some(1000)),
        ("1001", None),
        ("-1", None),
        ("", None),
    ] {
        let mut vars = local();
        vars.push(("USER_DB_RATE_PER_SEC", value));
        match (parse(&vars), want) {
            (Ok(config), Some(want)) => assert_eq!(config.user_db_rate_per_sec, want),
            (Err(err), None) => assert!(err.contains("USER_DB_RATE_PER_SEC"), "{err}"),
            (got, want) => panic!("{value:?}: {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn a_malformed_number_is_an_error_naming_its_variable() {
    let mut vars = local();
    vars.push(("LOCK_WAIT_MS", "2s"));
    let err = parse(&vars).unwrap_err();
    assert!(err.contains("LOCK_WAIT_MS"), "{err}");
}

#[test]
fn a_url_list_is_a_cluster_and_one_url_is_standalone() {
    assert_eq!(
        RedisTopology::from_urls("redis://a:1, redis://b:2", false),
        RedisTopology::Cluster(vec!["redis://a:1".into(), "redis://b:2".into()])
    );
    assert_eq!(
        RedisTopology::from_urls("redis://a:1", false),
        RedisTopology::Standalone("redis://a:1".into())
    );
    let mut vars = local();
    vars.push(("REDIS_CLUSTER", "yes"));
    assert!(matches!(
        parse(&vars).unwrap().redis,
        RedisTopology::Cluster(_)
    ));
}

#[test]
fn the_role_secret_arns_are_a_comma_separated_list() {
    let mut vars = local();
    vars.push((
        "DATABASE_ROLE_SECRET_ARNS",
        "arn:aws:secretsmanager:us-east-1:1:secret:entry, arn:aws:secretsmanager:us-east-1:1:secret:admin",
    ));
    let config = parse(&vars).unwrap();
    assert_eq!(
        config.secrets.database_role_secret_arns,
        [
            "arn:aws:secretsmanager:us-east-1:1:secret:entry",
            "arn:aws:secretsmanager:us-east-1:1:secret:admin"
        ]
    );
    assert!(parse(&local())
        .unwrap()
        .secrets
        .database_role_secret_arns
        .is_empty());
    let mut vars = local();
    vars.push(("DATABASE_ROLE_SECRET_ARNS", "arn:a,,arn:b"));
    let err = parse(&vars).unwrap_err();
    assert!(err.contains("DATABASE_ROLE_SECRET_ARNS"), "{err}");
}

#[test]
fn the_ca_bundle_is_the_compiled_in_one_unless_named() {
    assert_eq!(parse(&local()).unwrap().database_ca.path, None);
    let mut vars = local();
    vars.push(("DATABASE_CA_BUNDLE", "/opt/global-bundle.pem"));
    assert_eq!(
        parse(&vars).unwrap().database_ca.path,
        Some("/opt/global-bundle.pem".into())
    );
}

#[test]
fn debug_of_a_config_full_of_secrets_shows_none_of_them() {
    let mut vars: Vec<(&str, &str)> = TEMPLATE.to_vec();
    vars.retain(|(k, _)| *k != "REDIS_URL");
    vars.extend([
        (
            "DATABASE_URL",
            "postgres://seckill:db-pa55@proxy:5432/seckill?sslmode=verify-full&password=qs-pa55",
        ),
        (
            "REDIS_URL",
            "rediss://:node1-t0ken@n1:6379,rediss://user:node2-t0ken@n2:6379/0?token=qs-t0ken",
        ),
        ("DATABASE_CA_BUNDLE", "/opt/ca.pem"),
    ]);
    let config = parse(&vars).unwrap();
    let debug = format!("{config:?}");
    for secret in [
        "db-pa55",
        "qs-pa55",
        "node1-t0ken",
        "node2-t0ken",
        "qs-t0ken",
    ] {
        assert!(!debug.contains(secret), "{secret} in {debug}");
    }
    for shown in [
        "seckill:***@proxy",
        "user:***@n2",
        "/opt/ca.pem",
        "proxy.example",
    ] {
        assert!(debug.contains(shown), "{shown} not in {debug}");
    }
}

#[test]
fn debug_and_help_show_no_password() {
    let mut vars = local();
    vars[0] = ("DATABASE_URL", "postgres://u:hunter2@db/seckill");
    vars[1] = ("REDIS_URL", "rediss://:t0ken@redis:6379");
    let config = parse(&vars).unwrap();
    let debug = format!("{config:?}");
    assert!(
        !debug.contains("hunter2") && !debug.contains("t0ken"),
        "{debug}"
    );
    assert!(debug.contains("u:***@db"), "{debug}");
    use clap::CommandFactory;
    for arg in Config::command().get_arguments() {
        let name = arg.get_env().map(|n| n.to_string_lossy().into_owned());
        if matches!(name.as_deref(), Some("DATABASE_URL" | "REDIS_URL")) {
            assert!(
                arg.is_hide_env_values_set(),
                "{name:?} shows its value in --help"
            );
        }
    }
}
#[test]
fn no_arn_means_no_secret_to_read() {
    assert!(SecretRefs::default().is_empty());
    let roles_only = SecretRefs {
        database_role_secret_arns: vec!["arn:aws:secretsmanager:us-east-1:1:secret:r".into()],
        ..SecretRefs::default()
    };
    assert!(roles_only.is_empty(), "the functions read no role secret");
}
