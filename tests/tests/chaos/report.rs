//! Counts of one seed, printed at its end.

use crate::world::{lock, Chaos};
use std::collections::BTreeMap;
use std::fmt;

/// Counts of one seed, printed at its end.
#[derive(Default, Debug)]
pub struct Report {
    pub attempts: u64,
    pub accepted: u64,
    pub unavailable: u64,
    pub refused: BTreeMap<String, u64>,
    pub other_status: BTreeMap<u16, u64>,
    pub lost_replies_armed: u64,
    pub lost_replies: u64,
    pub batches: BTreeMap<&'static str, u64>,
    pub acked: u64,
    pub reported_failed: u64,
    pub sqs_errors: u64,
    pub drain_batches: u64,
    pub drain_secs: f64,
    pub dlq: u64,
    pub cancel_clicks: u64,
    pub cancels: BTreeMap<&'static str, u64>,
    pub pays: u64,
    pub pays_refused: u64,
    /// What became of each payment started at the provider (abandoned, paid, event outcomes…).
    pub payments: BTreeMap<&'static str, u64>,
    pub release_runs: u64,
    pub released: u64,
    pub release_deferred: u64,
    pub release_errors: u64,
    pub admin: BTreeMap<String, u64>,
    pub preheats: u64,
    pub preheat_loaded: u64,
    pub preheat_errors: u64,
    pub pauses: u64,
    pub paused_ms: u64,
    pub reconciles: u64,
    pub reconcile_repairs: u64,
    pub reconcile_errors: u64,
    pub keys_lost: u64,
    pub draw_keys_lost: u64,
    pub fields_lost: u64,
    pub draw_entrants: u64,
    pub draw_winners: u64,
    /// Entries passed over at or below their draw's cutoff, each checked against the rule.
    pub draw_passed_over: u64,
    pub watcher_samples: u64,
    pub watcher_errors: u64,
    pub rows: BTreeMap<String, u64>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "  buyers: {} attempts, {} accepted, {} unavailable, refused {:?}, other {:?}",
            self.attempts, self.accepted, self.unavailable, self.refused, self.other_status
        )?;
        writeln!(
            f,
            "  queue: lost replies {}/{} armed, batches {:?}, {} acked, {} reported failed, \
             {} sqs errors, drain {} batches in {:.1} s, dlq {}",
            self.lost_replies,
            self.lost_replies_armed,
            self.batches,
            self.acked,
            self.reported_failed,
            self.sqs_errors,
            self.drain_batches,
            self.drain_secs,
            self.dlq
        )?;
        writeln!(
            f,
            "  orders: {} cancel clicks {:?}, {} pays ({} refused), release {} runs: {} released, \
             {} deferred, {} errors; rows {:?}",
            self.cancel_clicks,
            self.cancels,
            self.pays,
            self.pays_refused,
            self.release_runs,
            self.released,
            self.release_deferred,
            self.release_errors,
            self.rows
        )?;
        writeln!(f, "  payments at the provider: {:?}", self.payments)?;
        writeln!(f, "  admin: {:?}", self.admin)?;
        write!(
            f,
            "  jobs: {} preheats ({} loaded, {} errors), {} reconciles ({} repairs, {} errors), \
             {} key losses ({} after a draw), {} fields lost, {} pauses ({} ms), watcher {} \
             samples ({} errors), draws {} entrants {} winners ({} passed over below the cutoff)",
            self.preheats,
            self.preheat_loaded,
            self.preheat_errors,
            self.reconciles,
            self.reconcile_repairs,
            self.reconcile_errors,
            self.keys_lost,
            self.draw_keys_lost,
            self.fields_lost,
            self.pauses,
            self.paused_ms,
            self.watcher_samples,
            self.watcher_errors,
            self.draw_entrants,
            self.draw_winners,
            self.draw_passed_over
        )
    }
}
impl Chaos {
    pub fn print_report(&self) {
        println!(
            "seed={} [{}] report:\n{}",
            self.seed,
            self.variant,
            lock(&self.report)
        );
    }
}
