//! The protocol: who changes Redis and the database, in which steps, and how each step stays
//! right whatever runs between two of them. Every function is a caller of these; each step's
//! interleavings and crash points are in docs/invariants.md.
//!
//! - [`purchase`]: a purchase decided in Redis, its order message sent, and what a 503 means.
//! - [`buckets`]: a purchase across a sale's buckets (borrowing when the home bucket is short).
//! - [`consume`]: the consumer's decision on an order message, one by one or a batch at once.
//! - [`giveback`]: the database as the one arbiter of a reservation's fate.
//! - [`cancel`]: a confirmed order cancelled exactly once (ledger, database, Redis).
//! - [`pay`]: a confirmed order paid.
//! - [`restore`]: a buyer's field in `users` that Redis lost, restored from her live order.
//! - [`draw`]: a draw sale's draw and its winners' sends.
//! - [`admin`]: an admin's create and change of a sale, under its fenced lock.
//! - [`load`]: a sale loaded into Redis under its fenced lock.
//! - [`lock`]: the per-sale lock with its watchdog and a fencing token the database checks.

pub mod admin;
pub mod buckets;
pub mod cancel;
pub mod consume;
pub mod draw;
pub mod giveback;
pub mod load;
pub mod lock;
pub mod pay;
pub mod purchase;
pub mod restore;
