//! What the entry keeps in front of the database for each user: the per-user rate of requests
//! that reach it (`admit`, counted in Redis so it holds across containers) and a short
//! memory of the status read's "no order" answers (`NoOrderCache`). Together they keep one
//! account's loop from spending the reserved concurrency and the database connections the
//! buyers and the order consumer need. docs/invariants.md, "A user's database rate".

use crate::EntryState;
use moka::future::Cache;
use seckill_shared::infra::config::USER_DB_RATE_WINDOW;
use seckill_shared::store::user_rate::{self, Counted};
use seckill_shared::{ApiError, Refusal};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Counts one request of `user_id` that is about to reach the database: a 429 `rate_limited`
/// with `Retry-After` past [`seckill_shared::Config::user_db_rate_per_sec`] (the purchase's
/// answer to its own rate, same body). Called before any database work of the request.
///
/// Redis out of reach (or the breaker open) does not decide the answer: the count falls back
/// to this container's own window. Failing closed would turn a Redis hiccup into refused
/// payments and order reads whose database is fine (pay needs no Redis at all); failing open
/// would let every looping account through unbounded exactly while the purchase path is
/// giving reservations back through the database. The local window keeps each user at the
/// rate per container, so at most the reserved concurrency times the rate in all.
pub(crate) async fn admit(state: &EntryState, user_id: &str) -> Result<(), ApiError> {
    let s = &state.inner;
    let Some(limit) = s.user_rate.limit else {
        return Ok(());
    };
    let counted = if s.breaker.is_open() {
        s.user_rate.count_here(user_id).await
    } else {
        // The breaker is only read here, never moved: a user's counter lives on another
        // shard than the sale's keys, so its answers say nothing of the purchase path's Redis.
        match user_rate::count(&s.redis, user_id, limit, USER_DB_RATE_WINDOW).await {
            Ok(counted) => counted,
            Err(e) => {
                tracing::debug!(error = %e, "user rate not counted in redis; counted here");
                s.user_rate.count_here(user_id).await
            }
        }
    };
    match counted {
        Counted::Allowed { .. } => Ok(()),
        Counted::Limited { retry_after_ms } => {
            s.counters.user_db_rate_limited();
            Err(Refusal::RateLimited { retry_after_ms }.into())
        }
    }
}

/// The per-user rate's setting, and this container's own count for when Redis cannot count.
pub(crate) struct UserRate {
    /// Requests per [`USER_DB_RATE_WINDOW`]; `None`: no limit.
    limit: Option<u32>,
    /// Per user: when their window here started, and its count. Entries live one window.
    here: Cache<String, Arc<(Instant, AtomicU32)>>,
}

impl UserRate {
    /// Users whose local window this container keeps at most (only while Redis is out of
    /// reach does it fill).
    const CAPACITY: u64 = 10_000;

    pub(crate) fn new(per_sec: u32) -> Self {
        let per_window = per_sec.saturating_mul(USER_DB_RATE_WINDOW.as_secs() as u32);
        Self {
            limit: (per_window > 0).then_some(per_window),
            here: Cache::builder()
                .max_capacity(Self::CAPACITY)
                .time_to_live(USER_DB_RATE_WINDOW)
                .build(),
        }
    }

    async fn count_here(&self, user_id: &str) -> Counted {
        let limit = self.limit.unwrap_or(u32::MAX);
        let window = self
            .here
            .get_with_by_ref(user_id, async {
                Arc::new((Instant::now(), AtomicU32::new(0)))
            })
            .await;
        let n = window.1.fetch_add(1, Ordering::Relaxed) + 1;
        if n <= limit {
            return Counted::Allowed {
                left: i64::from(limit - n),
            };
        }
        let left = USER_DB_RATE_WINDOW.saturating_sub(window.0.elapsed());
        Counted::Limited {
            retry_after_ms: (left.as_millis() as i64).max(1),
        }
    }
}

