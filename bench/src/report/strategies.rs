//! The stock-deduction table: one row per strategy and workload.

use crate::results::Sizes;
use crate::strategies::Row;
use std::fmt::Write;

pub fn table(s: &mut String, rows: &[Row], sizes: &Sizes) {
    let _ = writeln!(
        s,
        "Stock deduction, {} attempts per row, {} concurrent tasks (Redis rows: one shared ConnectionManager; db-only: pool of {})\n",
        sizes.attempts, sizes.concurrency, sizes.db_pool
    );
    s.push_str("| strategy | workload | attempts/s | p50 ms | p99 ms | Redis cmds/attempt (server) | round trips/attempt (client) | sold / stock | oversell | negative stock seen | leaked (kill run) |\n");
    s.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|\n");
    for row in rows {
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
            sold(row),
            row.oversell,
            negative(row),
            leaked(row)
        );
    }
    s.push('\n');
}

/// Units sold of the stock, and the attempts that gave up on a busy lock.
fn sold(row: &Row) -> String {
    if row.busy > 0 {
        format!("{} / {} ({} busy)", row.sold, row.stock, row.busy)
    } else {
        format!("{} / {}", row.sold, row.stock)
    }
}

/// Whether any client or the side sampler saw the stock below zero.
fn negative(row: &Row) -> String {
    if row.negative_seen {
        format!(
            "yes ({} client-observed, min sampled {})",
            row.negative_observed_by_clients,
            row.min_stock_sampled
                .map(|v| v.to_string())
                .unwrap_or_else(|| "-".into())
        )
    } else {
        "no".into()
    }
}

/// Units nobody accounts for after the kill run (`n/a` for strategies without one).
fn leaked(row: &Row) -> String {
    match &row.kill {
        Some(k) => format!("{} ({} of {} clients died)", k.leaked, k.died, k.attempts),
        None => "n/a".into(),
    }
}
