//! Every function, invoked as Lambda runs it: `cargo lambda watch` emulates the Lambda runtime
//! API and runs each function's real `main.rs` binary; `cargo lambda invoke` sends it the event
//! fixture from `events/`. So the wiring (tracing, `Config` from the environment, client setup),
//! the event parsing and the response shape are tested, against the real local Redis, PostgreSQL
//! and SQS emulator.
//!
//! cargo-lambda comes from `.tools/venv/bin` (`make stack` installs it). Without it the test says
//! so and passes, so a plain `cargo test` on a machine without the venv is not a failure; under
//! `make test` it is always there.
//!
//! Arrange: a fresh database (activity 1 = an open sale, because the events name activity 1),
//! a fresh Redis key prefix and a fresh queue, handed to the functions through the environment.
//! The one sequence then follows a purchase through the system: the migrate function finds
//! nothing left to apply, preheat loads activity 1,
//! the entry accepts alice's purchase (202), the consumer writes it (the real message, plus the
//! fixture's second record, whose reservation never existed and is recorded as
//! `reservation_expired`), the entry reports it confirmed, the admin creates activity 2 and
//! reconcile reports.

use anyhow::Context;
use seckill_shared::domain::activity;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};

/// The functions, by binary name (template.yaml's `Binary` values); `seckill-migrate` is the
/// one-shot migration the template deploys as a function too.
const FUNCTIONS: [&str; 6] = [
    "seckill-entry",
    "order-consumer",
    "preheat",
    "reconcile",
    "admin",
    "seckill-migrate",
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace")
        .to_path_buf()
}

/// `cargo-lambda` from the project venv, else from PATH.
fn cargo_lambda() -> Option<PathBuf> {
    let venv = repo_root().join(".tools/venv/bin/cargo-lambda");
    if venv.is_file() {
        return Some(venv);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("cargo-lambda"))
            .find(|p| p.is_file())
    })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free local port")
}

/// A `cargo lambda watch` process; killed (with the functions it spawned) on drop.
struct Watch {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            // It runs in its own process group (see `start`): end the group, which holds the
            // function processes it spawned as well, and nothing else.
            kill_group(pid);
        }
        let _ = self.child.start_kill();
    }
}

fn kill_group(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", "--", &format!("-{pid}")])
        .stderr(Stdio::null())
        .status();
}

