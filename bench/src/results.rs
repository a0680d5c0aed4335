//! What one run measures, and at what sizes: the sections fill [`Results`], the report prints
//! it with the [`Sizes`] it ran at.

use crate::{
    binaries, buckets, consumer, draw, entry, memory, polls, reconcile, scripts, strategies,
};

/// The sizes of one run.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sizes {
    pub attempts: usize,
    pub kill_attempts: usize,
    pub concurrency: usize,
    pub db_pool: u32,
    pub rejections: usize,
    pub sold_out: usize,
    pub http: usize,
    pub sqs_sends: usize,
    pub sqs_concurrency: usize,
    pub consumer_orders: usize,
    pub consumer_instances: usize,
    pub consumer_connections: u32,
    pub memory_users: Vec<usize>,
    pub init_repeats: usize,
    /// Orders in the table while `GET …/orders/me` is polled.
    pub poll_orders: usize,
    pub polls: usize,
    /// The buckets section's hot sale: its stock, the attempts (one user each) per bucket
    /// count, and the counts.
    pub bucket_stock: i64,
    pub bucket_attempts: usize,
    pub bucket_counts: Vec<u32>,
    /// Entrants of the draw section's sales, and the largest the whole-pool draw runs at.
    pub draw_entrants: Vec<usize>,
    pub draw_baseline_max: usize,
    /// Reservations in the reconcile section's ledger (half of them stale).
    pub reconcile_ledger: usize,
}

impl Sizes {
    /// The sizes of a full run, or of a `--quick` one; `attempts` and `concurrency` as given.
    pub fn new(quick: bool, attempts: Option<usize>, concurrency: usize) -> Self {
        let q = quick;
        let attempts = attempts.unwrap_or(if q { 3_000 } else { 20_000 });
        Self {
            attempts,
            kill_attempts: attempts.min(if q { 1_000 } else { 5_000 }),
            concurrency,
            db_pool: 16,
            rejections: if q { 10_000 } else { 100_000 },
            sold_out: if q { 20_000 } else { 200_000 },
            http: if q { 3_000 } else { 20_000 },
            sqs_sends: if q { 40 } else { 300 },
            sqs_concurrency: 16,
            consumer_orders: if q { 400 } else { 4_000 },
            consumer_instances: 4,
            consumer_connections: 4,
            memory_users: if q {
                vec![10_000, 100_000]
            } else {
                vec![100_000, 1_000_000]
            },
            init_repeats: if q { 1 } else { 3 },
            poll_orders: if q { 100_000 } else { 1_000_000 },
            polls: if q { 5_000 } else { 50_000 },
            bucket_stock: if q { 300 } else { 3_000 },
            bucket_attempts: if q { 3_000 } else { 30_000 },
            bucket_counts: vec![1, 3, 8],
            draw_entrants: if q {
                vec![10_000]
            } else {
                vec![10_000, 100_000, 1_000_000]
            },
            draw_baseline_max: 100_000,
            reconcile_ledger: if q { 10_000 } else { 100_000 },
        }
    }
}

/// Everything one run measured.
#[derive(Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Results {
    pub rows: Vec<strategies::Row>,
    pub scripts: Vec<scripts::ScriptRow>,
    pub buckets: Vec<buckets::BucketRow>,
    pub entry: Option<entry::EntryResults>,
    pub consumer: Option<consumer::ConsumerResults>,
    pub polls: Option<polls::PollResults>,
    pub draw: Vec<draw::DrawRow>,
    pub reconcile: Vec<reconcile::ReconcileRow>,
    pub memory: Vec<memory::MemoryRow>,
    pub binaries: Vec<binaries::BinaryRow>,
}
