//! The report's text (RESULTS.md, results.json) for fixed results, compared byte for byte with
//! the committed golden files in `golden/`. A change to what they say fails here; when the change
//! is meant, regenerate them with `UPDATE_GOLDEN=1 cargo test -p seckill-bench report` and commit
//! the new files on their own.

use super::{Document, Machine};
use crate::binaries::BinaryRow;
use crate::buckets::{BucketRow, NodeShare};
use crate::consumer::{ConsumerResults, ConsumerRun};
use crate::costs::{Cost, Variant};
use crate::entry::{EntryResults, Measure, PublicView};
use crate::memory::MemoryRow;
use crate::polls::PollResults;
use crate::results::{Results, Sizes};
use crate::scripts::ScriptRow;
use crate::strategies::{KillRun, Row};
use std::path::PathBuf;

fn machine() -> Machine {
    Machine {
        uname: "Linux bench 6.1.0 x86_64 GNU/Linux".into(),
        cpu: "Example CPU @ 2.00GHz".into(),
        nproc: 2,
        load_start: "0.50 0.40 0.30".into(),
        load_end: "1.50 1.20 0.90".into(),
        redis_version: "7.2.4".into(),
        redis_clients_at_start: Some(3),
        date: "2025-01-02T03:04:05Z".into(),
        command: "cargo run --release -p seckill-bench -- --quick".into(),
        seconds: 123.456,
    }
}

fn sizes() -> Sizes {
    Sizes {
        attempts: 3_000,
        kill_attempts: 1_000,
        concurrency: 64,
        db_pool: 16,
        rejections: 10_000,
        sold_out: 20_000,
        http: 3_000,
        sqs_sends: 40,
        sqs_concurrency: 16,
        consumer_orders: 400,
        consumer_instances: 4,
        consumer_connections: 4,
        memory_users: vec![10_000, 100_000],
        init_repeats: 1,
        poll_orders: 100_000,
        polls: 5_000,
        bucket_stock: 300,
        bucket_attempts: 3_000,
        bucket_counts: vec![1, 3, 8],
        draw_entrants: vec![10_000],
        draw_baseline_max: 100_000,
        reconcile_ledger: 10_000,
    }
}

/// A strategy row; the caller sets what makes it different.
fn row(name: &'static str, workload: &'static str, attempts_per_s: f64) -> Row {
    Row {
        name,
        workload,
        attempts: 3_000,
        stock: 3_000,
        concurrency: 64,
        seconds: 1.234,
        attempts_per_s,
        p50_ms: 1.2345,
        p99_ms: 9.8765,
        redis_commands_per_attempt: 4.005,
        round_trips_per_attempt: 1.0,
        command_detail: [("evalsha".to_string(), 3_000)].into(),
        sold: 3_000,
        busy: 0,
        oversell: 0,
        final_stock: 0,
        negative_seen: false,
        negative_observed_by_clients: 0,
        min_stock_sampled: Some(0),
        stock_samples: 250,
        leaked: None,
        kill: None,
        errors: 0,
    }
}

fn kill(leaked: i64) -> KillRun {
    KillRun {
        attempts: 1_000,
        stock: 1_000,
        died: 10,
        sold: 985,
        pending_in_ledger: 5,
        final_stock: 10 - leaked,
        leaked,
    }
}

/// Every branch of the strategies table: negative stock with and without a sampled minimum,
/// kill runs and none, busy answers, and no `db-only` row (its ratio is "not measured").
fn rows() -> Vec<Row> {
    let lua = Row {
        leaked: Some(0),
        kill: Some(kill(0)),
        ..row("lua", "success-heavy", 20_123.456)
    };
    let hincrby = Row {
        negative_seen: true,
        negative_observed_by_clients: 17,
        min_stock_sampled: Some(-3),
        leaked: Some(4),
        kill: Some(kill(4)),
        ..row("hincrby", "success-heavy", 15_000.5)
    };
    let lock = Row {
        sold: 2_900,
        busy: 100,
        leaked: Some(2),
        kill: Some(kill(2)),
        ..row("lock", "success-heavy", 3_456.7)
    };
    let limit = row("limit", "success-heavy", 25_000.0);
    let lua_fh = Row {
        stock: 30,
        sold: 30,
        ..row("lua", "failure-heavy", 30_000.0)
    };
    let hincrby_fh = Row {
        stock: 30,
        sold: 30,
        negative_seen: true,
        negative_observed_by_clients: 2_970,
        min_stock_sampled: None,
        ..row("hincrby", "failure-heavy", 12_000.0)
    };
    let lock_fh = Row {
        stock: 30,
        sold: 30,
        ..row("lock", "failure-heavy", 0.0)
    };
    vec![lua, hincrby, lock, limit, lua_fh, hincrby_fh, lock_fh]
}