/// Per container, the status read's recent "no order" answers per (user, sale), so a user
/// polling a sale they hold nothing in costs the database one read per [`NoOrderCache::TTL`].
/// Only consulted after Redis said the user holds no reservation and no pool entry there.
///
/// It never hides an order of a purchase this container accepted: the purchase leaves a
/// [`Memo::Bought`] mark once its script has run, which no read that started before it may
/// overwrite, so the next read asks the database. A purchase accepted by another container is
/// in its reservation (which the read sees first) until the consumer commits the order; the
/// answer "none" may then lag that commit by [`NoOrderCache::TTL`] at most.
pub(crate) struct NoOrderCache {
    memo: Cache<(String, i64), Memo>,
}

/// What the cache holds for a (user, sale).
#[derive(Clone, Copy, Debug)]
enum Memo {
    /// The database had no order, as read by a status read that started then.
    NoOrder,
    /// This container's purchase script ran for the pair then: ask the database.
    Bought(Instant),
}

impl NoOrderCache {
    /// How long "no order" is answered from memory: a second, shorter than a purchase's way
    /// from another container's 202 to a committed order that the buyer polls for, and long
    /// enough that a loop costs the database once a second.
    pub(crate) const TTL: Duration = Duration::from_secs(1);
    /// Pairs kept at most (a few MB at worst).
    const CAPACITY: u64 = 50_000;

    pub(crate) fn new() -> Self {
        Self {
            memo: Cache::builder()
                .max_capacity(Self::CAPACITY)
                .time_to_live(Self::TTL)
                .build(),
        }
    }

    /// True when "no order" may be answered for (`user_id`, `activity_id`) without the database.
    pub(crate) async fn knows_none(&self, user_id: &str, activity_id: i64) -> bool {
        let key = (user_id.to_string(), activity_id);
        matches!(self.memo.get(&key).await, Some(Memo::NoOrder))
    }

    /// The database had no order for the pair, as read by a status read that started at
    /// `read_from` (before its Redis reads). Not kept when this container's purchase for the
    /// pair ran since then, nor when the read took longer than the TTL (a purchase's mark may
    /// have expired meanwhile).
    pub(crate) async fn remember_none(&self, user_id: &str, activity_id: i64, read_from: Instant) {
        if read_from.elapsed() >= Self::TTL {
            return;
        }
        let key = (user_id.to_string(), activity_id);
        self.memo
            .entry(key)
            .and_compute_with(|memo| async move {
                use moka::ops::compute::Op;
                match memo.map(|e| e.into_value()) {
                    Some(Memo::Bought(at)) if at >= read_from => Op::Nop,
                    _ => Op::Put(Memo::NoOrder),
                }
            })
            .await;
    }

    /// This container's purchase script ran for the pair (its answer in or not): whatever the
    /// cache said, the next read asks the database.
    pub(crate) async fn bought(&self, user_id: &str, activity_id: i64) {
        let key = (user_id.to_string(), activity_id);
        self.memo.insert(key, Memo::Bought(Instant::now())).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_purchase_mark_outlives_a_none_read_that_started_before_it() {
        let cache = NoOrderCache::new();
        let before = Instant::now();
        cache.bought("u", 1).await;
        cache.remember_none("u", 1, before).await;
        assert!(
            !cache.knows_none("u", 1).await,
            "a read from before the purchase"
        );
        cache.remember_none("u", 1, Instant::now()).await;
        assert!(cache.knows_none("u", 1).await, "a read after it is kept");
        assert!(!cache.knows_none("u", 2).await && !cache.knows_none("v", 1).await);
        cache.bought("u", 1).await;
        assert!(!cache.knows_none("u", 1).await, "a purchase clears it");
    }

    #[tokio::test]
    async fn the_local_count_holds_a_user_to_the_window_and_no_one_else() {
        let rate = UserRate::new(2);
        for _ in 0..4 {
            assert!(matches!(
                rate.count_here("u").await,
                Counted::Allowed { .. }
            ));
        }
        let Counted::Limited { retry_after_ms } = rate.count_here("u").await else {
            panic!("the fifth in a 2 s window at 2/s");
        };
        assert!((1..=2000).contains(&retry_after_ms), "{retry_after_ms}");
        assert!(matches!(
            rate.count_here("v").await,
            Counted::Allowed { .. }
        ));
        assert!(UserRate::new(0).limit.is_none(), "0 is off");
    }
}
