//! Every Lua script of `lua/`, compiled into the binary.
//!
//! `redis::Script` runs them by EVALSHA and reloads on `NOSCRIPT` (on every cluster node), so
//! a failover or a `SCRIPT FLUSH` costs one extra round trip, never an error.

use crate::cache::CacheError;
use redis::Script;
use std::sync::LazyLock;

macro_rules! script {
    ($name:ident, $file:literal) => {
        #[doc = concat!("`lua/", $file, "`")]
        pub static $name: LazyLock<Script> =
            LazyLock::new(|| Script::new(include_str!(concat!("../../lua/", $file))));
    };
}

script!(PURCHASE, "purchase.lua");
script!(COMPENSATE, "compensate.lua");
script!(SETTLE, "settle.lua");
script!(CANCEL_BEGIN, "cancel_begin.lua");
script!(CANCEL_FINISH, "cancel_finish.lua");
script!(PREHEAT, "preheat.lua");
script!(LOCK_ACQUIRE, "lock_acquire.lua");
script!(LOCK_RENEW, "lock_renew.lua");
script!(LOCK_RELEASE, "lock_release.lua");
script!(ADJUST, "adjust.lua");
script!(SNAPSHOT, "snapshot.lua");
script!(FIX_STOCK, "fix_stock.lua");
script!(DROP_USER, "drop_user.lua");
script!(MARK_USERS, "mark_users.lua");
script!(REBUILD_USERS, "rebuild_users.lua");
script!(BORROW, "borrow.lua");
script!(CREDIT, "credit.lua");
script!(UNLOAD, "unload.lua");
script!(LOCK_STAMP, "lock_stamp.lua");
script!(DRAW, "draw.lua");
script!(OUTBOX_TAKE, "outbox_take.lua");
script!(OUTBOX_DONE, "outbox_done.lua");
script!(POOL_LEAVE, "pool_leave.lua");

/// A script answered a code its wrapper does not know: the script and its wrapper disagree.
/// That is a bug to surface, never a default outcome.
pub(crate) fn unknown_answer(script: &'static str, code: i64) -> CacheError {
    CacheError::Redis(redis::RedisError::from((
        redis::ErrorKind::Parse,
        "unexpected script answer",
        format!("{script} answered {code}"),
    )))
}

/// A script's 1 / 0 answer (done / not done).
pub(crate) fn flag(script: &'static str, answer: i64) -> Result<bool, CacheError> {
    match answer {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(unknown_answer(script, other)),
    }
}
