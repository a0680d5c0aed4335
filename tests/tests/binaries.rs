//! The built binaries as an operator meets them: `--help` on each lists every setting, a Lambda
//! whose environment lacks a required variable fails its cold start naming it, and the Lambdas as
//! the deploy builds them carry no test support.
//!
//! Like `lambda_invoke.rs`, the test builds what it runs (a no-op after `make test`'s build).

use clap::CommandFactory;
use seckill_migrate::MigrateConfig;
use seckill_shared::Config;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The deployed functions that run with a [`Config`] (template.yaml's `Binary` values).
const FUNCTIONS: [&str; 5] = [
    "seckill-entry",
    "order-consumer",
    "preheat",
    "reconcile",
    "admin",
];

/// The migration function: the database settings only ([`MigrateConfig`]).
const MIGRATE: &str = "seckill-migrate";

/// The local tools that run the functions' code with a [`Config`].
const TOOLS_WITH_CONFIG: [&str; 3] = ["seckill-devserver", "seckill-demo", "seckill-bench"];

/// Tools without a `Config`: their own settings only.
const OTHER_TOOLS: [&str; 2] = ["seckill-loadgen", "seckill-token"];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace")
        .to_path_buf()
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(repo_root()).stdin(Stdio::null());
    cmd
}

fn run_cargo(args: &[&str]) -> String {
    let out = cargo().args(args).output().expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
}

/// Builds the functions as `make build` and `sam build` select them (a root build of each bin),
/// the dev server and the demo as `make serve` and `make demo` select them (the two packages
/// together: the same features, so readme-check's `make demo PROFILE=dev` then builds nothing),
/// and the bench on its own; returns where the debug binaries are.
fn build_all() -> PathBuf {
    let mut functions = vec!["build"];
    functions.extend(
        FUNCTIONS
            .iter()
            .chain([&MIGRATE])
            .flat_map(|f| ["--bin", *f]),
    );
    run_cargo(&functions);
    run_cargo(&[
        "build",
        "--bins",
        "-p",
        "seckill-devserver",
        "-p",
        "seckill-loadgen",
    ]);
    run_cargo(&["build", "--bins", "-p", "seckill-bench"]);
    target_dir().join("debug")
}

/// Every variable a [`Config`] reads, from its clap definition.
fn config_variables() -> Vec<String> {
    variables_of(Config::command())
}

fn variables_of(command: clap::Command) -> Vec<String> {
    command
        .get_arguments()
        .filter_map(|a| a.get_env())
        .map(|v| v.to_string_lossy().into_owned())
        .collect()
}

/// docs/configuration.md's "Settings" table: each row's variable and its default cell.
fn documented_settings() -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(repo_root().join("docs/configuration.md"))
        .expect("docs/configuration.md");
    let section = doc
        .split("\n## Settings\n")
        .nth(1)
        .expect("docs/configuration.md has a Settings section");
    let section = section.split("\n## ").next().unwrap_or(section);
    section
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((name.to_string(), cells.get(2)?.to_string()))
        })
        .collect()
}

#[test]
fn the_configuration_doc_lists_every_setting_with_its_default() {
    let mut settings: Vec<clap::Arg> = Config::command().get_arguments().cloned().collect();
    settings.extend(MigrateConfig::command().get_arguments().cloned());
    let table = documented_settings();
    let mut listed: Vec<&str> = table.iter().map(|(name, _)| name.as_str()).collect();
    listed.sort_unstable();
    let mut wanted: Vec<String> = settings
        .iter()
        .filter_map(|a| a.get_env().map(|v| v.to_string_lossy().into_owned()))
        .collect();
    wanted.sort_unstable();
    wanted.dedup();
    assert_eq!(
        listed, wanted,
        "docs/configuration.md's Settings table against Config and MigrateConfig"
    );
    for arg in &settings {
        let Some(name) = arg.get_env().map(|v| v.to_string_lossy().into_owned()) else {
            continue;
        };
        let cell = &table.iter().find(|(n, _)| *n == name).expect("listed").1;
        for default in arg.get_default_values() {
            let default = default.to_string_lossy();
            if !default.is_empty() {
                assert!(
                    cell.contains(&format!("`{default}`")),
                    "{name}: docs/configuration.md says {cell:?}, the code's default is {default}"
                );
            }
        }
    }
}

