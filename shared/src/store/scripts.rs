//! Every Lua script of `lua/`, compiled into the binary, and the way their reply codes are
//! named on the Rust side.
//!
//! `redis::Script` runs them by EVALSHA and reloads on `NOSCRIPT` (on every cluster node), so
//! a failover or a `SCRIPT FLUSH` costs one extra round trip, never an error. A script's reply
//! codes are named constants at its top (`local NOT_FOUND = 1`) and a [`codes!`] enum beside
//! its wrapper; `shared/tests/script_codes.rs` reads every `return` of `lua/*.lua` and holds
//! the two lists together.

use crate::store::conn::StoreError;
use redis::Script;
use std::sync::LazyLock;

macro_rules! scripts {
    ($($name:ident => $file:literal,)*) => {
        $(
            #[doc = concat!("`lua/", $file, "`")]
            pub static $name: LazyLock<Script> =
                LazyLock::new(|| Script::new(include_str!(concat!("../../../lua/", $file))));
        )*

        /// Every script's file name and source, in the order above.
        pub const SOURCES: &[(&str, &str)] =
            &[$(($file, include_str!(concat!("../../../lua/", $file))),)*];
    };
}

scripts! {
    PURCHASE => "purchase.lua",
    GIVE_BACK => "give_back.lua",
    SETTLE => "settle.lua",
    CANCEL_BEGIN => "cancel_begin.lua",
    PREHEAT => "preheat.lua",
    LOCK_ACQUIRE => "lock_acquire.lua",
    LOCK_RENEW => "lock_renew.lua",
    LOCK_RELEASE => "lock_release.lua",
    ADJUST => "adjust.lua",
    SNAPSHOT => "snapshot.lua",
    FIX_STOCK => "fix_stock.lua",
    DROP_USER => "drop_user.lua",
    MARK_USERS => "mark_users.lua",
    MARK_LOST => "mark_lost.lua",
    RESTORE_USER => "restore_user.lua",
    REBUILD_USERS => "rebuild_users.lua",
    BORROW => "borrow.lua",
    CREDIT => "credit.lua",
    UNLOAD => "unload.lua",
    LOCK_STAMP => "lock_stamp.lua",
    DRAW => "draw.lua",
    OUTBOX_TAKE => "outbox_take.lua",
    OUTBOX_DONE => "outbox_done.lua",
    POOL_LEAVE => "pool_leave.lua",
    POOL_RESTORE => "pool_restore.lua",
    USER_RATE => "user_rate.lua",
}

/// Declares the reply codes of one script: an enum whose variants name them (a variant
/// `NotFound` is the script's constant `NOT_FOUND`), with the values the script gives them.
macro_rules! codes {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident of $script:literal {
            $($(#[$vmeta:meta])* $variant:ident = $value:literal,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        $vis enum $name {
            $($(#[$vmeta])* $variant = $value,)*
        }

        impl $name {
            /// The script whose reply codes these are.
            pub const SCRIPT: &'static str = $script;
            /// Every code and its name, in the order declared.
            pub const ALL: &'static [(&'static str, i64)] = &[$((stringify!($variant), $value),)*];

            /// The code a reply carries. One the list does not know is an error: the script
            /// and its wrapper disagree, which is a bug to surface, never a default outcome.
            pub fn read(code: i64) -> Result<Self, $crate::store::conn::StoreError> {
                match code {
                    $($value => Ok(Self::$variant),)*
                    other => Err($crate::store::scripts::unknown_answer($script, other)),
                }
            }
        }
    };
}
pub(crate) use codes;

/// A script answered a code its wrapper does not know: the script and its wrapper disagree.
pub(crate) fn unknown_answer(script: &'static str, code: i64) -> StoreError {
    StoreError::Redis(redis::RedisError::from((
        redis::ErrorKind::Parse,
        "unexpected script answer",
        format!("{script} answered {code}"),
    )))
}