fn measure(what: &str, per_s: f64, commands: Option<f64>) -> Measure {
    Measure {
        what: what.into(),
        attempts: 3_000,
        concurrency: 64,
        per_s,
        p50_ms: 0.5555,
        p99_ms: 2.0005,
        redis_commands_per_attempt: commands,
        errors: 0,
    }
}

fn script_row(
    script: &'static str,
    workload: &'static str,
    us: Option<f64>,
    in_commands: Option<f64>,
) -> ScriptRow {
    ScriptRow {
        script,
        what: script,
        workload,
        attempts: 3_000,
        stock: 3_000,
        concurrency: 64,
        attempts_per_s: 40_000.4,
        p50_ms: 1.5,
        p99_ms: 3.25,
        server_us_per_call: us,
        commands_us_per_call: in_commands,
        redis_commands_per_call: 4.5,
        sold: 3_000,
        errors: 0,
    }
}

/// The combined GET/SISMEMBER/DECR/SADD script and ours under both workloads (both ratios
/// measured, and the difference line of each), ours' commands alone (the floor line), a peer
/// without a server figure ("-"), the empty script under one workload.
fn scripts() -> Vec<ScriptRow> {
    vec![
        script_row("combined", "success-heavy", Some(4.0), Some(1.5)),
        script_row("hmdp", "success-heavy", None, None),
        script_row("ours", "success-heavy", Some(6.0), Some(2.25)),
        script_row("ours-commands", "success-heavy", Some(5.0), Some(2.5)),
        script_row("combined", "failure-heavy", Some(2.0), Some(0.5)),
        script_row("ours", "failure-heavy", Some(2.2), Some(1.0)),
        script_row("floor", "failure-heavy", Some(0.75), Some(0.0)),
    ]
}

fn bucket_row(buckets: u32, attempts_per_s: f64, shares: [(u32, u64); 3]) -> BucketRow {
    let scripts: u64 = shares.iter().map(|(_, calls)| calls).sum();
    let nodes = shares
        .iter()
        .zip(["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"])
        .map(|(&(held, calls), node)| NodeShare {
            node: node.into(),
            buckets: held,
            script_calls: calls,
            share: 100.0 * calls as f64 / scripts as f64,
            commands: 3 * calls,
            cpu_ms: calls as f64 * 0.0125,
        })
        .collect();
    BucketRow {
        buckets,
        attempts: 3_000,
        stock: 300,
        concurrency: 64,
        seconds: 0.5,
        attempts_per_s,
        p50_ms: 2.5,
        p99_ms: 7.125,
        sold_out_after_s: 0.125,
        selling_attempts_per_s: attempts_per_s * 1.5,
        nodes,
        bench_cpu_ms: 250.0,
        cores_busy: 1.5,
        cores: 2,
        script_calls_per_attempt: scripts as f64 / 3_000.0,
        redis_commands_per_attempt: 3.0 * scripts as f64 / 3_000.0,
        sold: 300,
        sold_out: 2_700,
        stock_left: 0,
        in_transfer: 0,
        reserved: 300,
        undersell: Some(0),
        errors: 0,
    }
}

/// One bucket (one node by design), three with the goal met, eight with it missed and a unit
/// left unsold.
fn bucket_rows() -> Vec<BucketRow> {
    let eight = BucketRow {
        sold: 299,
        stock_left: 1,
        undersell: Some(1),
        ..bucket_row(8, 9_000.0, [(3, 12_000), (4, 10_500), (1, 1_500)])
    };
    vec![
        bucket_row(1, 12_000.0, [(0, 0), (1, 3_000), (0, 0)]),
        bucket_row(3, 15_000.0, [(1, 2_700), (1, 2_800), (1, 2_900)]),
        eight,
    ]
}

fn polls() -> PollResults {
    PollResults {
        orders_in_table: 100_000,
        insert_seconds: 2.345,
        polls: 5_000,
        concurrency: 16,
        polls_per_s: 9_000.5,
        p50_ms: 1.75,
        p99_ms: 4.5,
        db_execution_ms: 0.0456,
        db_round_trip_ms: 0.2345,
        plan_indexes: vec!["orders_by_buyer".into()],
        errors: 0,
    }
}

