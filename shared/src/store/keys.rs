//! Redis key names of one activity, and of each of its stock buckets.
//!
//! A sale's stock lives in one or more **buckets**. Every key of one bucket carries the same
//! hash tag, so all keys one Lua script touches live in one cluster slot: the same scripts run
//! on a single Redis and on Redis Cluster without `CROSSSLOT` errors. Bucket 0's tag is
//! `{<activityId>}`, so a sale with one bucket has the layout it always had. With more buckets,
//! each bucket's tag is chosen so that the buckets fall on different parts of the cluster's
//! slot space (and so, with the usual even slot split, on different shards). Each bucket is
//! a whole sale of its own (meta with the window, stock, `users`, ledger); a user belongs to
//! one **home** bucket, which alone holds their field in `users` and their ledger entries, so
//! one order per user stays one script on one slot. See docs/invariants.md, "Bucketed sales".

use crate::domain::order::Order;
use crate::domain::purchase::{Attempt, OrderMessage};
use uuid::Uuid;

/// The field `lua/preheat.lua` puts in `users` and `ledger` so they exist, with the sale's
/// expiry, while they hold no user: a hash whose last field goes is deleted, and the next
/// write would create it without an expiry. Never a user id (the auth refuses an empty
/// `sub`); everything that counts or scans users or the ledger skips it. The scripts spell
/// it `''`.
pub const SENTINEL: &str = "";

/// The ledger field of a transfer between buckets starts with this. User ids are trimmed
/// (`auth`), so no user id starts with a space: a transfer's field is never a user's.
/// `lua/borrow.lua` spells it `' transfer:'`.
pub const TRANSFER_FIELD_PREFIX: &str = " transfer:";

/// The key counting `user_id`'s requests that reach the database in the current window
/// (`lua/user_rate.lua`). One key per user, so one slot on a cluster whatever the id holds.
pub fn user_db_rate(prefix: &str, user_id: &str) -> String {
    format!("{prefix}:dbrate:{user_id}")
}

/// Redis Cluster's number of hash slots.
const SLOTS: u32 = 16384;

/// The cluster slot of a hash tag (CRC16/XMODEM, as Redis computes it).
pub fn slot(tag: &str) -> u32 {
    u32::from(crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes())) % SLOTS
}

/// The ledger field of the transfer `id` (see [`TRANSFER_FIELD_PREFIX`]).
pub fn transfer_field(id: Uuid) -> String {
    format!("{TRANSFER_FIELD_PREFIX}{id}")
}

/// One stock bucket of a sale: its index among `count`. A sale with one bucket is
/// `Bucket::from(activity_id)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Bucket {
    pub activity_id: i64,
    pub index: u32,
    pub count: u32,
}

impl From<i64> for Bucket {
    fn from(activity_id: i64) -> Self {
        Self {
            activity_id,
            index: 0,
            count: 1,
        }
    }
}

impl Bucket {
    /// Every bucket of a sale with `count` buckets, bucket 0 first.
    pub fn all(activity_id: i64, count: u32) -> impl Iterator<Item = Bucket> {
        let count = count.max(1);
        (0..count).map(move |index| Bucket {
            activity_id,
            index,
            count,
        })
    }

    /// The bucket that holds `user_id`'s field in `users` and their ledger entries.
    pub fn home(activity_id: i64, count: u32, user_id: &str) -> Bucket {
        let count = count.max(1);
        let index = if count == 1 {
            0
        } else {
            u32::from(crc16::State::<crc16::ARC>::calculate(user_id.as_bytes())) % count
        };
        Bucket {
            activity_id,
            index,
            count,
        }
    }

    /// Another bucket of the same sale.
    pub fn sibling(&self, index: u32) -> Bucket {
        Bucket { index, ..*self }
    }

    /// This bucket's hash tag (without the braces). Bucket 0 is `<activityId>`. The slot space
    /// is cut into `count` equal parts; bucket 0 lies in one of them, and bucket `i` takes the
    /// `i`-th part after it: its tag is `<activityId>.<i>of<count>.<k>` for the smallest `k`
    /// whose slot falls there. The tag names the count, so two layouts of one sale never
    /// share a bucket other than bucket 0.
    pub fn tag(&self) -> String {
        let base = self.activity_id.to_string();
        if self.index == 0 || self.count <= 1 {
            return base;
        }
        let part = |tag: &str| slot(tag) * self.count / SLOTS;
        let wanted = (part(&base) + self.index) % self.count;
        (0u32..)
            .map(|k| format!("{base}.{}of{}.{k}", self.index, self.count))
            .find(|tag| part(tag) == wanted)
            .expect("some suffix falls in every part of the slot space")
    }
}

/// What belongs to one user of a sale, and so to the user's home bucket: the bucket that holds
/// their field in `users` and their ledger entries.
pub trait Home {
    fn home(&self) -> Bucket;
}

impl Home for Attempt {
    fn home(&self) -> Bucket {
        Bucket::home(self.activity_id, self.buckets, &self.user_id)
    }
}

impl Home for OrderMessage {
    fn home(&self) -> Bucket {
        self.attempt.home()
    }
}

