//! The order polling row: `GET …/orders/me` with a big orders table.

use crate::polls::PollResults;
use std::fmt::Write;

pub fn table(s: &mut String, p: &PollResults) {
    let _ = writeln!(
        s,
        "Order polling (`GET /activities/{{id}}/orders/me` through the entry router in-process, {} tasks; {} orders of the sale in the table, inserted in {:.1} s; DB time: mean `Execution Time` of `explain (analyze)` of the shipped statement over 200 sampled buyers; round trip: the same call from the bench, one at a time)\n",
        p.concurrency, p.orders_in_table, p.insert_seconds
    );
    s.push_str("| orders in table | polls | polls/s | p50 ms | p99 ms | DB execution ms/poll | DB round trip ms/poll | plan reads |\n");
    s.push_str("|---:|---:|---:|---:|---:|---:|---:|---|\n");
    let _ = writeln!(
        s,
        "| {} | {} | {:.0} | {:.3} | {:.3} | {:.3} | {:.3} | {} |",
        p.orders_in_table,
        p.polls,
        p.polls_per_s,
        p.p50_ms,
        p.p99_ms,
        p.db_execution_ms,
        p.db_round_trip_ms,
        if p.plan_indexes.is_empty() {
            "no index (sequential scan)".to_string()
        } else {
            p.plan_indexes.join(", ")
        }
    );
    s.push('\n');
}