/// Runs `bin` with `env` changes, bounded: a binary that does not exit within `limit` is
/// killed and reported as `None`.
fn run_bounded(
    bin: &Path,
    args: &[&str],
    env: &[(&str, Option<&str>)],
    limit: Duration,
) -> Option<Output> {
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let mut child = cmd.spawn().expect("the binary starts");
    let started = Instant::now();
    while started.elapsed() < limit {
        if child.try_wait().expect("waitable").is_some() {
            return Some(child.wait_with_output().expect("output"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

#[test]
fn every_binary_lists_every_setting_with_its_variable_and_default_in_its_help() {
    let dir = build_all();
    let variables = config_variables();
    assert!(
        variables.len() >= 19 && variables.iter().any(|v| v == "DATABASE_URL"),
        "Config's variables: {variables:?}"
    );
    // A password in the environment must not reach the help text.
    let env = [
        (
            "DATABASE_URL",
            Some("postgres://u:help-leak-marker@127.0.0.1:5432/seckill"),
        ),
        (
            "REDIS_URL",
            Some("redis://:help-leak-marker@127.0.0.1:6379"),
        ),
    ];
    for bin in FUNCTIONS.iter().chain(&TOOLS_WITH_CONFIG) {
        let out = run_bounded(&dir.join(bin), &["--help"], &env, Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{bin} --help did not exit"));
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{bin} --help: {}\n{help}", out.status);
        let missing: Vec<&String> = variables
            .iter()
            .filter(|v| !help.contains(&format!("[env: {v}")))
            .collect();
        assert!(
            missing.is_empty(),
            "{bin} --help lacks {missing:?}:\n{help}"
        );
        for default in ["[default: 300]", "[default: seckill]", "[default: 4]"] {
            assert!(
                help.contains(default),
                "{bin} --help lacks {default}:\n{help}"
            );
        }
        assert!(
            !help.contains("help-leak-marker"),
            "{bin} --help prints a password:\n{help}"
        );
    }
    let out = run_bounded(
        &dir.join(MIGRATE),
        &["--help"],
        &env,
        Duration::from_secs(30),
    )
    .expect("seckill-migrate --help exits");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{MIGRATE} --help: {}", out.status);
    for v in variables_of(MigrateConfig::command()) {
        assert!(
            help.contains(&format!("[env: {v}")),
            "{MIGRATE} --help lacks {v}:\n{help}"
        );
    }
    assert!(help.contains("[default: 3000]"), "{help}");
    assert!(!help.contains("help-leak-marker"), "{help}");
    for bin in OTHER_TOOLS {
        let out = run_bounded(&dir.join(bin), &["--help"], &[], Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{bin} --help did not exit"));
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{bin} --help: {}", out.status);
        assert!(help.contains("[env: SECKILL_JWT_SECRET"), "{bin}:\n{help}");
    }
}

/// What Lambda sets for `bin` with `api` as its runtime API, no secret ARNs, and `unset` removed.
fn lambda_env<'a>(bin: &'a str, api: &'a str, unset: &'a str) -> [(&'a str, Option<&'a str>); 9] {
    [
        ("AWS_LAMBDA_FUNCTION_NAME", Some(bin)),
        ("AWS_LAMBDA_RUNTIME_API", Some(api)),
        ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", Some("512")),
        ("AWS_LAMBDA_FUNCTION_VERSION", Some("$LATEST")),
        ("AWS_LAMBDA_LOG_STREAM_NAME", Some("binaries-test")),
        (
            "AWS_LAMBDA_LOG_GROUP_NAME",
            Some("/aws/lambda/binaries-test"),
        ),
        ("DATABASE_SECRET_ARN", None),
        ("REDIS_AUTH_SECRET_ARN", None),
        (unset, None),
    ]
}

#[test]
fn a_lambda_without_a_required_variable_fails_its_cold_start_naming_it() {
    let dir = build_all();
    // A runtime API that accepts connections and never answers, and the variables Lambda sets:
    // a function that got past its config would wait here for an invocation instead of exiting.
    let runtime_api = std::net::TcpListener::bind("127.0.0.1:0").expect("a local port");
    let api = runtime_api.local_addr().expect("bound").to_string();
    // The control: with every variable set (nothing unset but an unused name), it starts and
    // waits for its first invocation.
    let waiting = run_bounded(
        &dir.join("seckill-entry"),
        &[],
        &lambda_env("seckill-entry", &api, "SECKILL_BINARIES_TEST_UNUSED"),
        Duration::from_secs(3),
    );
    assert!(
        waiting.is_none(),
        "a fully configured function exits: {waiting:?}"
    );
    for (missing, bins) in [
        ("DATABASE_URL", [&FUNCTIONS[..], &[MIGRATE]].concat()),
        ("ORDER_QUEUE_URL", FUNCTIONS.to_vec()),
    ] {
        for bin in bins {
            let env = lambda_env(bin, &api, missing);
            let out = run_bounded(&dir.join(bin), &[], &env, Duration::from_secs(20))
                .unwrap_or_else(|| panic!("{bin} without {missing} started instead of failing"));
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success(),
                "{bin} without {missing}: {}",
                out.status
            );
            assert!(
                stderr.contains(missing),
                "{bin} without {missing} says:\n{stderr}"
            );
        }
    }
}

#[test]
fn migrate_runs_from_a_shell_with_the_database_settings_only() {
    // The documented bastion / VPN use: no Redis, no queue, just where the database is. A
    // database of its own: the local `seckill` one may carry another checkout's migrations.
    let dir = build_all();
    let database_url = tokio::runtime::Runtime::new()
        .expect("a runtime")
        .block_on(testkit::empty_database())
        .expect("an empty database");
    let env = [
        ("DATABASE_URL", Some(database_url.as_str())),
        ("REDIS_URL", None),
        ("ORDER_QUEUE_URL", None),
        ("AWS_LAMBDA_RUNTIME_API", None),
        ("AWS_LAMBDA_FUNCTION_NAME", None),
    ];
    let out = run_bounded(&dir.join(MIGRATE), &[], &env, Duration::from_secs(30))
        .expect("seckill-migrate exits");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{MIGRATE}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // The report is the last line (log lines come before it).
    let last = stdout.lines().last().unwrap_or_default();
    let report: serde_json::Value = serde_json::from_str(last).expect("a JSON report");
    assert!(report["latest"].as_i64().is_some(), "{report}");
}

#[test]
fn the_lambdas_as_deployed_are_built_without_test_support() {
    // What a root `cargo build --bin <function>` (make build, sam build) unifies into the
    // shared library; `--workspace` shows the test crates do turn the features on.
    let tree = |extra: &[&str]| {
        let mut args = vec![
            "tree",
            "--offline",
            "-e",
            "features",
            "-i",
            "seckill-shared",
        ];
        args.extend(extra);
        run_cargo(&args)
    };
    let deployed = tree(&[]);
    assert!(
        deployed.contains("seckill-shared feature \"default\""),
        "{deployed}"
    );
    assert!(
        !deployed.contains("feature \"failpoints\""),
        "a root build of the functions compiles `failpoints` into them:\n{deployed}"
    );
    assert!(
        !deployed.contains("seckill-testkit v"),
        "a root build of the functions compiles the test kit:\n{deployed}"
    );
    // The kit and the tools built on it turn no pause point on: only the tests crate does.
    let tools = tree(&[
        "-p",
        "seckill-testkit",
        "-p",
        "seckill-bench",
        "-p",
        "seckill-loadgen",
    ]);
    assert!(tools.contains("seckill-testkit v"), "{tools}");
    assert!(
        !tools.contains("feature \"failpoints\""),
        "the test kit or a tool on it compiles `failpoints`:\n{tools}"
    );
    let workspace = tree(&["--workspace"]);
    assert!(workspace.contains("feature \"failpoints\""), "{workspace}");
}

/// Each function's Redis ACL user (scripts/redis_acl.py, the template's ElastiCache users)
/// lists exactly the Lua scripts its built binary carries: a script a function starts to run
/// without its user allowing the script's commands fails here, not in production; one it no
/// longer runs is dropped from its user. The two that load the scripts as the loader (preheat,
/// seckill-migrate) carry every one; what preheat runs as its own user is proven by its runs
/// in the tests, each as that user.
#[test]
fn each_functions_redis_user_lists_exactly_the_scripts_its_binary_carries() {
    let dir = build_all();
    let users = testkit::redis_acl_users();
    let carried = |binary: &str| -> Vec<&str> {
        let bytes = std::fs::read(dir.join(binary)).unwrap();
        let mut names: Vec<&str> = seckill_shared::store::scripts::SOURCES
            .iter()
            .filter(|(_, source)| memchr::memmem::find(&bytes, source.as_bytes()).is_some())
            .map(|(name, _)| *name)
            .collect();
        names.sort_unstable();
        names
    };
    let every: Vec<&str> = {
        let mut all: Vec<&str> = seckill_shared::store::scripts::SOURCES
            .iter()
            .map(|(name, _)| *name)
            .collect();
        all.sort_unstable();
        all
    };
    for function in FUNCTIONS {
        if function == "preheat" {
            assert_eq!(carried(function), every, "preheat loads every script");
            continue;
        }
        let declared: Vec<&str> = users[function]["scripts"]
            .as_array()
            .unwrap_or_else(|| panic!("scripts/redis_acl.py has no user for {function}"))
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        assert_eq!(
            carried(function),
            declared,
            "{function}: the scripts its binary carries vs its Redis user's (scripts/redis_acl.py)"
        );
    }
    assert_eq!(
        carried(MIGRATE),
        every,
        "the migration runs no script, and loads every one"
    );
}
