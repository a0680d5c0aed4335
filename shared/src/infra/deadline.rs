//! An invocation's deadline as Lambda hands it over (`Context::deadline`, milliseconds since the
//! Unix epoch), on this process's monotonic clock: what a function's batch or run stops short of.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The deadline `deadline_epoch_ms` as an [`Instant`]. `None` for a deadline that is not in the
/// future: Lambda hands an invocation its deadline ahead of it, so such a value comes from a
/// runtime that sets none (`cargo lambda watch` sends a constant 600000, in 1970).
pub fn from_epoch_ms(deadline_epoch_ms: u64) -> Option<Instant> {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let left = deadline_epoch_ms.checked_sub(now_ms).filter(|ms| *ms > 0)?;
    Some(Instant::now() + Duration::from_millis(left))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_ahead_is_that_far_ahead_and_one_behind_is_none() {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let left = from_epoch_ms(now_ms + 5_000).unwrap() - Instant::now();
        assert!(
            left > Duration::from_millis(4_000) && left <= Duration::from_millis(5_000),
            "{left:?}"
        );
        for unset in [0, 600_000, now_ms - 1] {
            assert!(from_epoch_ms(unset).is_none(), "{unset}");
        }
    }
}
