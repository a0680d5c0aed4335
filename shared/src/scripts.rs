//! Every Lua script of `lua/`, compiled into the binary.
//!
//! `redis::Script` runs them by EVALSHA and reloads on `NOSCRIPT` (on every cluster node), so
//! a failover or a `SCRIPT FLUSH` costs one extra round trip, never an error.

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
