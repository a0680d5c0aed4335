//! Redis key names of one activity.
//!
//! Every key of an activity carries the hash tag `{<activityId>}`, so all keys one Lua script
//! touches live in one cluster slot: the same scripts run on a single Redis and on Redis
//! Cluster without `CROSSSLOT` errors.

/// The field `lua/preheat.lua` puts in `users` and `ledger` so they exist, with the sale's
/// expiry, while they hold no user: a hash whose last field goes is deleted, and the next
/// write would create it without an expiry. Never a user id (the auth refuses an empty
/// `sub`); everything that counts or scans users or the ledger skips it. The scripts spell
/// it `''`.
pub const SENTINEL: &str = "";

/// The keys of one activity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    /// Hash: stock (units left in Redis), startMs, endMs, limit, total, version, expireAtMs,
    /// seq (the stock sequence), epoch (the load epoch), change (the last admin change
    /// applied), title (for the public view). A sale is loaded when its meta exists.
    pub meta: String,
    /// Hash user id -> the request id of the purchase that added the user: users holding a
    /// reservation, an order or a cancel in flight (one order per user), plus [`SENTINEL`].
    pub users: String,
    /// Hash user id -> in-flight entry: `r|requestId|qty|ms` reservation,
    /// `c|cancelId|qty|ms|orderId` cancel attempt, `x|token|0|ms` orphan check mark; plus
    /// [`SENTINEL`].
    pub ledger: String,
    /// The admin lock: a hash of its holder's owner id → hold count and `token` → its fencing token, with a lease.
    pub lock: String,
    /// The fencing token counter.
    pub fence: String,
}

impl Keys {
    pub fn new(prefix: &str, activity_id: i64) -> Self {
        let base = format!("{prefix}:{{{activity_id}}}");
        Self {
            meta: format!("{base}:meta"),
            users: format!("{base}:users"),
            ledger: format!("{base}:ledger"),
            lock: format!("{base}:lock"),
            fence: format!("{base}:fence"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_shares_the_activity_hash_tag() {
        let k = Keys::new("seckill", 42);
        for key in [&k.meta, &k.users, &k.ledger, &k.lock, &k.fence] {
            let open = key.find('{').unwrap();
            let close = key.find('}').unwrap();
            assert_eq!(&key[open + 1..close], "42", "{key}");
        }
    }
}
