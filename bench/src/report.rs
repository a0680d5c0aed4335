//! The printed table, `RESULTS.md` and `results.json`.

use crate::{Results, Sizes};
use serde_json::{json, Value};
use std::fmt::Write;
use std::time::Duration;

/// Where and when the run happened.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Machine {
    pub uname: String,
    pub cpu: String,
    pub nproc: usize,
    pub load_start: String,
    pub load_end: String,
    pub redis_version: String,
    pub redis_clients_at_start: Option<i64>,
    pub date: String,
    pub command: String,
    pub seconds: f64,
}

impl Machine {
    pub async fn probe() -> Self {
        let uname = std::process::Command::new("uname")
            .arg("-a")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let args: Vec<String> = std::env::args().skip(1).collect();
        Self {
            uname,
            cpu,
            nproc: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            load_start: loadavg(),
            load_end: String::new(),
            redis_version: String::new(),
            redis_clients_at_start: None,
            date: String::new(),
            command: format!(
                "cargo run --release -p seckill-bench{}{}",
                if args.is_empty() { "" } else { " -- " },
                args.join(" ")
            ),
            seconds: 0.0,
        }
    }

    pub async fn finish(
        mut self,
        started: chrono::DateTime<chrono::Utc>,
        took: Duration,
        clients: (Option<i64>, String),
    ) -> Self {
        self.load_end = loadavg();
        self.date = started.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        self.seconds = took.as_secs_f64();
        self.redis_clients_at_start = clients.0;
        self.redis_version = clients.1;
        self
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Connected clients and server version, to judge how alone the bench was on Redis.
pub async fn redis_clients(con: &mut redis::aio::MultiplexedConnection) -> (Option<i64>, String) {
    let info: String = redis::cmd("INFO")
        .query_async(con)
        .await
        .unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    (
        field("connected_clients:").and_then(|v| v.parse().ok()),
        field("redis_version:").unwrap_or_default(),
    )
}

pub struct Document {
    machine: Machine,
    sizes: Sizes,
    results: Results,
    ratios: serde_json::Map<String, Value>,
}

impl Document {
    pub fn new(machine: Machine, sizes: Sizes, results: Results) -> Self {
        let rate = |name: &str, wl: &str| {
            results
                .rows
                .iter()
                .find(|r| r.name == name && r.workload == wl)
                .map(|r| r.attempts_per_s)
        };
        let div = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => json!(round(a / b, 3)),
            _ => Value::Null,
        };
        let (sh, fh) = ("success-heavy", "failure-heavy");
        let e = results.entry.as_ref();
        let mut ratios = serde_json::Map::new();
        ratios.insert(
            "entryVsLimit".into(),
            e.map_or(Value::Null, |e| json!(round(e.entry_vs_limit, 3))),
        );
        ratios.insert(
            "entryVsLimitWithRequestBuild".into(),
            e.map_or(Value::Null, |e| {
                json!(round(e.entry_vs_limit_with_request_build, 3))
            }),
        );
        ratios.insert(
            "soldOutCacheVsLimitWithRequestBuild".into(),
            e.map_or(Value::Null, |e| {
                json!(round(e.sold_out_cache_vs_limit_with_request_build, 3))
            }),
        );
        ratios.insert(
            "soldOutCacheVsLimit".into(),
            e.map_or(Value::Null, |e| json!(round(e.sold_out_cache_vs_limit, 3))),
        );
        ratios.insert(
            "acceptedVsSqs".into(),
            e.and_then(|e| e.accepted_vs_sqs)
                .map_or(Value::Null, |v| json!(round(v, 3))),
        );
        ratios.insert(
            "consumerVsBaseline".into(),
            results
                .consumer
                .as_ref()
                .map_or(Value::Null, |c| json!(round(c.consumer_vs_baseline, 3))),
        );
        ratios.insert(
            "luaVsHincrbyFailureHeavy".into(),
            div(rate("lua", fh), rate("hincrby", fh)),
        );
        ratios.insert("luaVsLock".into(), div(rate("lua", sh), rate("lock", sh)));
        ratios.insert(
            "luaVsLockFailureHeavy".into(),
            div(rate("lua", fh), rate("lock", fh)),
        );
        ratios.insert(
            "luaVsHincrbySuccessHeavy".into(),
            div(rate("lua", sh), rate("hincrby", sh)),
        );
        ratios.insert("luaVsLimit".into(), div(rate("lua", sh), rate("limit", sh)));
        ratios.insert(
            "luaVsLimitFailureHeavy".into(),
            div(rate("lua", fh), rate("limit", fh)),
        );
        ratios.insert(
            "luaVsDbOnly".into(),
            div(rate("lua", sh), rate("db-only", sh)),
        );
        ratios.insert(
            "httpEntryVsTrivial".into(),
            e.and_then(|e| e.http_entry_vs_trivial)
                .map_or(Value::Null, |v| json!(round(v, 3))),
        );
        Self {
            machine,
            sizes,
            results,
            ratios,
        }
    }

    pub fn json(&self) -> Value {
        let m = &self.machine;
        json!({
            "machine": {
                "uname": m.uname, "cpu": m.cpu, "nproc": m.nproc,
                "loadStart": m.load_start, "loadEnd": m.load_end,
                "redisVersion": m.redis_version, "redisClientsAtStart": m.redis_clients_at_start,
                "seconds": round(m.seconds, 1),
            },
            "date": m.date,
            "command": m.command,
            "sizes": self.sizes,
            "rows": self.results.rows,
            "ratios": self.ratios,
            "entry": self.results.entry,
            "consumer": self.results.consumer,
            "memory": self.results.memory,
            "binaries": self.results.binaries,
        })
    }

    fn ratio(&self, key: &str) -> String {
        match self.ratios.get(key).and_then(Value::as_f64) {
            Some(v) => format!("{v:.2}×"),
            None => "not measured".into(),
        }
    }

    /// The tables (printed to stdout and embedded in RESULTS.md).
    pub fn table(&self) -> String {
        let mut s = String::new();
        let r = &self.results;
        if !r.rows.is_empty() {
            let _ = writeln!(
                s,
                "Stock deduction, {} attempts per row, {} concurrent tasks (Redis rows: one shared ConnectionManager; db-only: pool of {})\n",
                self.sizes.attempts, self.sizes.concurrency, self.sizes.db_pool
            );
            s.push_str("| strategy | workload | attempts/s | p50 ms | p99 ms | Redis cmds/attempt (server) | round trips/attempt (client) | sold / stock | oversell | negative stock seen | leaked (kill run) |\n");
            s.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|\n");
            for row in &r.rows {
                let negative = if row.negative_seen {
                    format!(
                        "yes ({} client-observed, min sampled {})",
                        row.negative_observed_by_clients,
                        row.min_stock_sampled
                            .map(|v| v.to_string())
                            .unwrap_or_else(|| "-".into())
                    )
                } else {
                    "no".into()
                };
                let leaked = match &row.kill {
                    Some(k) => format!("{} ({} of {} clients died)", k.leaked, k.died, k.attempts),
                    None => "n/a".into(),
                };
                let sold = if row.busy > 0 {
                    format!("{} / {} ({} busy)", row.sold, row.stock, row.busy)
                } else {
                    format!("{} / {}", row.sold, row.stock)
                };
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.0} | {:.3} | {:.3} | {:.2} | {:.2} | {} | {} | {} | {} |",
                    row.name,
                    row.workload,
                    row.attempts_per_s,
                    row.p50_ms,
                    row.p99_ms,
                    row.redis_commands_per_attempt,
                    row.round_trips_per_attempt,
                    sold,
                    row.oversell,
                    negative,
                    leaked
                );
            }
            s.push('\n');
        }

