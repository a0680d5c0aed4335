//! The draw table: the draw in steps against the whole-pool draw it replaced, per pool size.

use crate::draw::DrawRow;
use std::fmt::Write;

pub fn table(s: &mut String, rows: &[DrawRow]) {
    s.push_str(
        "The draw at real size (a draw sale, one unit per entrant; entrants entered through lua/purchase.lua; \
         a PING about every ms on its own connection while the draw runs; script time from the slow log)\n\n",
    );
    s.push_str("| entrants | draw | units | script calls | winners | longest script µs | whole draw ms | PING max ms (PINGs) | entries/s | pool + tickets B/entrant |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {:.1} | {:.2} ({}) | {:.0} | {:.1} |",
            r.entrants,
            r.draw,
            r.stock,
            r.calls,
            r.winners,
            r.longest_script_us,
            r.draw_ms,
            r.ping_max_ms,
            r.pings,
            r.entries_per_sec,
            r.bytes_per_entrant
        );
    }
    s.push('\n');
}
