//! What each container keeps in front of Redis, so a flood costs Redis less and a stalled
//! Redis costs the caller less: the sold-out memory, the bucket counts it has seen, the
//! windows of sales Redis does not hold, the offset of Redis's clock, and a circuit breaker.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

/// Per-container memory of "Redis said sold out": activity -> (units Redis had left, when).
/// A request asking for more than that is refused without reaching Redis while the memory is
/// fresh. The memory is short because stock comes back (cancellations, compensations).
/// Every request of a flood reads it, so readers share a read lock instead of queueing on a
/// mutex.
pub(crate) struct SoldOutCache {
    ttl: Duration,
    seen: RwLock<HashMap<i64, (i64, Instant)>>,
}

impl SoldOutCache {
    pub(crate) fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            seen: RwLock::new(HashMap::new()),
        }
    }

    pub(crate) fn refuses(&self, activity_id: i64, quantity: i64) -> bool {
        let seen = self.seen.read().unwrap_or_else(|p| p.into_inner());
        matches!(seen.get(&activity_id), Some((left, at)) if quantity > *left && at.elapsed() < self.ttl)
    }

    pub(crate) fn remember(&self, activity_id: i64, stock_left: i64) {
        if self.ttl.is_zero() {
            return;
        }
        let mut seen = self.seen.write().unwrap_or_else(|p| p.into_inner());
        // Drop stale entries now and then so a long-lived container does not collect them.
        if seen.len() > 1024 {
            seen.retain(|_, (_, at)| at.elapsed() < self.ttl);
        }
        seen.insert(activity_id, (stock_left, Instant::now()));
    }

    pub(crate) fn forget(&self, activity_id: i64) {
        self.seen
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&activity_id);
    }
}

/// Per-container memory of each bucketed sale's bucket count (a sale not in it has one
/// bucket, or has not been bought here yet). The count is fixed once a sale starts; before,
/// a purchase that asks with a stale count is told the right one by Redis.
#[derive(Default)]
pub(crate) struct BucketCounts {
    seen: RwLock<HashMap<i64, u32>>,
}

impl BucketCounts {
    pub(crate) fn get(&self, activity_id: i64) -> Option<u32> {
        let seen = self.seen.read().unwrap_or_else(|p| p.into_inner());
        seen.get(&activity_id).copied()
    }

    pub(crate) fn put(&self, activity_id: i64, count: u32) {
        let mut seen = self.seen.write().unwrap_or_else(|p| p.into_inner());
        if seen.len() > 1024 {
            seen.clear();
        }
        if count > 1 {
            seen.insert(activity_id, count);
        } else {
            seen.remove(&activity_id);
        }
    }
}

/// Per-container memory of the window of sales Redis does not hold (`None`: no such published
/// sale), kept for [`UnloadedCache::TTL`].
#[derive(Default)]
pub(crate) struct UnloadedCache {
    seen: Mutex<HashMap<i64, (Window, Instant)>>,
}

pub(crate) type Window = Option<(chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>)>;

impl UnloadedCache {
    const TTL: Duration = Duration::from_secs(1);

    pub(crate) fn get(&self, activity_id: i64) -> Option<Window> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        match seen.get(&activity_id) {
            Some((window, at)) if at.elapsed() < Self::TTL => Some(*window),
            _ => None,
        }
    }

    pub(crate) fn put(&self, activity_id: i64, window: Window) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() > 1024 {
            seen.retain(|_, (_, at)| at.elapsed() < Self::TTL);
        }
        seen.insert(activity_id, (window, Instant::now()));
    }
}

/// The highest activity id this container knows to exist, read from the database at most
/// once per [`KnownMax::REFRESH`]: an id above it is no sale, answered 404 with no database
/// read, so a flood of random ids costs one read per period and container, not one per id.
#[derive(Default)]
pub(crate) struct KnownMax {
    max: AtomicI64,
    /// When the database was last asked; callers above the max wait on the one read.
    checked: tokio::sync::Mutex<Option<Instant>>,
}

impl KnownMax {
    const REFRESH: Duration = Duration::from_secs(1);

    /// Whether activity `id` may exist: yes at or below the known max; above it, as the max
    /// read at most once per period says. A failed read says yes (the caller then reads the
    /// row and answers as its failure deserves), and is not tried again within the period.
    pub(crate) async fn may_exist(&self, pool: &sqlx::PgPool, id: i64) -> bool {
        if id <= self.max.load(Ordering::Relaxed) {
            return true;
        }
        let mut checked = self.checked.lock().await;
        if id <= self.max.load(Ordering::Relaxed) {
            return true;
        }
        if checked.is_some_and(|at| at.elapsed() < Self::REFRESH) {
            return false;
        }
        *checked = Some(Instant::now());
        match seckill_shared::domain::activity::max_id(pool).await {
            Ok(max) => {
                self.max.fetch_max(max, Ordering::Relaxed);
                id <= max
            }
            Err(_) => true,
        }
    }
}

/// The offset of the Redis server's clock from this container's, estimated from the
/// purchase script's answers: each answer carries the server's `TIME` when the script ran,
/// which is at least (send time + offset), so the smallest `serverNow - sentAt` seen is the
/// offset plus the fastest one-way trip. The estimate is the minimum over the current and
/// the previous [`ClockSkew::WINDOW`], so it follows a clock that drifts.
pub(crate) struct ClockSkew {
    base: Instant,
    window_start_ms: AtomicU64,
    current_min: AtomicI64,
    previous_min: AtomicI64,
}

