//! The entry function's table: router, bare script, sold-out flood, HTTP and accepted loops.

use crate::entry::EntryResults;
use std::fmt::Write;

pub fn table(s: &mut String, e: &EntryResults) {
    let _ = writeln!(
        s,
        "Entry function (building one API Gateway-shaped request with `testing::request`: {:.2} µs single-threaded; timed only in the \"+ request build\" rows)\n",
        e.request_build_us
    );
    s.push_str("| loop | concurrency | requests/s | p50 ms | p99 ms | Redis cmds/request |\n|---|---:|---:|---:|---:|---:|\n");
    // The HTTP and SQS loops are absent where their part of the section did not run.
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
