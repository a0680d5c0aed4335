//! What `make demo` prints and writes to `report.json`: the figures counted from the
//! responses, the facts read back from the stores, and whether every unit is accounted for.

use super::admission::DrawReport;
use super::DemoOptions;
use crate::chart::StockSample;
use crate::load::{self, LoadReport};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;
use testkit::invariants::Units;

/// What the stores say after the sale.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreFacts {
    /// Confirmed + paid orders.
    pub orders: i64,
    pub units_sold: i64,
    pub failed_orders: i64,
    pub duplicate_users: i64,
    pub db_total_stock: i64,
    pub db_remaining_stock: i64,
    /// Over all buckets; `None` when a bucket is not loaded.
    pub redis_stock: Option<i64>,
    pub redis_participants: i64,
    pub pending_qty: i64,
    pub pending_count: usize,
    /// Units taken from one bucket for another and not yet settled there.
    pub transfer_qty: i64,
    /// The masters serving the cluster's slots (empty on a standalone Redis).
    pub redis_nodes: Vec<String>,
    /// Each stock bucket, bucket 0 first (one for a sale with one bucket).
    pub buckets: Vec<BucketFacts>,
}

/// One stock bucket after the sale.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BucketFacts {
    pub index: u32,
    /// The hash tag the bucket's keys share, and its cluster slot.
    pub tag: String,
    pub slot: u32,
    /// The cluster master serving that slot (`None` on a standalone Redis).
    pub node: Option<String>,
    /// Units left; `None` when the bucket is not loaded.
    pub stock: Option<i64>,
    /// Buyers whose home bucket this is.
    pub participants: i64,
}

/// The report `make demo` prints and writes to `report.json`.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DemoReport {
    pub activity_id: i64,
    pub stock: i64,
    pub units_sold: i64,
    pub orders: i64,
    pub duplicate_users: i64,
    pub oversell: i64,
    pub conservation_ok: bool,
    pub conservation: String,
    pub requests: u64,
    pub requests_by_outcome: BTreeMap<String, u64>,
    pub requests_by_kind: BTreeMap<String, u64>,
    pub accepted: u64,
    pub throughput: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub users: usize,
    pub concurrency: usize,
    pub elapsed_secs: f64,
    pub drain_secs: f64,
    pub drained: bool,
    pub reconcile: serde_json::Value,
    pub store: StoreFacts,
    /// Responses per 100 ms, by class (what the chart draws).
    pub timeline: Vec<load::Bucket>,
    pub stock_samples: Vec<StockSample>,
    pub chart: String,
    /// A draw sale's pool, winners and fairness (absent for first come, first served).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draw: Option<DrawReport>,
}

impl DemoReport {
    /// True when the sale came out exactly right (a draw: every entrant settled, and the
    /// winners' ranks consistent with a uniform draw).
    pub fn ok(&self) -> bool {
        self.oversell == 0
            && self.duplicate_users == 0
            && self.conservation_ok
            && self.draw.as_ref().is_none_or(DrawReport::ok)
    }

    /// The human report.
    pub fn text(&self) -> String {
        let mut o = String::new();
        self.write_crowd(&mut o);
        self.write_outcome(&mut o);
        o
    }

    /// What the crowd sent and how the entry function answered it.
    fn write_crowd(&self, o: &mut String) {
        let _ = writeln!(o, "\n== flash sale: activity {} ==", self.activity_id);
        let _ = writeln!(
            o,
            "redis           {}, {} stock bucket{}",
            redis_topology(&self.store.redis_nodes),
            self.store.buckets.len(),
            if self.store.buckets.len() == 1 {
                ""
            } else {
                "s"
            }
        );
        let _ = writeln!(
            o,
            "crowd           {} requests from {} users, {} concurrent, {:.2} s",
            self.requests, self.users, self.concurrency, self.elapsed_secs
        );
        let _ = writeln!(o, "requests by outcome");
        for (k, v) in &self.requests_by_outcome {
            let pct = 100.0 * *v as f64 / self.requests.max(1) as f64;
            let _ = writeln!(o, "  {k:<24}{v:>8}  {pct:>5.1}%");
        }
        let planned: Vec<String> = self
            .requests_by_kind
            .iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect();
        let _ = writeln!(o, "as planned      {}", planned.join(", "));
        let _ = writeln!(o, "throughput      {:.0} req/s", self.throughput);
        let _ = writeln!(
            o,
            "latency         p50 {:.2} ms  p95 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
            self.p50_ms, self.p95_ms, self.p99_ms, self.max_ms
        );
    }

