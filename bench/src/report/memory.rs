//! The Redis memory table: bytes per participant of the users hash and the ledger.

use crate::memory::MemoryRow;
use std::fmt::Write;

pub fn table(s: &mut String, rows: &[MemoryRow]) {
    s.push_str(
        "Redis memory per participant (MEMORY USAGE … SAMPLES 0; users hash + pending ledger)\n\n",
    );
    s.push_str("| participants | user id | users hash B/participant | ledger B/participant | total B/participant | total MB |\n|---:|---|---:|---:|---:|---:|\n");
    for m in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} ({}) | {:.1} ({}) | {:.1} | {:.1} |",
            m.users,
            m.id_format,
            m.user_set_bytes_per_participant,
            m.user_set_encoding,
            m.ledger_bytes_per_participant,
            m.ledger_encoding,
            m.bytes_per_participant,
            (m.user_set_bytes + m.ledger_bytes) as f64 / 1e6
        );
    }
    s.push('\n');
}
