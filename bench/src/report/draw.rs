//! The draw table: the draw in steps against the whole-pool draw it replaced, per pool size.

use crate::draw::DrawRow;
use std::fmt::Write;

pub fn table(s: &mut String, rows: &[DrawRow]) {
    s.push_str(
        "The draw at real size (a draw sale, one unit per entrant; entrants entered through lua/purchase.lua; \
         a PING about every ms on its own connection while the draw runs; script time from the slow log). \
         `rebuild`: the same pool lost with the sale's keys and put back from the database's kept entries \
         (the load from scratch, then the rest of the rebuild as reconcile goes on; its script calls are \
         the chunks of lua/pool_restore.lua, its winners the entries put back, its time the load's and the \
         rebuild's). `nothing fits`: a sale of one unit whose entrants each ask two (put into the pool as the \
         consumer puts kept entries back), drawn in steps that stop once no entry ahead fits the stock left; \
         beside it `uncounted (walks)`, a copy whose meta does not count its entries by units asked, so its \
         steps walk every ticket. `drawer`: what reconcile's draw part does once the window closes, with a tenth of the \
         entrants in units (the draw's steps, the record of its outcome, the winners' orders in chunks of \
         protocol::draw::ORDER_CHUNK); its script calls are the steps and the chunks, its longest script \
         the longest Redis call of any kind, its time from the close to the last winner's order\n\n",
    );
    s.push_str("| entrants | draw | units | script calls | winners | longest script µs (which) | longest DB transaction ms | whole draw ms | PING max ms (PINGs) | entries/s | pool + tickets B/entrant |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} ({}) | {} | {:.1} | {:.2} ({}) | {:.0} | {:.1} |",
            r.entrants,
            r.draw,
            r.stock,
            r.calls,
            r.winners,
            r.longest_script_us,
            r.longest_call,
            r.longest_transaction_ms
                .map_or_else(|| "-".to_string(), |ms| format!("{ms:.1}")),
            r.draw_ms,
            r.ping_max_ms,
            r.pings,
            r.entries_per_sec,
            r.bytes_per_entrant
        );
    }
    s.push('\n');
}
