//! The scripts of the repairs: the orphan check's mark and drop (`lua/mark_users.lua`,
//! `lua/drop_user.lua`), the restore of a lost field's mark and write (`lua/mark_lost.lua`,
//! `lua/restore_user.lua`) and the stock fix (`lua/fix_stock.lua`).
//! docs/invariants.md, "Reconcile" and "Lost fields".

use super::conn::{Redis, StoreError};
use super::keys::Bucket;
use super::scripts::{self, codes};
use uuid::Uuid;

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

/// Whether a restore's mark replaces another check's mark (`lua/mark_lost.lua`'s mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TakeOver {
    /// Replace an orphan check's or another restore's mark: a cancel needs the field now.
    Take,
    /// Leave a user another check has marked for the next run.
    Wait,
}

/// A user `lua/mark_lost.lua` marked, and what the user's field held then.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Marked {
    pub user: String,
    /// The field's value when marked; `None` when the field was absent.
    pub held: Option<String>,
}

/// `lua/mark_lost.lua`: marks the `holders` (users, each with the request id of their live
/// order as the database listed it) whose field does not name that request and who have no
/// entry in flight. Returns those marked.
pub async fn mark_lost(
    redis: &Redis,
    at: impl Into<Bucket>,
    token: &str,
    now_ms: i64,
    take_over: TakeOver,
    holders: &[(String, Uuid)],
) -> Result<Vec<Marked>, StoreError> {
    let k = redis.bucket_keys(at.into());
    let mut inv = scripts::MARK_LOST.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.users)
        .key(&k.ledger)
        .arg(token)
        .arg(now_ms)
        .arg(match take_over {
            TakeOver::Take => "take",
            TakeOver::Wait => "wait",
        });
    for (user, request_id) in holders {
        inv.arg(user).arg(request_id.to_string());
    }
    let flat: Vec<String> = redis.script(&inv).await?;
    Ok(flat
        .chunks_exact(2)
        .map(|pair| Marked {
            user: pair[0].clone(),
            held: Some(pair[1].clone()).filter(|h| !h.is_empty()),
        })
        .collect())
}

codes! {
    /// `lua/restore_user.lua`'s reply codes.
    pub enum RestoreCode of "restore_user.lua" {
        /// The mark was gone: the user acted meanwhile, or a load emptied the ledger.
        NotMine = 0,
        /// The mark removed; the field left as it was.
        Cleared = 1,
        /// The field names the live order's request again.
        Restored = 2,
    }
}

/// `lua/restore_user.lua`: ends a restore of `m.user`'s field: removes the mark `token` and,
/// with `live` (the request id of the user's live order, read after the mark), writes it into
/// the field, both only while the mark is still there and the field holds what it held then.
pub async fn restore_user(
    redis: &Redis,
    at: impl Into<Bucket>,
    m: &Marked,
    token: &str,
    live: Option<Uuid>,
) -> Result<RestoreCode, StoreError> {
    let k = redis.bucket_keys(at.into());
    let mut inv = scripts::RESTORE_USER.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.users)
        .key(&k.ledger)
        .arg(&m.user)
        .arg(token)
        .arg(m.held.as_deref().unwrap_or(""))
        .arg(live.map(|id| id.to_string()).unwrap_or_default());
    RestoreCode::read(redis.script(&inv).await?)
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
