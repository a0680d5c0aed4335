//! The order consumer's table: `handle_batch` against one transaction per order and against
//! bare single-row inserts.

use crate::consumer::ConsumerResults;
use std::fmt::Write;

pub fn table(s: &mut String, c: &ConsumerResults) {
    let _ = writeln!(
        s,
        "Order consumer ({} orders on one hot activity; {} instances × {} DB connections; SQS batches of {} built in-process)\n",
        c.handle_batch.orders, c.instances, c.connections_per_instance, c.batch_size
    );
    s.push_str("| run | orders/s | committed | via batch path | failed/retried | DB orders | DB remaining |\n|---|---:|---:|---:|---:|---:|---:|\n");
    for run in [
        &c.handle_batch,
        &c.handle_batch_per_message,
        &c.baseline,
        &c.bare_inserts,
    ] {
        let _ = writeln!(
            s,
            "| {} | {:.0} | {} | {} | {} | {} | {} |",
            run.what,
            run.orders_per_s,
            run.committed,
            run.batched,
            run.failed_or_retried,
            run.db_orders,
            run.db_remaining_stock
        );
    }
    s.push('\n');
}