        s.push_str(
            "Ratios (each measured in this run)\n\n| ratio | value | goal |\n|---|---:|---|\n",
        );
        for (key, goal) in [
            (
                "entryVsLimit",
                "≥ 0.8 (router + handler; requests built beforehand)",
            ),
            (
                "entryVsLimitWithRequestBuild",
                "(each attempt also builds its API Gateway-shaped request)",
            ),
            ("soldOutCacheVsLimit", "≥ 5 (requests built beforehand)"),
            (
                "soldOutCacheVsLimitWithRequestBuild",
                "(each attempt also builds its request)",
            ),
            ("acceptedVsSqs", "(shows our overhead over the emulator)"),
            ("consumerVsBaseline", "≥ 2"),
            ("luaVsHincrbyFailureHeavy", ""),
            ("luaVsLock", "(success-heavy)"),
            ("luaVsLockFailureHeavy", ""),
            ("luaVsHincrbySuccessHeavy", ""),
            (
                "luaVsLimit",
                "(success-heavy: cost of the application around the script)",
            ),
            ("luaVsLimitFailureHeavy", ""),
            ("luaVsDbOnly", "(success-heavy)"),
            ("httpEntryVsTrivial", "(reported)"),
        ] {
            let _ = writeln!(s, "| {key} | {} | {goal} |", self.ratio(key));
        }
        s.push('\n');