impl Watch {
    async fn start(bin: &Path, env: &[(&str, String)]) -> anyhow::Result<Self> {
        let port = free_port();
        let log = std::env::temp_dir().join(format!("seckill-lambda-watch-{port}.log"));
        let log_file = std::fs::File::create(&log)?;
        let mut cmd = Command::new(bin);
        cmd.current_dir(repo_root())
            .args(["lambda", "watch", "--ignore-changes"])
            .args(["--invoke-address", "127.0.0.1"])
            .args(["--invoke-port", &port.to_string()])
            .args(["--timeout", "300"])
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .process_group(0)
            .kill_on_drop(true);
        // Secrets Manager is not used locally: the functions take DATABASE_URL as it is.
        for name in [
            "DATABASE_SECRET_ARN",
            "REDIS_AUTH_SECRET_ARN",
            "DATABASE_HOST",
            "REDIS_CLUSTER",
            "RUST_LOG",
        ] {
            cmd.env_remove(name);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().context("failed to start cargo lambda watch")?;
        let watch = Self { child, port, log };
        watch.wait_until_answering().await?;
        Ok(watch)
    }

    /// The runtime API answers plain HTTP (404 on `/`) once it is up.
    async fn wait_until_answering(&self) -> anyhow::Result<()> {
        for _ in 0..240 {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        anyhow::bail!(
            "cargo lambda watch did not answer on port {} within 60 s:\n{}",
            self.port,
            self.log_tail()
        )
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// `cargo lambda invoke <function> --data-file <event>`: the function's response as JSON.
    async fn invoke(&self, bin: &Path, function: &str, event: &Path) -> anyhow::Result<Value> {
        let run = Command::new(bin)
            .current_dir(repo_root())
            .args(["lambda", "invoke", function])
            .arg("--data-file")
            .arg(event)
            .args(["--invoke-address", "127.0.0.1"])
            .args(["--invoke-port", &self.port.to_string()])
            .args(["--output-format", "json"])
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        // The first invocation of a function builds its binary (`cargo run --bin`).
        let started = std::time::Instant::now();
        let out = tokio::time::timeout(Duration::from_secs(240), run)
            .await
            .with_context(|| format!("invoking {function} timed out:\n{}", self.log_tail()))??;
        eprintln!("invoked {function} in {:?}", started.elapsed());
        let stdout = String::from_utf8_lossy(&out.stdout);
        anyhow::ensure!(
            out.status.success(),
            "cargo lambda invoke {function} failed ({}):\nstdout: {stdout}\nstderr: {}\nwatch log:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            self.log_tail()
        );
        serde_json::from_str(stdout.trim()).with_context(|| {
            format!(
                "{function} answered something that is not JSON: {stdout}\nwatch log:\n{}",
                self.log_tail()
            )
        })
    }
}

fn event(name: &str) -> PathBuf {
    repo_root().join("events").join(name)
}

fn read_event(name: &str) -> Value {
    let text = std::fs::read_to_string(event(name)).expect("event fixture exists");
    serde_json::from_str(&text).expect("event fixture is JSON")
}

/// An order route's event (`/orders/1/...`) for another order id, in a file of its own.
fn with_order_id(name: &str, order_id: i64) -> anyhow::Result<PathBuf> {
    let mut e = read_event(name);
    let path = e["rawPath"].as_str().context("an HTTP event")?.replacen(
        "/orders/1/",
        &format!("/orders/{order_id}/"),
        1,
    );
    e["rawPath"] = Value::from(path.as_str());
    e["requestContext"]["http"]["path"] = Value::from(path.as_str());
    e["pathParameters"]["orderId"] = Value::from(order_id.to_string());
    let file =
        std::env::temp_dir().join(format!("seckill-{order_id}-{}-{name}", std::process::id()));
    std::fs::write(&file, serde_json::to_vec(&e)?)?;
    Ok(file)
}

/// An HTTP API response's status and JSON body.
fn http_response(function: &str, resp: &Value) -> (u64, Value) {
    let status = resp["statusCode"]
        .as_u64()
        .unwrap_or_else(|| panic!("{function}: not an HTTP API response: {resp}"));
    let body = resp["body"]
        .as_str()
        .map(|b| serde_json::from_str(b).unwrap_or(Value::String(b.into())))
        .unwrap_or(Value::Null);
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_function_answers_its_event_through_the_lambda_runtime_api() -> anyhow::Result<()> {
    let Some(bin) = cargo_lambda() else {
        eprintln!(
            "SKIPPED: cargo-lambda is not installed (.tools/venv/bin or PATH); \
             `make stack` or `make tools-lambda` installs it"
        );
        return Ok(());
    };

    // ------------------------------------------------------------------ arrange
    let (database_url, pool) = testkit::fresh_database().await?;
    let config = testkit::config(&database_url, testkit::RedisKind::Standalone);
    let sqs = seckill_shared::infra::sqs::sqs_client().await;
    let queue_url = testkit::fresh_queue(&sqs, 30, 5).await?;
    // The events name activity 1: the first row of a fresh database once its ids start at 1
    // (a test database's start at a random place). Open now, so the purchase event meets an
    // open window.
    sqlx::query("alter table activities alter column id restart with 1")
        .execute(&pool)
        .await?;
    let activity = activity::insert(
        &pool,
        &testkit::new_activity()
            .title("lambda invoke sale")
            .stock(10)
            .limit(1)
            .build()
            .settings()?,
    )
    .await?;
    assert_eq!(activity.id, 1, "the events reference activity 1");

    let env = [
        ("DATABASE_URL", database_url.clone()),
        ("SECKILL_KEY_PREFIX", config.key_prefix.clone()),
        // Each binary logs in as its function's role and Redis user, as its secrets do in AWS.
        ("SECKILL_LOCAL_LOGINS", "true".into()),
        ("ORDER_QUEUE_URL", queue_url.clone()),
        ("ENTRY_QUEUE_URL", testkit::entries_url(&queue_url)),
        (
            "REDIS_URL",
            std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
        ),
        (
            "AWS_ENDPOINT_URL_SQS",
            std::env::var("AWS_ENDPOINT_URL_SQS")
                .unwrap_or_else(|_| "http://127.0.0.1:4566".into()),
        ),
        (
            "AWS_REGION",
            std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into()),
        ),
        (
            "AWS_ACCESS_KEY_ID",
            std::env::var("AWS_ACCESS_KEY_ID").unwrap_or_else(|_| "test".into()),
        ),
        (
            "AWS_SECRET_ACCESS_KEY",
            std::env::var("AWS_SECRET_ACCESS_KEY").unwrap_or_else(|_| "test".into()),
        ),
        ("LOG_LEVEL", "info".into()),
    ];

    // Build the five binaries first: it holds cargo's lock once, instead of five `cargo run`s
    // from the watch process each waiting for it inside an invocation's timeout. (`make test`
    // builds them before the tests, so this is a no-op there.)
    let started = std::time::Instant::now();
    let build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(repo_root())
        .arg("build")
        .args(FUNCTIONS.iter().flat_map(|f| ["--bin", f]))
        .stdin(Stdio::null())
        .output()
        .await?;
    assert!(
        build.status.success(),
        "cargo build of the functions failed:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );

    eprintln!("functions built in {:?}", started.elapsed());
    let watch = Watch::start(&bin, &env).await?;
    eprintln!("cargo lambda watch answering on port {}", watch.port);

    // ------------------------------------------------------------------ migrate
    // fresh_database already migrated: the function finds nothing to apply.
    let empty_event = std::env::temp_dir().join(format!("seckill-empty-{}.json", watch.port));
    std::fs::write(&empty_event, "{}")?;
    let report = watch.invoke(&bin, "seckill-migrate", &empty_event).await?;
    let _ = std::fs::remove_file(&empty_event);
    assert_eq!(report["applied"], serde_json::json!([]), "{report}");
    assert!(report["latest"].is_i64(), "{report}");
    assert!(
        !report["database"].as_str().unwrap_or("").is_empty(),
        "the report names the (redacted) database: {report}"
    );

    // ------------------------------------------------------------------ preheat
    let report = watch
        .invoke(&bin, "preheat", &event("preheat-scheduled.json"))
        .await?;
    assert!(
        report.is_object(),
        "preheat answers a JSON report: {report}"
    );
    let loaded = report.to_string();
    assert!(
        report["loadedIds"]
            .as_array()
            .is_some_and(|ids| ids.contains(&Value::from(1))),
        "preheat loaded activity 1: {loaded}"
    );

    // ------------------------------------------------------------------ purchase (user alice)
    let purchase = read_event("entry-purchase.json");
    assert_eq!(
        purchase["requestContext"]["authorizer"]["jwt"]["claims"]["sub"], "alice",
        "the purchase event is alice's"
    );
    let resp = watch
        .invoke(&bin, "seckill-entry", &event("entry-purchase.json"))
        .await?;
    let (status, body) = http_response("seckill-entry", &resp);
    assert_eq!(status, 202, "purchase accepted: {body}");
    assert_eq!(body["status"], "pending", "{body}");
    let request_id = body["requestId"]
        .as_str()
        .context("a requestId")?
        .to_string();

    // ------------------------------------------------------------------ consumer batch
    // The real message the entry sent replaces the fixture's first record; the second record
    // (bob, a request Redis never reserved) stays as it is.
    let received = sqs
        .receive_message()
        .queue_url(&queue_url)
        .max_number_of_messages(10)
        .wait_time_seconds(5)
        .send()
        .await?;
    let message = received
        .messages()
        .first()
        .context("the entry sent one order message")?
        .clone();
    let message_body = message.body().unwrap_or_default().to_string();
    assert!(message_body.contains(&request_id), "{message_body}");
    let mut batch = read_event("order-consumer-batch.json");
    batch["Records"][0]["body"] = Value::from(message_body);
    batch["Records"][0]["messageId"] = Value::from(message.message_id().unwrap_or_default());
    batch["Records"][0]["receiptHandle"] =
        Value::from(message.receipt_handle().unwrap_or_default());
    let batch_file = std::env::temp_dir().join(format!("seckill-batch-{}.json", watch.port));
    std::fs::write(&batch_file, serde_json::to_vec(&batch)?)?;

    let resp = watch.invoke(&bin, "order-consumer", &batch_file).await?;
    let _ = std::fs::remove_file(&batch_file);
    assert_eq!(
        resp["batchItemFailures"],
        serde_json::json!([]),
        "every record settled: {resp}"
    );
    let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "select user_id, status, failure_reason from orders where activity_id = 1 order by user_id",
    )
    .fetch_all(&pool)
    .await?;
    let statuses: Vec<(&str, &str, Option<&str>)> = rows
        .iter()
        .map(|(u, s, r)| (u.as_str(), s.as_str(), r.as_deref()))
        .collect();
    assert_eq!(
        statuses,
        [
            ("alice", "confirmed", None),
            ("bob", "failed", Some("reservation_expired"))
        ],
        "alice's order written, bob's unreserved request recorded as failed: {rows:?}"
    );

    // ------------------------------------------------------------------ order status
    let resp = watch
        .invoke(&bin, "seckill-entry", &event("entry-order-status.json"))
        .await?;
    let (status, body) = http_response("seckill-entry", &resp);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "confirmed", "{body}");
    assert_eq!(
        body["requestId"],
        Value::from(request_id.as_str()),
        "{body}"
    );

    // ------------------------------------------------------------------ the other user routes
    // Anyone's: the public view and the two health checks.
    for (file, want) in [
        ("entry-public-view.json", 200),
        ("entry-health.json", 200),
        ("entry-health-deep.json", 200),
    ] {
        let resp = watch.invoke(&bin, "seckill-entry", &event(file)).await?;
        let (status, body) = http_response("seckill-entry", &resp);
        assert_eq!(status, want, "{file}: {body}");
    }
    // alice's order by its id: cancelled (stock and quota back), then too late to pay.
    let order_id: i64 = sqlx::query_scalar("select id from orders where user_id = 'alice'")
        .fetch_one(&pool)
        .await?;
    for (file, want) in [("entry-cancel.json", 200), ("entry-pay.json", 409)] {
        let resp = watch
            .invoke(&bin, "seckill-entry", &with_order_id(file, order_id)?)
            .await?;
        let (status, body) = http_response("seckill-entry", &resp);
        assert_eq!(status, want, "{file}: {body}");
    }
    let status: String = sqlx::query_scalar("select status from orders where id = $1")
        .bind(order_id)
        .fetch_one(&pool)
        .await?;
    assert_eq!(status, "cancelled");

    // ------------------------------------------------------------------ admin create
    let resp = watch
        .invoke(&bin, "admin", &event("admin-create-activity.json"))
        .await?;
    let (status, body) = http_response("admin", &resp);
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        body["id"], 2,
        "the second activity of the fresh database: {body}"
    );

    // ------------------------------------------------------------------ the other admin routes
    for (file, want) in [
        ("admin-get-activity.json", 200),
        ("admin-update-activity.json", 200),
        ("admin-list-activities.json", 200),
        ("admin-ops.json", 200),
    ] {
        let resp = watch.invoke(&bin, "admin", &event(file)).await?;
        let (status, body) = http_response("admin", &resp);
        assert_eq!(status, want, "{file}: {body}");
    }
    let listed = watch
        .invoke(&bin, "admin", &event("admin-list-activities.json"))
        .await?;
    let (_, body) = http_response("admin", &listed);
    assert_eq!(body["items"].as_array().map(Vec::len), Some(2), "{body}");
    let title: String = sqlx::query_scalar("select title from activities where id = 2")
        .fetch_one(&pool)
        .await?;
    assert_eq!(title, "Black Friday 1-yuan phone (restocked)");

    // ------------------------------------------------------------------ reconcile
    let report = watch
        .invoke(&bin, "reconcile", &event("reconcile-scheduled.json"))
        .await?;
    assert!(
        report.is_object(),
        "reconcile answers a JSON report: {report}"
    );

    drop(watch);
    Ok(())
}