    /// What the stores hold afterwards, each check with its verdict.
    fn write_outcome(&self, o: &mut String) {
        let verdict = |ok: bool| if ok { "ok" } else { "FAILED" };
        let _ = writeln!(
            o,
            "queue drained   {} in {:.1} s after the crowd",
            if self.drained {
                "yes"
            } else {
                "NO (timed out)"
            },
            self.drain_secs
        );
        let s = &self.store;
        let _ = writeln!(
            o,
            "orders in DB    {} confirmed/paid, {} failed",
            self.orders, s.failed_orders
        );
        let winners = self
            .draw
            .as_ref()
            .map_or_else(String::new, |d| format!(", draw winners: {}", d.winners));
        let _ = writeln!(
            o,
            "units sold      {} of {} (accepted responses: {}{winners})",
            self.units_sold, self.stock, self.accepted
        );
        if let Some(d) = &self.draw {
            d.write(o);
        }
        if s.buckets.len() > 1 {
            write_buckets(o, &s.buckets);
        }
        let _ = writeln!(
            o,
            "duplicate users {}  [{}]",
            self.duplicate_users,
            verdict(self.duplicate_users == 0)
        );
        let _ = writeln!(
            o,
            "oversell        {}  [{}]",
            self.oversell,
            verdict(self.oversell == 0)
        );
        let _ = writeln!(
            o,
            "conservation    {}  [{}]",
            self.conservation,
            verdict(self.conservation_ok)
        );
        let _ = writeln!(o, "reconcile       {}", reconcile_summary(&self.reconcile));
        let _ = writeln!(o, "chart           {}", self.chart);
    }
}

/// Reconcile's verdict in one line: its stock check, the drift it found and the repairs it
/// made (its whole answer is in the JSON report).
fn reconcile_summary(answer: &serde_json::Value) -> String {
    let number = |field: &str| answer[field].as_i64().unwrap_or(0);
    let check = answer["stockCheck"]["status"]
        .as_str()
        .map(|status| format!("stock check {status}, "))
        .unwrap_or_default();
    format!(
        "{check}drift {}, {} repairs, {} unpaid released (its whole answer in the report)",
        number("drift"),
        number("repairs"),
        number("releasedUnpaid"),
    )
}

/// "standalone", or the cluster's masters.
fn redis_topology(nodes: &[String]) -> String {
    if nodes.is_empty() {
        "standalone".into()
    } else {
        format!("cluster of {} masters ({})", nodes.len(), nodes.join(", "))
    }
}

/// Each bucket's stock at the end, where it lives, and how many buyers it is home to.
fn write_buckets(o: &mut String, buckets: &[BucketFacts]) {
    let _ = writeln!(o, "stock by bucket at the end");
    for b in buckets {
        let stock = b
            .stock
            .map_or_else(|| "not loaded".to_string(), |s| s.to_string());
        let _ = writeln!(
            o,
            "  bucket {:<3}{:<20}slot {:>5}  {:<16}{:>8} left{:>8} buyers",
            b.index,
            format!("{{{}}}", b.tag),
            b.slot,
            b.node.as_deref().unwrap_or("-"),
            stock,
            b.participants
        );
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn build_report(
    activity_id: i64,
    opts: &DemoOptions,
    load: LoadReport,
    store: StoreFacts,
    drained: bool,
    drain_secs: f64,
    reconcile: serde_json::Value,
    stock_samples: Vec<StockSample>,
    chart: String,
) -> DemoReport {
    let total = store.db_total_stock;
    let (conservation_ok, conservation) = conservation(&store);
    DemoReport {
        activity_id,
        stock: total,
        units_sold: store.units_sold,
        orders: store.orders,
        duplicate_users: store.duplicate_users,
        oversell: (store.units_sold - total).max(0),
        conservation_ok,
        conservation,
        requests: load.requests,
        accepted: load
            .requests_by_outcome
            .get("accepted")
            .copied()
            .unwrap_or(0),
        requests_by_outcome: load.requests_by_outcome,
        requests_by_kind: load.requests_by_kind,
        throughput: load.throughput,
        p50_ms: load.latency.p50_ms,
        p95_ms: load.latency.p95_ms,
        p99_ms: load.latency.p99_ms,
        max_ms: load.latency.max_ms,
        users: opts.users,
        concurrency: load.concurrency,
        elapsed_secs: load.elapsed_secs,
        drain_secs,
        drained,
        reconcile,
        store,
        timeline: load.timeline,
        stock_samples,
        chart,
        draw: None,
    }
}

/// Whether every unit is accounted for, and the sum that says so: Redis stock (over all
/// buckets) + pending reservations + units in transfer between buckets + confirmed units =
/// total stock, and PostgreSQL's remaining = total - confirmed. The verdict is the test kit's
/// invariant checker's, on the figures read back.
fn conservation(store: &StoreFacts) -> (bool, String) {
    let units = Units {
        total: store.db_total_stock,
        redis_stock: store.redis_stock,
        pending: store.pending_qty,
        in_transfer: store.transfer_qty,
        sold: store.units_sold,
        db_remaining: store.db_remaining_stock,
    };
    let ok = units.conservation().is_none() && units.database_agrees().is_none();
    // A sale with one bucket never transfers: its sum keeps to the three terms.
    let transfers = if store.buckets.len() > 1 || store.transfer_qty != 0 {
        format!(" + in transfer {}", store.transfer_qty)
    } else {
        String::new()
    };
    let sum = format!(
        "redis {} + pending {}{transfers} + confirmed {} = {} (total {}); DB remaining {} = total - confirmed {}",
        store
            .redis_stock
            .map_or_else(|| "missing".to_string(), |s| s.to_string()),
        store.pending_qty,
        store.units_sold,
        units.accounted(),
        units.total,
        store.db_remaining_stock,
        units.total - store.units_sold
    );
    (ok, sum)
}
