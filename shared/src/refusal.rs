//! Why a purchase was refused: the one list of `lua/purchase.lua`'s refusals.
//!
//! The script answers a numeric code; [`Refusal::from_script`] is the only place that reads
//! it, and an unknown code is an error, never a refusal. [`Refusal::code`] is the name logs,
//! metrics and the load generator use; `From<Refusal> for ApiError` (in [`crate::error`]) is
//! the HTTP answer.

/// A purchase the script decided not to make. Nothing changed in Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The sale is not in Redis: unknown, a draft, not preheated yet, or long over. The entry
    /// function asks the database which (see its `not_loaded`).
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
    /// More purchase attempts this second than the sale's per-user rate: nothing was done.
    /// `retry_after_ms`: until the user's second is over.
    #[error("too many purchase attempts; retry after the time Retry-After gives")]
    RateLimited { retry_after_ms: i64 },
}

impl Refusal {
    /// One of each refusal, in [`index`](Refusal::index) order.
    pub const ALL: [Refusal; 8] = [
        Refusal::NotFound,
        Refusal::NotStarted,
        Refusal::Ended,
        Refusal::QuantityExceedsLimit,
        Refusal::SoldOut { stock_left: 0 },
        Refusal::AlreadyPurchased,
        Refusal::Expired { now_ms: 0 },
        Refusal::RateLimited { retry_after_ms: 0 },
    ];

    /// Every refusal's [`code`](Refusal::code), in [`index`](Refusal::index) order.
    pub const CODES: [&'static str; 8] = [
        "not_found",
        "not_started",
        "ended",
        "quantity_exceeds_limit",
        "sold_out",
        "already_purchased",
        "expired",
        "rate_limited",
    ];

    /// The stable name of the refusal, for logs, metrics and load reports.
    pub fn code(&self) -> &'static str {
        Self::CODES[self.index()]
    }

    /// A dense index, for per-refusal counters.
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
        }
    }

    /// The code `purchase.lua` answers this refusal with (the inverse of
    /// [`from_script`](Refusal::from_script)), for callers that run the script by raw EVALSHA.
    pub fn script_code(&self) -> i64 {
        match self {
            // 8 to 11 are the script's answers that are not refusals (see `sale::Decision`).
            Refusal::RateLimited { .. } => 12,
            other => other.index() as i64 + 1,
        }
    }

    /// Reads `purchase.lua`'s refusal codes (1-7 and 12; the others are not refusals and not
    /// read here).
    /// `None` for a code the script does not answer.
    pub fn from_script(code: i64, stock: i64, now_ms: i64) -> Option<Self> {
        Some(match code {
            1 => Refusal::NotFound,
            2 => Refusal::NotStarted,
            3 => Refusal::Ended,
            4 => Refusal::QuantityExceedsLimit,
            5 => Refusal::SoldOut { stock_left: stock },
            6 => Refusal::AlreadyPurchased,
            7 => Refusal::Expired { now_ms },
            12 => Refusal::RateLimited {
                retry_after_ms: stock,
            },
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_code_reads_as_the_refusal_whose_code_it_names() {
        for (n, refusal) in Refusal::ALL.iter().enumerate() {
            let read = Refusal::from_script(refusal.script_code(), 0, 0).unwrap();
            assert_eq!((read.index(), read.code()), (n, Refusal::CODES[n]));
        }
        for code in [0, 8, 9, 10, 11, 13] {
            assert_eq!(Refusal::from_script(code, 0, 0), None, "{code}");
        }
        for (n, refusal) in Refusal::ALL.iter().enumerate() {
            assert_eq!(refusal.index(), n);
        }
    }
}
