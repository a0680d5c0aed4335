//! A user's rate of requests that reach the database: `lua/user_rate.lua` counts one request
//! in the user's fixed window and says whether it is within the rate. The entry asks before
//! any database work of an authenticated route (docs/invariants.md, "A user's database rate").

use crate::store::conn::{Redis, StoreError};
use crate::store::keys;
use crate::store::scripts::{self, codes};
use std::time::Duration;

codes! {
    /// `lua/user_rate.lua`'s reply codes.
    pub enum RateCode of "user_rate.lua" {
        Allowed = 0,
        RateLimited = 1,
    }
}

/// What counting one request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    /// Within the rate: `left` more requests fit in this window.
    Allowed { left: i64 },
    /// Past the rate: the window is over in `retry_after_ms`.
    Limited { retry_after_ms: i64 },
}

/// Counts one request of `user_id`: at most `limit` per `window` (both at least 1).
pub async fn count(
    redis: &Redis,
    user_id: &str,
    limit: u32,
    window: Duration,
) -> Result<Counted, StoreError> {
    let mut inv = scripts::USER_RATE.prepare_invoke();
    inv.key(keys::user_db_rate(&redis.prefix, user_id))
        .arg(limit.max(1))
        .arg((window.as_millis() as u64).max(1));
    let (code, value): (i64, i64) = redis.script(&inv).await?;
    Ok(match RateCode::read(code)? {
        RateCode::Allowed => Counted::Allowed { left: value },
        RateCode::RateLimited => Counted::Limited {
            retry_after_ms: value.max(1),
        },
    })
}
