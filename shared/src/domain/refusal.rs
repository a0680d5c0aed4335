//! Why a purchase was refused: the one list logs, metrics, the load generator and the HTTP
//! answers share. Each refusal's code in `lua/purchase.lua` is named beside its wrapper
//! ([`crate::store::purchase::Code`]); its HTTP answer is in [`crate::http::error`].

/// A purchase the script decided not to make. Nothing changed in Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The sale is not in Redis: unknown, a draft, not preheated yet, or long over. The entry
    /// function asks the database which.
    #[error("no such activity on sale")]
    NotFound,
    #[error("the sale has not started yet")]
    NotStarted,
    #[error("the sale has ended")]
    Ended,
    /// More than the activity's per-order limit, which only the script knows on the hot path.
    #[error("quantity exceeds the per-order limit")]
    QuantityExceedsLimit,
    /// Fewer units left than asked for.
    #[error("sold out")]
    SoldOut { stock_left: i64 },
    /// One order per user per activity: the user holds a reservation or an order, or has an
    /// entry in flight.
    #[error("you already hold an order for this activity")]
    AlreadyPurchased,
    /// The script ran after the caller's deadline and changed nothing: the caller had already
    /// given up on the answer (a stalled or slow Redis). `now_ms` is when it ran.
    #[error("redis answered too late; nothing was done, retry")]
    Expired { now_ms: i64 },
    /// More purchase attempts this second than the sale's per-user rate, or more requests
    /// that reach the database than the user's rate of those (the entry's other routes answer
    /// it too): nothing was done. `retry_after_ms`: until the user's window is over.
    #[error("too many attempts; retry after the time Retry-After gives")]
    RateLimited { retry_after_ms: i64 },
    /// A draw sale's pool holds as many entrants as it takes (`maxEntrants`).
    #[error("the draw's pool is full")]
    PoolFull,
}

impl Refusal {
    /// One of each refusal, in [`index`](Refusal::index) order.
    pub const ALL: [Refusal; 9] = [
        Refusal::NotFound,
        Refusal::NotStarted,
        Refusal::Ended,
        Refusal::QuantityExceedsLimit,
        Refusal::SoldOut { stock_left: 0 },
        Refusal::AlreadyPurchased,
        Refusal::Expired { now_ms: 0 },
        Refusal::RateLimited { retry_after_ms: 0 },
        Refusal::PoolFull,
    ];

    /// The stable name of the refusal, for logs, metrics and load reports.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::NotFound => "not_found",
            Refusal::NotStarted => "not_started",
            Refusal::Ended => "ended",
            Refusal::QuantityExceedsLimit => "quantity_exceeds_limit",
            Refusal::SoldOut { .. } => "sold_out",
            Refusal::AlreadyPurchased => "already_purchased",
            Refusal::Expired { .. } => "expired",
            Refusal::RateLimited { .. } => "rate_limited",
            Refusal::PoolFull => "pool_full",
        }
    }

    /// A dense index (the position in [`Refusal::ALL`]), for per-refusal counters.
    pub fn index(&self) -> usize {
        match self {
            Refusal::NotFound => 0,
            Refusal::NotStarted => 1,
            Refusal::Ended => 2,
            Refusal::QuantityExceedsLimit => 3,
            Refusal::SoldOut { .. } => 4,
            Refusal::AlreadyPurchased => 5,
            Refusal::Expired { .. } => 6,
            Refusal::RateLimited { .. } => 7,
            Refusal::PoolFull => 8,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_sits_at_its_index_with_a_code_of_its_own() {
        for (n, refusal) in Refusal::ALL.iter().enumerate() {
            assert_eq!(refusal.index(), n);
        }
        let mut codes: Vec<&str> = Refusal::ALL.iter().map(Refusal::code).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), Refusal::ALL.len());
    }
}