fn cost(candidate: &str, before_us: f64, after: Option<f64>) -> Cost {
    Cost {
        candidate: candidate.into(),
        before: Variant {
            what: format!("{candidate}, before"),
            us: before_us,
            allocations: 3.0,
        },
        after: after.map(|us| Variant {
            what: format!("{candidate}, after"),
            us,
            allocations: 0.5,
        }),
    }
}

/// The HTTP pair and the public view measured, the accepted / SQS pair not (those rows and
/// that ratio are absent).
fn entry() -> EntryResults {
    EntryResults {
        request_build_us: 3.456,
        in_process: measure("router (already_purchased)", 18_000.0, Some(5.0)),
        in_process_with_build: measure("router + request build", 15_000.0, Some(5.0)),
        bare_script: measure("bare EVALSHA (already_purchased)", 20_000.0, Some(4.9996)),
        entry_vs_limit: 0.9,
        entry_vs_limit_with_request_build: 0.75,
        sold_out_router: measure("router (sold-out flood)", 200_000.0, Some(0.0)),
        sold_out_router_with_build: measure("router + request build (sold out)", 90_000.0, None),
        sold_out_bare_script: measure("bare EVALSHA (sold out)", 25_000.0, Some(1.0)),
        sold_out_cache_vs_limit: 8.0,
        sold_out_cache_vs_limit_with_request_build: 3.6,
        http_entry: Some(measure("HTTP entry", 5_000.0, None)),
        http_trivial: Some(measure("HTTP trivial route", 8_000.0, None)),
        http_entry_vs_trivial: Some(0.625),
        accepted_router: None,
        sqs_bare_send: None,
        accepted_vs_sqs: None,
        view: Some(PublicView {
            view: measure("HTTP public view", 4_000.0, None),
            sold_out: measure("HTTP sold out", 8_000.0, None),
            view_vs_sold_out: 0.5,
            db_transactions: 2_999,
            db_transactions_per_request: 0.99967,
            unknown: measure("HTTP unknown ids", 6_000.0, None),
            unknown_db_transactions: 2,
            unknown_db_transactions_per_request: 0.0007,
        }),
        sequential_entry: measure("router, one at a time", 4_000.0, Some(4.0)),
        sequential_call: measure("store::purchase::run, one at a time", 4_800.0, Some(4.0)),
        sequential_bare: measure("bare EVALSHA, one at a time", 5_000.0, Some(4.0)),
        entry_overhead_us: 50.0,
        call_overhead_us: 8.3,
        costs: vec![cost("span", 2.5, Some(0.1)), cost("request id", 0.3, None)],
    }
}

fn consumer_run(what: &str, orders_per_s: f64, batched: u64) -> ConsumerRun {
    ConsumerRun {
        what: what.into(),
        orders: 400,
        committed: 400,
        failed_or_retried: 3,
        batched,
        seconds: 0.4,
        orders_per_s,
        db_orders: 400,
        db_remaining_stock: 0,
    }
}

fn consumer() -> ConsumerResults {
    ConsumerResults {
        instances: 4,
        connections_per_instance: 4,
        batch_size: 10,
        handle_batch: consumer_run("handle_batch", 2_500.4, 390),
        handle_batch_per_message: consumer_run("handle_batch, one message per batch", 900.0, 0),
        baseline: consumer_run("baseline: one transaction per order", 1_000.0, 0),
        bare_inserts: consumer_run("bare inserts: one autocommit single-row INSERT", 2_000.0, 0),
        consumer_vs_baseline: 2.5004,
        consumer_batch_vs_bare_inserts: 1.2502,
    }
}

fn memory(users: usize, id_format: &'static str) -> MemoryRow {
    MemoryRow {
        users,
        id_format,
        user_set_bytes: 64 * users as u64,
        user_set_encoding: "hashtable".into(),
        ledger_bytes: 123 * users as u64 + 45,
        ledger_encoding: "hashtable".into(),
        user_set_bytes_per_participant: 64.0,
        ledger_bytes_per_participant: 123.0045,
        bytes_per_participant: 187.0045,
    }
}

fn binary(name: &'static str) -> BinaryRow {
    BinaryRow {
        name,
        path: format!("target/release/{name}"),
        built: true,
        size_bytes: Some(12_345_678),
        stripped: Some(true),
        init_ms: vec![10.04, 12.25, 11.0],
        init_ms_median: Some(11.0),
        error: None,
    }
}

