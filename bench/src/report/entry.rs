//! The entry function's table: router, bare script, sold-out flood, HTTP and accepted loops.

use crate::entry::EntryResults;
use std::fmt::Write;

pub fn table(s: &mut String, e: &EntryResults) {
    let _ = writeln!(
        s,
        "Entry function (building one API Gateway-shaped request with `testkit::request`: {:.2} µs single-threaded; timed only in the \"+ request build\" rows)\n",
        e.request_build_us
    );
    s.push_str("| loop | concurrency | requests/s | p50 ms | p99 ms | Redis cmds/request |\n|---|---:|---:|---:|---:|---:|\n");
    // The HTTP and SQS loops are absent where their part of the section did not run.
    let measures = [
        Some(&e.in_process),
        Some(&e.in_process_with_build),
        Some(&e.bare_script),
        Some(&e.sequential_entry),
        Some(&e.sequential_call),
        Some(&e.sequential_bare),
        Some(&e.sold_out_router),
        Some(&e.sold_out_router_with_build),
        Some(&e.sold_out_bare_script),
        e.http_entry.as_ref(),
        e.http_trivial.as_ref(),
        e.view.as_ref().map(|v| &v.sold_out),
        e.view.as_ref().map(|v| &v.view),
        e.view.as_ref().map(|v| &v.unknown),
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
    let _ = writeln!(
        s,
        "One request at a time, the router and handler add {:.1} µs to the bare script call (already_purchased): {:.1} µs in the product's call of the script (`store::purchase::run`), {:.1} µs in the router and the handler around it.\n",
        e.entry_overhead_us,
        e.call_overhead_us,
        e.entry_overhead_us - e.call_overhead_us
    );
    if !e.costs.is_empty() {
        costs(s, &e.costs);
    }
    if let Some(v) = &e.view {
        let _ = writeln!(
            s,
            "Public view row: {} database transactions (pg_stat_database `xact_commit + xact_rollback` of the row's own database) for {} requests. Distinct unknown ids (each request a different id above the highest): {} transactions for {} requests ({:.4} per request).\n",
            v.db_transactions, v.view.attempts, v.unknown_db_transactions, v.unknown.attempts,
            v.unknown_db_transactions_per_request
        );
    }
}

/// "What cost what": each candidate of the refusal path, before and after.
fn costs(s: &mut String, costs: &[crate::costs::Cost]) {
    s.push_str("What cost what on the refusal path (each candidate alone, one call at a time on one thread; before = its former shape, rebuilt in the bench; after = what the entry runs now, \"-\" where it did not change)\n\n");
    s.push_str("| candidate | before | µs | allocs | after | µs | allocs |\n|---|---|---:|---:|---|---:|---:|\n");
    for c in costs {
        let (what, us, allocs) = match &c.after {
            Some(a) => (
                a.what.as_str(),
                format!("{:.3}", a.us),
                format!("{:.1}", a.allocations),
            ),
            None => ("-", "-".into(), "-".into()),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {:.3} | {:.1} | {what} | {us} | {allocs} |",
            c.candidate, c.before.what, c.before.us, c.before.allocations
        );
    }
    s.push('\n');
}
