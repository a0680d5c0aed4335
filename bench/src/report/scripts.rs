//! The purchase scripts' table: the combined GET/SISMEMBER/DECR/SADD script, HGET + HINCRBY,
//! hmdp's and ours, server µs per call.

use crate::scripts::ScriptRow;
use std::fmt::Write;

pub fn table(s: &mut String, rows: &[ScriptRow]) {
    let first = &rows[0];
    let _ = writeln!(
        s,
        "Purchase scripts side by side, by EVALSHA on the same Redis, {} attempts per row, {} concurrent tasks on one ConnectionManager (server µs/call: `cmdstat_evalsha` usec ÷ calls over the row)\n",
        first.attempts, first.concurrency
    );
    s.push_str("| script | workload | attempts/s | p50 ms | p99 ms | server µs/call | Redis cmds/call (server) | sold / stock |\n");
    s.push_str("|---|---|---:|---:|---:|---:|---:|---:|\n");
    for row in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {:.3} | {:.3} | {} | {:.2} | {} / {} |",
            row.what,
            row.workload,
            row.attempts_per_s,
            row.p50_ms,
            row.p99_ms,
            row.server_us_per_call
                .map(|v| format!("{v:.2}"))
                .unwrap_or_else(|| "-".into()),
            row.redis_commands_per_call,
            row.sold,
            row.stock
        );
    }
    s.push('\n');
}
