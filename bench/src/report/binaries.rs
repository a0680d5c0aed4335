//! The Lambda binaries table: size, stripped or not, time to ready.

use crate::binaries::BinaryRow;
use std::fmt::Write;

pub fn table(s: &mut String, rows: &[BinaryRow]) {
    s.push_str("Lambda binaries (target/release; time from spawn to the first `GET …/runtime/invocation/next`)\n\n");
    s.push_str(
        "| function | size MB | stripped | init ms (median) | runs |\n|---|---:|---|---:|---|\n",
    );
    for b in rows {
        if !b.built {
            let _ = writeln!(s, "| {} | not built | | | |", b.name);
            continue;
        }
        let _ = writeln!(
            s,
            "| {} | {:.1} | {} | {} | {} |",
            b.name,
            b.size_bytes.unwrap_or(0) as f64 / 1e6,
            if b.stripped == Some(true) {
                "yes"
            } else {
                "no"
            },
            init_median(b),
            b.init_ms
                .iter()
                .map(|v| format!("{v:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if let Some(largest) = rows.iter().filter_map(|b| b.size_bytes).max() {
        let mb = largest as f64 / 1e6;
        let met = if mb <= LARGEST_GOAL_MB {
            "met"
        } else {
            "not met; what they are made of is under \"Goals missed\" at the end"
        };
        let _ = writeln!(
            s,
            "\nThe largest: {mb:.1} MB; the goal is at most {LARGEST_GOAL_MB:.0} MB ({met})."
        );
    }
    s.push('\n');
}

/// The size the largest Lambda binary is held to, MB.
const LARGEST_GOAL_MB: f64 = 8.0;

/// The median time to ready, or why there is none.
fn init_median(b: &BinaryRow) -> String {
    b.init_ms_median
        .map(|v| format!("{v:.1}"))
        .unwrap_or_else(|| format!("failed: {}", b.error.as_deref().unwrap_or("?")))
}