/// Built and stripped, built but not stripped and failing to start (with and without an error
/// message), and not built at all.
fn binaries() -> Vec<BinaryRow> {
    let unstripped_failing = BinaryRow {
        stripped: Some(false),
        init_ms: Vec::new(),
        init_ms_median: None,
        error: Some("no request within 10 s".into()),
        ..binary("order-consumer")
    };
    let unknown_failure = BinaryRow {
        stripped: None,
        init_ms: vec![1.0],
        init_ms_median: None,
        ..binary("preheat")
    };
    let not_built = BinaryRow {
        built: false,
        size_bytes: None,
        stripped: None,
        init_ms: Vec::new(),
        init_ms_median: None,
        ..binary("admin")
    };
    vec![
        binary("seckill-entry"),
        unstripped_failing,
        unknown_failure,
        not_built,
    ]
}

/// The draw section's two rows at one size.
fn draw_rows() -> Vec<crate::draw::DrawRow> {
    let row = |draw: &'static str, calls: usize, longest_script_us: u64, draw_ms: f64| {
        crate::draw::DrawRow {
            entrants: 10_000,
            draw,
            stock: 1_000,
            calls,
            winners: 1_000,
            longest_script_us,
            longest_call: "draw.lua".to_string(),
            longest_transaction_ms: None,
            draw_ms,
            pings: 420,
            ping_max_ms: 1.234,
            entries_per_sec: 25_000.4,
            bytes_per_entrant: 151.25,
        }
    };
    vec![
        row("whole pool", 1, 73_456, 75.5),
        row("steps", 8, 1_234, 20.25),
    ]
}

/// The reconcile section's two rows.
fn reconcile_rows() -> Vec<crate::reconcile::ReconcileRow> {
    let row = |what: &'static str, ms: f64, given_back: usize, longest: (u64, &str)| {
        crate::reconcile::ReconcileRow {
            ledger: 10_000,
            stale: 5_000,
            what,
            ms,
            given_back,
            out_of_time: false,
            longest_call_us: longest.0,
            longest_call: longest.1.into(),
            pings: 900,
            ping_max_ms: 2.5,
        }
    };
    vec![
        row("whole-ledger snapshot", 12.5, 0, (11_234, "evalsha")),
        row("one run", 5_432.1, 5_000, (1_234, "evalsha")),
    ]
}

fn full_results() -> Results {
    Results {
        rows: rows(),
        scripts: scripts(),
        buckets: bucket_rows(),
        entry: Some(entry()),
        consumer: Some(consumer()),
        polls: Some(polls()),
        draw: draw_rows(),
        reconcile: reconcile_rows(),
        memory: vec![memory(10_000, "user-0000001"), memory(100_000, "uuid")],
        binaries: binaries(),
    }
}

/// Compares `actual` with `golden/<name>`, or writes it there under `UPDATE_GOLDEN=1`.
fn assert_golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("src/report/golden")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().expect("golden dir")).expect("create golden dir");
        std::fs::write(&path, actual).expect("write golden file");
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    if let Some((i, (want, got))) = expected
        .lines()
        .zip(actual.lines())
        .enumerate()
        .find(|(_, (want, got))| want != got)
    {
        panic!(
            "{} differs at line {}:\n  golden: {want}\n  now:    {got}",
            path.display(),
            i + 1
        );
    }
    assert_eq!(
        expected,
        actual,
        "{} differs (length or line endings)",
        path.display()
    );
}

#[test]
fn results_md_for_a_full_run_matches_the_golden_file() {
    let doc = Document::new(machine(), sizes(), full_results());
    assert_golden("full-run.md", &doc.markdown());
}

#[test]
fn results_md_for_a_run_with_no_sections_matches_the_golden_file() {
    let doc = Document::new(machine(), sizes(), Results::default());
    assert_golden("no-sections.md", &doc.markdown());
}

#[test]
fn results_json_for_a_full_run_matches_the_golden_file() {
    let doc = Document::new(machine(), sizes(), full_results());
    let json = serde_json::to_string_pretty(&doc.json()).expect("results serialize");
    assert_golden("full-run.json", &json);
}

#[test]
fn printed_table_is_the_middle_of_results_md() {
    let doc = Document::new(machine(), sizes(), full_results());
    let (table, markdown) = (doc.table(), doc.markdown());
    assert!(table.starts_with("Stock deduction, 3000 attempts per row"));
    assert!(markdown.contains(&format!(")\n\n{table}## How it was measured\n")));
}