        if let Some(e) = &r.entry {
            let _ = writeln!(
                s,
                "Entry function (building one API Gateway-shaped request with `testing::request`: {:.2} µs single-threaded; timed only in the \"+ request build\" rows)\n",
                e.request_build_us
            );
            s.push_str("| loop | concurrency | requests/s | p50 ms | p99 ms | Redis cmds/request |\n|---|---:|---:|---:|---:|---:|\n");
            let measures = [
                Some(&e.in_process),
                Some(&e.in_process_with_build),
                Some(&e.bare_script),
                Some(&e.sold_out_router),
                Some(&e.sold_out_router_with_build),
                Some(&e.sold_out_bare_script),
                e.http_entry.as_ref(),
                e.http_trivial.as_ref(),
                e.accepted_router.as_ref(),
                e.sqs_bare_send.as_ref(),
            ];
            for m in measures.into_iter().flatten() {
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.0} | {:.3} | {:.3} | {} |",
                    m.what,
                    m.concurrency,
                    m.per_s,
                    m.p50_ms,
                    m.p99_ms,
                    m.redis_commands_per_attempt
                        .map(|c| format!("{c:.3}"))
                        .unwrap_or_else(|| "-".into())
                );
            }
            s.push('\n');
        }

        if let Some(c) = &r.consumer {
            let _ = writeln!(
                s,
                "Order consumer ({} orders on one hot activity; {} instances × {} DB connections; SQS batches of {} built in-process)\n",
                c.handle_batch.orders, c.instances, c.connections_per_instance, c.batch_size
            );
            s.push_str("| run | orders/s | committed | via batch path | failed/retried | DB orders | DB remaining |\n|---|---:|---:|---:|---:|---:|---:|\n");
            for run in [&c.handle_batch, &c.handle_batch_per_message, &c.baseline] {
                let _ = writeln!(
                    s,
                    "| {} | {:.0} | {} | {} | {} | {} | {} |",
                    run.what,
                    run.orders_per_s,
                    run.committed,
                    run.batched,
                    run.failed_or_retried,
                    run.db_orders,
                    run.db_remaining_stock
                );
            }
            s.push('\n');
        }

        if !r.memory.is_empty() {
            s.push_str("Redis memory per participant (MEMORY USAGE … SAMPLES 0; user set + pending ledger)\n\n");
            s.push_str("| participants | user id | user set B/participant | ledger B/participant | total B/participant | total MB |\n|---:|---|---:|---:|---:|---:|\n");
            for m in &r.memory {
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.1} ({}) | {:.1} ({}) | {:.1} | {:.1} |",
                    m.users,
                    m.id_format,
                    m.user_set_bytes_per_participant,
                    m.user_set_encoding,
                    m.ledger_bytes_per_participant,
                    m.ledger_encoding,
                    m.bytes_per_participant,
                    (m.user_set_bytes + m.ledger_bytes) as f64 / 1e6
                );
            }
            s.push('\n');
        }

        if !r.binaries.is_empty() {
            s.push_str("Lambda binaries (target/release; time from spawn to the first `GET …/runtime/invocation/next`)\n\n");
            s.push_str("| function | size MB | stripped | init ms (median) | runs |\n|---|---:|---|---:|---|\n");
            for b in &r.binaries {
                if !b.built {
                    let _ = writeln!(s, "| {} | not built | | | |", b.name);
                    continue;
                }
                let _ = writeln!(
                    s,
                    "| {} | {:.1} | {} | {} | {} |",
                    b.name,
                    b.size_bytes.unwrap_or(0) as f64 / 1e6,
                    if b.stripped == Some(true) {
                        "yes"
                    } else {
                        "no"
                    },
                    b.init_ms_median
                        .map(|v| format!("{v:.1}"))
                        .unwrap_or_else(|| format!(
                            "failed: {}",
                            b.error.as_deref().unwrap_or("?")
                        )),
                    b.init_ms
                        .iter()
                        .map(|v| format!("{v:.1}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            s.push('\n');
        }
        s
    }

    pub fn markdown(&self) -> String {
        let m = &self.machine;
        let mut s = String::new();
        s.push_str("# Benchmark results\n\n");
        s.push_str("Written by `make bench` (`bench/`, package `seckill-bench`); every figure below was measured in the one run described here. Absolute figures drift run to run on a shared 2-core machine; the ratios are the point.\n\n");
        let _ = writeln!(s, "- command: `{}`", m.command);
        let _ = writeln!(s, "- date: {} (run took {:.0} s)", m.date, m.seconds);
        let _ = writeln!(s, "- machine: `{}`", m.uname);
        let _ = writeln!(s, "- cpu: {} × {}", m.nproc, m.cpu);
        let _ = writeln!(
            s,
            "- load average at start / end: {} / {}",
            m.load_start, m.load_end
        );
        let _ = writeln!(
            s,
            "- Redis {} on 127.0.0.1:6379 ({} clients connected at start), PostgreSQL on 127.0.0.1:5432 (a fresh database), SQS emulator moto on 127.0.0.1:4566 (fresh queues)\n",
            m.redis_version,
            m.redis_clients_at_start.map(|c| c.to_string()).unwrap_or_else(|| "?".into())
        );
        s.push_str(&self.table());
        s.push_str(METHOD);
        s
    }
}

fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}

const METHOD: &str = r#"## How it was measured

**Workloads.** Every strategy gets the same users (`user-0000000`, `user-0000001`, … one attempt
each), the same stock and the same number of attempts, run by the same number of tokio tasks in a
closed loop (each task sends its next attempt when the previous one answered). Success-heavy: stock
= attempts. Failure-heavy: stock = 1% of attempts. Each row starts from a fresh key prefix (Redis)
or a fresh activity row (db-only); keys are deleted afterwards and the database is dropped at the end.

**Strategies.**
- `lua`: `shared::sale::purchase` (our `lua/purchase.lua` by EVALSHA: window, per-order limit,
  stock, one order per user, pending-reservation ledger), through the shared `Redis` handle.
- `hincrby`: seed 001's HINCRBY −1 on the goods hash, client-side check, compensating HINCRBY +1
  when the result is negative. No user set, no ledger.
- `lock`: seed 001's sketch: `SET lock owner NX PX 200` (retry every 1 ms, give up after 1 s:
  "busy"), `GET stock`, `DECR` if ≥ 1, owner-checked release (`lua/lock_release.lua`). No user set.
