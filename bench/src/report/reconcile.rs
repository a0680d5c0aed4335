//! The reconcile table: one scheduled run over a sale with a large ledger, beside the
//! whole-ledger snapshot the chunked read replaced.

use crate::reconcile::ReconcileRow;
use std::fmt::Write;

pub fn table(s: &mut String, rows: &[ReconcileRow]) {
    s.push_str(
        "Reconcile at real size (one sale; its reservations entered through lua/purchase.lua, the first half \
         past the grace period with no order, each claimed and given back; one run with the default budget, \
         on a database of its own; a PING about every ms on its own connection; server time from the slow log)\n\n",
    );
    s.push_str("| ledger | stale | what | wall ms | given back | budget spent | longest Redis call µs (command) | PING max ms (PINGs) |\n|---:|---:|---|---:|---:|---|---:|---:|\n");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.0} | {} | {} | {} ({}) | {:.2} ({}) |",
            r.ledger,
            r.stale,
            r.what,
            r.ms,
            r.given_back,
            if r.out_of_time { "yes" } else { "no" },
            r.longest_call_us,
            r.longest_call,
            r.ping_max_ms,
            r.pings
        );
    }
    s.push('\n');
}
