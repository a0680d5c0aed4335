//! The stock buckets table: one hot sale on the cluster with its stock in 1, 3 and 8
//! buckets, each node's share of the script calls, commands per attempt, what was left unsold;
//! then each bucketed row's attempts/s against one bucket's.

use crate::buckets::{BucketRow, SHARE_GOAL};
use std::fmt::Write;

pub fn table(s: &mut String, rows: &[BucketRow]) {
    let first = &rows[0];
    let _ = writeln!(
        s,
        "Stock buckets: one hot sale on the 3-master Redis Cluster, stock {}, {} attempts per row by distinct users (quantity 1), {} concurrent tasks on one cluster connection, through `buckets::purchase` as the entry calls it (script calls per node: `cmdstat_evalsha` + `cmdstat_eval` deltas of each node's `INFO commandstats`; the three nodes and the bench share this machine's cores)\n",
        first.stock, first.attempts, first.concurrency
    );
    let nodes: Vec<&str> = first.nodes.iter().map(|n| n.node.as_str()).collect();
    let (lo, hi) = SHARE_GOAL;
    let _ = writeln!(
        s,
        "| buckets | attempts/s | p50 ms | p99 ms | last unit sold at s | attempts/s until then | share of script calls ({}) | buckets per node | every share {lo:.0}-{hi:.0} % | script calls/attempt | Redis cmds/attempt (server) | sold / stock | stock left | in transfer | undersell | errors |",
        nodes.join(" / ")
    );
    s.push_str("|---:|---:|---:|---:|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for row in rows {
        let shares: Vec<String> = row
            .nodes
            .iter()
            .map(|n| format!("{:.1} %", n.share))
            .collect();
        let held: Vec<String> = row.nodes.iter().map(|n| n.buckets.to_string()).collect();
        let met = match row.shares_met() {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "(one slot: one node)",
        };
        let _ = writeln!(
            s,
            "| {} | {:.0} | {:.3} | {:.3} | {:.2} | {:.0} | {} | {} | {met} | {:.2} | {:.2} | {} / {} | {} | {} | {} | {} |",
            row.buckets,
            row.attempts_per_s,
            row.p50_ms,
            row.p99_ms,
            row.sold_out_after_s,
            row.selling_attempts_per_s,
            shares.join(" / "),
            held.join(" / "),
            row.script_calls_per_attempt,
            row.redis_commands_per_attempt,
            row.sold,
            row.stock,
            row.stock_left,
            row.in_transfer,
            row.undersell
                .map_or_else(|| "-".into(), |u| u.to_string()),
            row.errors
        );
    }
    s.push('\n');
    // Where the machine's cores went: a row that keeps them all busy is bounded by them, and
    // its attempts/s by the CPU each attempt costs the bench and the nodes together.
    let _ = writeln!(
        s,
        "CPU time per 1000 attempts (the bench process, every thread: `/proc/self/task/*/schedstat`; each node: `INFO cpu` user + sys), and the cores the bench and the nodes kept busy together (CPU time ÷ wall time) of the machine's {}\n",
        first.cores
    );
    let _ = writeln!(
        s,
        "| buckets | bench ms | nodes ms ({}) | bench + nodes ms | cores busy |",
        nodes.join(" / ")
    );
    s.push_str("|---:|---:|---|---:|---:|\n");
    for row in rows {
        let per_k = 1000.0 / row.attempts.max(1) as f64;
        let node_ms: Vec<String> = row
            .nodes
            .iter()
            .map(|n| format!("{:.1}", n.cpu_ms * per_k))
            .collect();
        let total = row.bench_cpu_ms + row.nodes.iter().map(|n| n.cpu_ms).sum::<f64>();
        let _ = writeln!(
            s,
            "| {} | {:.1} | {} | {:.1} | {:.2} of {} |",
            row.buckets,
            row.bench_cpu_ms * per_k,
            node_ms.join(" / "),
            total * per_k,
            row.cores_busy,
            row.cores
        );
    }
    s.push('\n');
    if let Some(one) = rows.iter().find(|r| r.buckets == 1) {
        for row in rows.iter().filter(|r| r.buckets > 1) {
            let _ = writeln!(
                s,
                "- {} buckets ÷ 1: {:.2}× the attempts/s ({:.2}× until the last unit sold), {:.2}× the script calls per attempt.",
                row.buckets,
                row.attempts_per_s / one.attempts_per_s.max(1e-9),
                row.selling_attempts_per_s / one.selling_attempts_per_s.max(1e-9),
                row.script_calls_per_attempt / one.script_calls_per_attempt.max(1e-9),
            );
        }
        s.push('\n');
    }
}