- `db-only`: one transaction per attempt: `update activities set remaining_stock = remaining_stock - 1
  where id = $1 and remaining_stock >= 1`, then the order insert (unique indexes as in production);
  a pool of 16 connections (pre-connected; pgbench here showed this hot-row transaction faster at 16
  clients than at 64).
- `limit`: the same purchase script by raw `EVALSHA`, all arguments prepared beforehand, on one
  ConnectionManager: the script with no application around it.

**Warm-up.** Before the first workload, throwaway runs of `lua`, `limit` and `hincrby` (10k
attempts each, discarded) warm connections, the script cache and the runtime; the entry section
likewise starts with discarded router and bare-script loops.

**Columns.** Latencies per attempt from hdrhistogram (µs precision). *Redis cmds/attempt (server)*
is the `INFO commandstats` delta over the run (all commands the server executed, including those
run inside scripts, minus the side sampler's own reads; server-wide, so traffic from anyone else
on the same Redis during the run would show up here too). *Round trips/attempt (client)* counts
the requests the client sent. *Oversell* = sold − stock when positive. *Negative stock seen*:
negative results the clients observed (HINCRBY/DECR) plus a side task reading the stock every ~1 ms
on its own connection. *Leaked* comes from a second, smaller "kill" run of `lua`, `hincrby` and `lock`
in which a fixed 1% of attempts drop their future between step 1 and step 2 (after HINCRBY, before
the check/compensation; after DECR, before the release; for `lua`, after the script, before the
caller records anything): leaked = initial stock − final stock − units a record accounts for
(clients' recorded sales; for `lua` the ledger's reservations, which reconcile settles or returns).

