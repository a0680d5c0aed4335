//! Redis key names of one activity.
//!
//! Every key of an activity carries the hash tag `{<activityId>}`, so all keys one Lua script
//! touches live in one cluster slot: the same scripts run on a single Redis and on Redis
//! Cluster without `CROSSSLOT` errors.

/// The keys of one activity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    /// Units left in Redis (string integer).
    pub stock: String,
    /// Hash: startMs, endMs, limit, total, version, expireAtMs, seq (the stock sequence),
    /// epoch (the load epoch), change (the last admin change applied), title (for the public
    /// view).
    pub meta: String,
    /// Set of user ids holding a reservation or an order.
    pub users: String,
    /// Hash user id -> in-flight entry: `r|requestId|qty|ms` reservation,
    /// `c|cancelId|qty|ms|orderId` cancel attempt, `x|token|0|ms` orphan check mark.
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
            stock: format!("{base}:stock"),
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
        for key in [&k.stock, &k.meta, &k.users, &k.ledger, &k.lock, &k.fence] {
            let open = key.find('{').unwrap();
            let close = key.find('}').unwrap();
            assert_eq!(&key[open + 1..close], "42", "{key}");
        }
    }
}
