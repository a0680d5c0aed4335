//! The scripts of reconcile's repairs: the orphan check's mark and drop
//! (`lua/mark_users.lua`, `lua/drop_user.lua`) and the stock fix (`lua/fix_stock.lua`).
//! docs/invariants.md, "Reconcile".

use super::conn::{Redis, StoreError};
use super::keys::Bucket;
use super::scripts::{self, codes};

/// `lua/mark_users.lua`: marks the candidates of an orphan check; returns those marked.
pub async fn mark_users(
    redis: &Redis,
    at: impl Into<Bucket>,
    token: &str,
    now_ms: i64,
    users: &[String],
) -> Result<Vec<String>, StoreError> {
    let k = redis.bucket_keys(at.into());
    let mut inv = scripts::MARK_USERS.prepare_invoke();
    inv.key(&k.users).key(&k.ledger).arg(token).arg(now_ms);
    for u in users {
        inv.arg(u);
    }
    redis.script(&inv).await
}

codes! {
    /// `lua/drop_user.lua`'s reply codes.
    pub enum DropUserCode of "drop_user.lua" {
        Kept = 0,
        Dropped = 1,
    }
}

/// `lua/drop_user.lua`: ends an orphan check of `user`: removes the mark `token` and, when
/// `drop`, the user, both only while the mark is still there. Returns whether the user went.
pub async fn drop_user(
    redis: &Redis,
    at: impl Into<Bucket>,
    user: &str,
    token: &str,
    drop: bool,
) -> Result<bool, StoreError> {
    let k = redis.bucket_keys(at.into());
    let mut inv = scripts::DROP_USER.prepare_invoke();
    inv.key(&k.users)
        .key(&k.ledger)
        .arg(user)
        .arg(token)
        .arg(if drop { "drop" } else { "keep" });
    Ok(DropUserCode::read(redis.script(&inv).await?)? == DropUserCode::Dropped)
}

codes! {
    /// `lua/fix_stock.lua`'s reply codes.
    pub enum FixStockCode of "fix_stock.lua" {
        /// Not the owner, not loaded, ledger busy, or the stock moved meanwhile.
        Skipped = 0,
        Fixed = 1,
    }
}

/// `lua/fix_stock.lua`: sets the stock to `target` only for the lock `owner`, with the ledger
/// empty and the stock sequence still `observed_seq`.
pub async fn fix_stock(
    redis: &Redis,
    at: impl Into<Bucket>,
    owner: &str,
    observed_seq: i64,
    target: i64,
) -> Result<bool, StoreError> {
    let k = redis.bucket_keys(at.into());
    let mut inv = scripts::FIX_STOCK.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.ledger)
        .key(&k.lock)
        .arg(owner)
        .arg(observed_seq)
        .arg(target);
    Ok(FixStockCode::read(redis.script(&inv).await?)? == FixStockCode::Fixed)
}
