//! The Redis store: the sale's live state (stock, users, ledger, a draw's pool and winners) and
//! the Lua scripts that change it, each one atomic step on one bucket's hash-tagged keys.
//! Typed wrappers only: who runs which script when is [`crate::protocol`].
//!
//! - [`conn`]: the connection (one server or a cluster) with bounded calls.
//! - [`keys`]: the key names of a sale's buckets, and a user's home bucket.
//! - [`scripts`]: every script of `lua/`, and the naming of their reply codes.
//! - [`purchase`]: `purchase.lua`, and a transfer's two steps between buckets.
//! - [`ledger`]: the entries in flight, their give-back and settle, a bucket's snapshot.
//! - [`cancel`]: a cancel attempt announced in the ledger.
//! - [`meta`]: a load, an admin change, and the reads preheat decides by.
//! - [`repair`]: reconcile's orphan check and stock fix.
//! - [`draw`]: a draw sale's draw, pool and winners, and what the drawer settles.
//! - [`buckets`]: the reads that add a bucketed sale's buckets up; a bucket's unload.
//! - [`view`]: the stock and the public view of a loaded sale.
//! - [`user_rate`]: a user's rate of requests that reach the database.
//! - [`values`]: the values the scripts keep (a ledger entry, a pool entry, a winner entry),
//!   read back.

pub mod buckets;
pub mod cancel;
pub mod conn;
pub mod draw;
pub mod keys;
pub mod ledger;
pub mod meta;
pub mod purchase;
pub mod repair;
pub mod scripts;
pub mod user_rate;
pub mod values;
pub mod view;