impl Default for ClockSkew {
    fn default() -> Self {
        Self {
            base: Instant::now(),
            window_start_ms: AtomicU64::new(0),
            current_min: AtomicI64::new(i64::MAX),
            previous_min: AtomicI64::new(i64::MAX),
        }
    }
}

impl ClockSkew {
    const WINDOW: Duration = Duration::from_secs(10);

    fn offset_ms(&self) -> i64 {
        let best = self
            .current_min
            .load(Ordering::Relaxed)
            .min(self.previous_min.load(Ordering::Relaxed));
        // No answer yet: trust the clocks (NTP-synchronised in AWS).
        if best == i64::MAX {
            0
        } else {
            best
        }
    }

    /// The deadline on the Redis clock for a script sent at `sent_ms` (this clock) by a caller
    /// that waits `timeout`: half of it, so that an answer sent just before the deadline still
    /// has the other half to arrive.
    pub(crate) fn deadline(&self, sent_ms: i64, timeout: Duration) -> i64 {
        sent_ms + self.offset_ms() + (timeout.as_millis() as i64 / 2).max(1)
    }

    pub(crate) fn observe(&self, sent_ms: i64, server_now_ms: i64) {
        let sample = server_now_ms - sent_ms;
        self.current_min.fetch_min(sample, Ordering::Relaxed);
        let now = self.base.elapsed().as_millis() as u64;
        let start = self.window_start_ms.load(Ordering::Relaxed);
        if now >= start + Self::WINDOW.as_millis() as u64
            && self
                .window_start_ms
                .compare_exchange(start, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let finished = self.current_min.swap(sample, Ordering::Relaxed);
            self.previous_min.store(finished, Ordering::Relaxed);
        }
    }
}

/// A small circuit breaker in front of Redis: after [`Breaker::THRESHOLD`] failures in a row it
/// opens for a cooldown, during which requests get 503 at once instead of each waiting out the
/// Redis timeout (which would pile up concurrent Lambda invocations, each billed for the wait).
/// After the cooldown requests go through again; the first success closes it.
pub(crate) struct Breaker {
    base: Instant,
    cooldown: Duration,
    failures: AtomicU32,
    /// Milliseconds since `base` until which the breaker is open; 0 = closed.
    open_until_ms: AtomicU64,
}

impl Breaker {
    const THRESHOLD: u32 = 5;

    pub(crate) fn new(redis_timeout: Duration) -> Self {
        Self {
            base: Instant::now(),
            cooldown: (redis_timeout * 3).clamp(Duration::from_millis(500), Duration::from_secs(5)),
            failures: AtomicU32::new(0),
            open_until_ms: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64
    }

    pub(crate) fn is_open(&self) -> bool {
        let until = self.open_until_ms.load(Ordering::Relaxed);
        until != 0 && self.now_ms() < until
    }

    pub(crate) fn success(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
            self.open_until_ms.store(0, Ordering::Relaxed);
        }
    }

    /// Counts a failure; true when this one opened the breaker (it was closed, or its cooldown
    /// had run out, and the run of failures reached [`Breaker::THRESHOLD`]).
    pub(crate) fn failure(&self) -> bool {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures < Self::THRESHOLD {
            return false;
        }
        let was_open = self.is_open();
        let until = self.now_ms() + self.cooldown.as_millis() as u64;
        self.open_until_ms.store(until.max(1), Ordering::Relaxed);
        if !was_open {
            tracing::warn!(failures, cooldown = ?self.cooldown, "redis circuit breaker open");
        }
        !was_open
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sold_out_memory_refuses_only_what_it_cannot_serve_and_only_while_fresh() {
        let cache = SoldOutCache::new(Duration::from_millis(50));
        cache.remember(1, 2);
        assert!(cache.refuses(1, 3));
        assert!(!cache.refuses(1, 2), "two units may still be there");
        assert!(!cache.refuses(2, 1), "other activities are unaffected");
        std::thread::sleep(Duration::from_millis(60));
        assert!(!cache.refuses(1, 3), "stale memory asks Redis again");
    }

    #[test]
    fn clock_skew_follows_the_fastest_answer_and_leaves_half_the_timeout() {
        let skew = ClockSkew::default();
        let timeout = Duration::from_millis(300);
        assert_eq!(
            skew.deadline(1_000, timeout),
            1_150,
            "no answer yet: clocks trusted"
        );
        // Redis runs 5 s ahead; answers took 40 ms and 2 ms to get there.
        skew.observe(1_000, 6_040);
        skew.observe(2_000, 7_002);
        assert_eq!(skew.deadline(3_000, timeout), 3_000 + 5_002 + 150);
    }

    #[test]
    fn breaker_opens_after_a_run_of_failures_and_closes_on_success() {
        let b = Breaker::new(Duration::from_millis(100));
        for _ in 0..Breaker::THRESHOLD - 1 {
            assert!(!b.failure());
        }
        assert!(!b.is_open());
        assert!(b.failure(), "the run's fifth failure opens it");
        assert!(b.is_open());
        assert!(!b.failure(), "already open: not opened again");
        b.success();
        assert!(!b.is_open());
        for _ in 0..Breaker::THRESHOLD - 1 {
            assert!(!b.failure());
        }
        assert!(b.failure(), "a new run after a success opens it again");
    }
}