impl Home for Order {
    fn home(&self) -> Bucket {
        Bucket::home(self.activity_id, self.bucket_count(), &self.user_id)
    }
}

/// The keys of one bucket (of a sale with one bucket: of the sale). What each holds, and the
/// format of every value, is told in docs/invariants.md, "The state"; [`super::values`] reads
/// the values back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    /// Hash: the bucket's stock, stock sequence, load epoch, window and the rest of its
    /// settings. A bucket is loaded when its meta exists.
    pub meta: String,
    /// Hash user id -> the request id of the purchase that added the user (one order per
    /// user), plus [`SENTINEL`].
    pub users: String,
    /// Hash user id (or a [`transfer_field`]) -> the one entry in flight
    /// ([`super::values::LedgerEntry`]), plus [`SENTINEL`].
    pub ledger: String,
    /// The admin lock: a hash of its holder's owner id → hold count and `token` → its fencing
    /// token, with a lease. In bucket 0 it is the lock itself; in the other buckets a stamp
    /// of the lock's holder that the owner-checked scripts of that bucket check.
    pub lock: String,
    /// The fencing token counter (bucket 0's is the sale's).
    pub fence: String,
    /// A draw sale's pool: hash user id -> the user's entry of the draw window
    /// ([`super::values::PoolEntry`]), plus [`SENTINEL`].
    pub pool: String,
    /// A draw sale's tickets: sorted set user id -> ticket, one per entrant; the draw takes the
    /// lowest tickets first (`lua/draw.lua`). Plus [`SENTINEL`] at -1.
    pub tickets: String,
    /// A draw sale's winners, as its draw made them: hash request id -> the winner
    /// ([`super::values::WinnerEntry`]), plus [`SENTINEL`]. The drawer reads it to record the
    /// outcome in the database, which the winners' orders are then written from.
    pub winners: String,
    /// Prefix of a user's purchase-rate counter (`<rate><userId>`, see [`Keys::rate`]).
    rate: String,
}

impl Keys {
    /// The keys of a sale with one bucket.
    pub fn new(prefix: &str, activity_id: i64) -> Self {
        Self::of(prefix, Bucket::from(activity_id))
    }

    /// The keys of one bucket.
    pub fn of(prefix: &str, bucket: Bucket) -> Self {
        let base = format!("{prefix}:{{{}}}", bucket.tag());
        Self {
            meta: format!("{base}:meta"),
            users: format!("{base}:users"),
            ledger: format!("{base}:ledger"),
            lock: format!("{base}:lock"),
            fence: format!("{base}:fence"),
            pool: format!("{base}:pool"),
            tickets: format!("{base}:tickets"),
            winners: format!("{base}:winners"),
            rate: format!("{base}:rate:"),
        }
    }

    /// The key counting `user_id`'s purchase attempts of the current second (it expires one
    /// second after the first).
    pub fn rate(&self, user_id: &str) -> String {
        format!("{}{user_id}", self.rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag_of(key: &str) -> &str {
        let open = key.find('{').unwrap();
        let close = key.find('}').unwrap();
        &key[open + 1..close]
    }

    #[test]
    fn every_key_of_a_bucket_shares_its_hash_tag() {
        let k = Keys::new("seckill", 42);
        let rate = k.rate("alice");
        for key in [
            &k.meta, &k.users, &k.ledger, &k.lock, &k.fence, &k.pool, &k.winners, &rate,
        ] {
            assert_eq!(tag_of(key), "42", "{key}");
        }
        let b = Keys::of("seckill", Bucket::all(42, 3).nth(2).unwrap());
        for key in [&b.meta, &b.users, &b.ledger, &b.lock, &b.fence] {
            assert_eq!(tag_of(key), tag_of(&b.meta), "{key}");
        }
        assert_ne!(tag_of(&b.meta), "42");
    }

    #[test]
    fn the_buckets_of_a_sale_fall_on_different_parts_of_the_slot_space() {
        for id in [1_i64, 7, 42, 1000, 123_456_789] {
            for count in [2_u32, 3, 8, 16] {
                let mut parts: Vec<u32> = Bucket::all(id, count)
                    .map(|b| slot(&b.tag()) * count / SLOTS)
                    .collect();
                parts.sort();
                assert_eq!(parts, (0..count).collect::<Vec<_>>(), "id {id}, {count}");
            }
        }
    }

    #[test]
    fn a_user_has_one_home_and_users_spread_over_the_buckets() {
        let home = |u: &str| Bucket::home(9, 3, u).index;
        assert_eq!(home("alice"), home("alice"));
        let mut per = [0; 3];
        for i in 0..3000 {
            per[home(&format!("user-{i}")) as usize] += 1;
        }
        assert!(per.iter().all(|&n| n > 800), "{per:?}");
        assert_eq!(Bucket::home(9, 1, "alice"), Bucket::from(9));
    }

    #[test]
    fn two_layouts_of_a_sale_share_only_bucket_0() {
        let three: Vec<String> = Bucket::all(5, 3).map(|b| b.tag()).collect();
        let four: Vec<String> = Bucket::all(5, 4).map(|b| b.tag()).collect();
        assert_eq!(three[0], four[0]);
        assert!(three[1..].iter().all(|t| !four.contains(t)));
    }
}
