//! The entry's purchase counters (and its per-user database rate's refusals): aggregated in memory and written as one EMF line at most
//! every `Counters::FLUSH_EVERY`, so a flood of refusals costs an atomic increment each.

use seckill_shared::infra::metrics;
use seckill_shared::Refusal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The name this function reports its metrics under.
pub const FUNCTION: &str = "seckill-entry";

/// Purchase counters, aggregated in memory and written as one EMF line at most every
/// [`Counters::FLUSH_EVERY`] (by whichever request notices), so a flood of refusals costs an
/// atomic increment each, not a log line each.
#[derive(Default)]
pub(crate) struct Counters {
    accepted: AtomicU64,
    queued: AtomicU64,
    compensations: AtomicU64,
    /// Per [`Refusal::index`].
    refused: [AtomicU64; Refusal::ALL.len()],
    sold_out_cached: AtomicU64,
    unavailable: AtomicU64,
    breaker_opens: AtomicU64,
    user_db_rate_limited: AtomicU64,
    last_flush_ms: AtomicU64,
    base: std::sync::OnceLock<Instant>,
}

impl Counters {
    const FLUSH_EVERY: Duration = Duration::from_secs(10);

    pub(crate) fn accept(&self) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
        self.maybe_flush();
    }

    /// An entry in a draw sale's pool.
    pub(crate) fn queue(&self) {
        self.queued.fetch_add(1, Ordering::Relaxed);
        self.maybe_flush();
    }

    pub(crate) fn compensation(&self) {
        self.compensations.fetch_add(1, Ordering::Relaxed);
        self.maybe_flush();
    }

    pub(crate) fn refuse(&self, refusal: Refusal) {
        self.refused[refusal.index()].fetch_add(1, Ordering::Relaxed);
        self.maybe_flush();
    }

    /// A sold-out answer from the container's memory, not from Redis.
    pub(crate) fn sold_out_cached(&self) {
        self.sold_out_cached.fetch_add(1, Ordering::Relaxed);
        self.maybe_flush();
    }

    /// A 503 for Redis: the breaker is open or the script's answer did not come in time.
    pub(crate) fn unavailable(&self) {
        self.unavailable.fetch_add(1, Ordering::Relaxed);
        self.maybe_flush();
    }

    /// The Redis circuit breaker opened: the `BreakerOpens` alarm's metric.
    pub(crate) fn breaker_opened(&self) {
        self.breaker_opens.fetch_add(1, Ordering::Relaxed);
        self.maybe_flush();
    }

    /// A 429 of the per-user rate of requests that reach the database (not a purchase's).
    pub(crate) fn user_db_rate_limited(&self) {
        self.user_db_rate_limited.fetch_add(1, Ordering::Relaxed);
        self.maybe_flush();
    }

    fn maybe_flush(&self) {
        let now = self.base.get_or_init(Instant::now).elapsed().as_millis() as u64;
        let last = self.last_flush_ms.load(Ordering::Relaxed);
        if now < last + Self::FLUSH_EVERY.as_millis() as u64 {
            return;
        }
        // One request wins the right to flush this period.
        if self
            .last_flush_ms
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let taken = |n: &AtomicU64| n.swap(0, Ordering::Relaxed) as f64;
        let mut counters = vec![
            ("Accepted".to_string(), taken(&self.accepted)),
            ("Queued".to_string(), taken(&self.queued)),
            ("Compensations".to_string(), taken(&self.compensations)),
            (
                "RejectedSoldOutCached".to_string(),
                taken(&self.sold_out_cached),
            ),
            ("RejectedUnavailable".to_string(), taken(&self.unavailable)),
            ("BreakerOpens".to_string(), taken(&self.breaker_opens)),
            (
                "RejectedUserDbRate".to_string(),
                taken(&self.user_db_rate_limited),
            ),
        ];
        for (refusal, n) in Refusal::ALL.iter().zip(&self.refused) {
            counters.push((refusal_metric(refusal.code()), taken(n)));
        }
        let counters: Vec<(&str, f64)> = counters.iter().map(|(k, n)| (k.as_str(), *n)).collect();
        if counters.iter().any(|(_, n)| *n > 0.0) {
            metrics::emit(FUNCTION, &counters, &[]);
        }
    }
}

/// A refusal's metric name: `Rejected` and its code in upper camel case (`sold_out` →
/// `RejectedSoldOut`).
fn refusal_metric(code: &str) -> String {
    let mut name = String::from("Rejected");
    for word in code.split('_') {
        let mut chars = word.chars();
        if let Some(first) = chars.next() {
            name.extend(first.to_uppercase());
            name.push_str(chars.as_str());
        }
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_metrics_are_named_after_their_codes() {
        let names: Vec<String> = Refusal::ALL
            .iter()
            .map(|r| refusal_metric(r.code()))
            .collect();
        assert_eq!(
            names,
            [
                "RejectedNotFound",
                "RejectedNotStarted",
                "RejectedEnded",
                "RejectedQuantityExceedsLimit",
                "RejectedSoldOut",
                "RejectedAlreadyPurchased",
                "RejectedExpired",
                "RejectedRateLimited",
                "RejectedPoolFull",
            ]
        );
    }
}