**Entry function.** `seckill_entry::router` called in-process with `tower::ServiceExt::oneshot`
(no TCP, as Lambda calls it) with requests shaped like the ones lambda_http hands over (JWT
claims in the API Gateway request context), response body read; tracing at info formatted as JSON
into a sink. The headline rows build the requests before the timed loop (in rounds of 25k), so
they time the router and handler only; the "+ request build" rows also build each request inside
the loop (`testing::request`, a JSON round trip for the context, heavier than what lambda_http
does), as an upper bound on per-event overhead. *already_purchased*: an open activity with plenty of stock whose user set already holds the
10k users, so each request runs the whole script (the sold-out cache cannot answer). It is compared
with raw EVALSHA calls of the same script, same keys and users, same concurrency, one
ConnectionManager each. *Sold-out flood*: an activity with no stock; the router answers from its
per-container sold-out cache (1 s TTL, refreshed by whichever request finds it stale), compared with
raw EVALSHA calls answering sold_out. *HTTP*: the dev server's app (`seckill_devserver::app`: the
same local JWT authorizer middleware and routers `make serve` runs) on 127.0.0.1:0 via
`axum::serve`, driven by reqwest with HS256 bearer tokens, against a trivial route behind the same
middleware. *Accepted*: purchases that pass and send their order message to SQS, against a bare
SendMessage loop with the same count and concurrency on a fresh queue of the same emulator (moto is
slow and single-threaded: this ratio shows our overhead on top of the send, not SQS throughput).

**Consumer.** Reservations made with `sale::purchase`, turned into order messages, grouped in SQS
batches of 10 built in-process; consumers (each its own warm pool and Redis connection, like
separate Lambda containers) call `Consumer::handle_batch_with_stats` (`handle_batch` without its
metrics line) concurrently. The baseline runs the same insert and conditional update in one
transaction per order with the same total number of connections, on a fresh activity of the same
size. All orders hit one hot activity row.

**Memory.** The user set and ledger of one activity loaded for N users by pipelined variadic
SADD/HSET with the exact ledger entry format (`r|<uuid v7>|1|<ms>`), read with
`MEMORY USAGE key SAMPLES 0`, then deleted.

**Binaries.** Sizes of `target/release/<function>` (release profile strips them; checked by the
absence of a `.symtab` section), and time from spawning each binary, with
`AWS_LAMBDA_RUNTIME_API` pointing at a listener in the bench, to its first
`GET /2018-06-01/runtime/invocation/next` (includes connecting to Redis; pools are lazy where the
function makes them lazy). `make bench` builds them first.
"#;

#[cfg(test)]
mod tests;
