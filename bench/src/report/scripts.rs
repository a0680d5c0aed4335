//! The purchase scripts' table: the combined GET/SISMEMBER/DECR/SADD script, HGET + HINCRBY,
//! hmdp's, ours and the empty script, server µs per call split into the Redis commands each
//! script called and the rest (the call and its Lua); then where ours spends more than the
//! combined script.

use crate::scripts::ScriptRow;
use std::fmt::Write;

pub fn table(s: &mut String, rows: &[ScriptRow]) {
    let first = &rows[0];
    let _ = writeln!(
        s,
        "Purchase scripts side by side, by EVALSHA on the same Redis, {} attempts per row, {} concurrent tasks on one ConnectionManager (server µs/call: `cmdstat_evalsha` usec ÷ calls over the row; in its commands: the `cmdstat_*` usec of the commands the script called, ÷ its calls; call + Lua: the rest)\n",
        first.attempts, first.concurrency
    );
    s.push_str("| script | workload | attempts/s | p50 ms | p99 ms | server µs/call | in its commands µs | call + Lua µs | Redis cmds/call (server) | sold / stock |\n");
    s.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    let us = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.2}"));
    for row in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {:.3} | {:.3} | {} | {} | {} | {:.2} | {} / {} |",
            row.what,
            row.workload,
            row.attempts_per_s,
            row.p50_ms,
            row.p99_ms,
            us(row.server_us_per_call),
            us(row.commands_us_per_call),
            us(lua_us(row)),
            row.redis_commands_per_call,
            row.sold,
            row.stock
        );
    }
    s.push('\n');
    for workload in ["success-heavy", "failure-heavy"] {
        if let Some(line) = difference(rows, workload) {
            s.push_str(&line);
        }
    }
    if let Some(line) = commands_floor(rows) {
        s.push_str(&line);
    }
    s.push('\n');
}

/// What ours' success path costs as its commands alone, against the combined script: the
/// floor under any script that keeps what ours keeps.
fn commands_floor(rows: &[ScriptRow]) -> Option<String> {
    let find = |script: &str| {
        rows.iter()
            .find(|r| r.script == script && r.workload == "success-heavy")
            .and_then(|r| r.server_us_per_call)
    };
    let (commands, combined, ours) = (find("ours-commands")?, find("combined")?, find("ours")?);
    Some(format!(
        "- success-heavy: ours' six commands alone (no function, no check) cost {commands:.2} µs/call, {:.2}× the combined script's {combined:.2}: the floor under a script that keeps the ledger entry, the window, the epoch and the one-order rule; ours' functions and checks add {:.2} µs over it.\n",
        commands / combined.max(1e-9),
        ours - commands,
    ))
}

/// The server time of a row outside the commands its script called.
fn lua_us(row: &ScriptRow) -> Option<f64> {
    Some(row.server_us_per_call? - row.commands_us_per_call?)
}

/// Where ours spends its extra server time over the combined script under one workload.
fn difference(rows: &[ScriptRow], workload: &str) -> Option<String> {
    let find = |script: &str| {
        rows.iter()
            .find(|r| r.script == script && r.workload == workload)
    };
    let (ours, combined) = (find("ours")?, find("combined")?);
    let extra = ours.server_us_per_call? - combined.server_us_per_call?;
    let in_commands = ours.commands_us_per_call? - combined.commands_us_per_call?;
    let floor = find("floor")
        .and_then(|r| r.server_us_per_call)
        .map_or_else(String::new, |v| {
            format!("; any EVALSHA costs {v:.2} µs here")
        });
    Some(format!(
        "- {workload}: ours costs {extra:+.2} µs/call over the combined script: {in_commands:+.2} µs in Redis commands ({:.2} against {:.2} per call), {:+.2} µs of call and Lua{floor}.\n",
        ours.redis_commands_per_call - 1.0,
        combined.redis_commands_per_call - 1.0,
        extra - in_commands,
    ))
}
