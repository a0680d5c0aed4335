//! Every Lua script of `lua/`, compiled into the binary, and the way their reply codes are
//! named on the Rust side.
//!
//! `redis::Script` runs them by EVALSHA. No function's Redis user may load a script (it would
//! run any text it liked): the loader user does ([`load_all`], on every node, replicas too), at
//! each preheat run and after each migration, so a node restarted or replaced empty has them
//! again within a preheat period, and a deploy's new scripts are there once seckill-migrate has
//! run. A function that meets `NOSCRIPT` meanwhile gets an error (its redis-rs reload is refused
//! by the ACL) and answers as for Redis out of reach. What Redis runs
//! is a script behind the functions of `lua/prelude.lua` it calls ([`with_prelude`]): the one
//! writer and reader of each value format (docs/invariants.md, "The state"). A script's reply
//! codes are named constants at its top (`local NOT_FOUND = 1`) and a `codes!` enum beside
//! its wrapper; `shared/tests/script_codes.rs` reads every `return` of `lua/*.lua` and holds
//! the two lists together.

use crate::store::conn::{Redis, StoreError};
use redis::Script;
use std::sync::LazyLock;

/// `lua/prelude.lua`: the value formats and the clock, as `local function`s each script takes
/// the ones it calls of.
pub const PRELUDE: &str = include_str!("../../../lua/prelude.lua");

macro_rules! scripts {
    ($($name:ident => $file:literal,)*) => {
        $(
            #[doc = concat!("`lua/", $file, "`, behind the prelude's functions it calls")]
            pub static $name: LazyLock<Script> = LazyLock::new(|| {
                Script::new(&with_prelude(include_str!(concat!("../../../lua/", $file))))
            });
        )*

        /// Every script's file name and source (without the prelude), in the order above.
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
    DRAW_SETTLE => "draw_settle.lua",
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

/// One function of the prelude: its name, and its text from `local function <name>(` to the
/// `end` alone on a line that closes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreludeFunction {
    pub name: &'static str,
    pub text: &'static str,
}

/// The prelude's functions, in its order (a function calls only those above it).
pub fn prelude_functions() -> Vec<PreludeFunction> {
    let mut functions = Vec::new();
    let mut open: Option<(&'static str, usize)> = None;
    let mut at = 0;
    for line in PRELUDE.split_inclusive('\n') {
        if let Some(rest) = line.strip_prefix("local function ") {
            let name = rest.split('(').next().unwrap_or_default();
            open = Some((name, at));
        } else if line.trim_end() == "end" {
            if let Some((name, from)) = open.take() {
                let text = &PRELUDE[from..at + "end".len()];
                functions.push(PreludeFunction { name, text });
            }
        }
        at += line.len();
    }
    functions
}

/// Lua text without its `--` comments (no script has `--` inside a string).
fn code_of(text: &str) -> String {
    text.lines()
        .map(|line| line.split("--").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `code` calls the function `name`: the name on its own (not a field, not the end of
/// a longer name), then `(`.
fn calls(code: &str, name: &str) -> bool {
    code.match_indices(name).any(|(at, _)| {
        let before = code[..at].chars().next_back();
        let after = code[at + name.len()..].trim_start_matches([' ', '\t']);
        !before.is_some_and(|c| c.is_alphanumeric() || matches!(c, '_' | '.' | ':'))
            && after.starts_with('(')
    })
}

/// The prelude's functions `source` calls, and those they call, in the prelude's order.
pub fn prelude_for(source: &str) -> Vec<PreludeFunction> {
    let mut callers = vec![code_of(source)];
    let mut taken = Vec::new();
    // From the last one up: a function is called only from below it, so by the time a
    // function is looked at, every function that may call it is decided.
    for f in prelude_functions().into_iter().rev() {
        if callers.iter().any(|code| calls(code, f.name)) {
            callers.push(code_of(f.text));
            taken.push(f);
        }
    }
    taken.reverse();
    taken
}

/// The line of a script where its prelude functions go, when not at its top: what runs above
/// it (purchase.lua's sold-out answer) makes none of them.
pub const PRELUDE_HERE: &str = "--[[ prelude ]]\n";

/// What Redis runs for `source`: the prelude's functions it calls, then the script (or the
/// script's lines down to its [`PRELUDE_HERE`] line, the functions, then the rest). Each
/// function is a closure made on every call, so a script carries only the ones it uses;
/// `scripts/redis_acl.py` counts the commands of the same ones.
pub fn with_prelude(source: &str) -> String {
    let marker = format!("\n{PRELUDE_HERE}");
    let at = source.find(&marker).map_or(0, |at| at + marker.len());
    let mut text = String::from(&source[..at]);
    for f in prelude_for(source) {
        text.push_str(f.text);
        text.push('\n');
    }
    text.push_str(&source[at..]);
    text
}

/// Loads every script on every node of `loader`'s Redis (a cluster's replicas too: SCRIPT LOAD
/// goes to all of them), logged in as the loader user. Idempotent; answers how many scripts.
pub async fn load_all(loader: &Redis) -> anyhow::Result<usize> {
    for (file, source) in SOURCES {
        let text = with_prelude(source);
        // A cluster answers one SHA per node, all the same; a single server one.
        let answer: redis::Value = loader
            .cmd(redis::cmd("SCRIPT").arg("LOAD").arg(&text))
            .await?;
        let want = Script::new(&text).get_hash().to_string();
        let shas = sha_answers(&answer);
        anyhow::ensure!(
            !shas.is_empty() && shas.iter().all(|sha| *sha == want),
            "SCRIPT LOAD of {file} answered {answer:?}, not its SHA {want}"
        );
    }
    Ok(SOURCES.len())
}

/// The SHAs in a SCRIPT LOAD answer: one, or one per node.
fn sha_answers(answer: &redis::Value) -> Vec<String> {
    match answer {
        redis::Value::BulkString(b) => vec![String::from_utf8_lossy(b).into_owned()],
        redis::Value::SimpleString(s) => vec![s.clone()],
        redis::Value::Array(items) => items.iter().flat_map(sha_answers).collect(),
        redis::Value::Map(pairs) => pairs.iter().flat_map(|(_, v)| sha_answers(v)).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(source: &str) -> Vec<&'static str> {
        prelude_for(source).iter().map(|f| f.name).collect()
    }

    #[test]
    fn a_call_is_the_name_alone_before_its_parenthesis() {
        assert!(calls("local now = now_ms()", "now_ms"));
        assert!(calls("x(now_ms ())", "now_ms"));
        assert!(!calls("local now_ms = 1", "now_ms"));
        assert!(!calls("t.now_ms()", "now_ms"));
        assert!(!calls("my_now_ms()", "now_ms"));
        assert!(names("-- now_ms()\nreturn 0").is_empty());
    }

    #[test]
    fn the_prelude_is_its_functions_and_comments() {
        let functions = prelude_functions();
        assert!(functions.len() >= 10, "{functions:?}");
        let mut rest = PRELUDE.to_string();
        for f in &functions {
            assert!(f.text.starts_with("local function ") && f.text.ends_with("\nend"));
            rest = rest.replacen(f.text, "", 1);
        }
        assert!(
            code_of(&rest).trim().is_empty(),
            "the prelude runs or defines something outside its functions: {rest}"
        );
    }

    #[test]
    fn a_script_gets_the_functions_it_calls_and_no_other() {
        assert_eq!(names("return 0"), Vec::<&str>::new());
        assert_eq!(names("local t = now_ms()\nreturn t"), ["now_ms"]);
        let draw = with_prelude(include_str!("../../../lua/draw.lua"));
        assert!(draw.starts_with("local function now_ms()"));
        assert!(draw.contains("local function put_stock("));
        assert!(!draw.contains("local function add_stock("));
    }

    #[test]
    fn a_script_with_the_prelude_line_makes_no_function_above_it() {
        let source = "local x = 1\nif x then return 0 end\n--[[ prelude ]]\nreturn now_ms()\n";
        let text = with_prelude(source);
        assert!(text.starts_with(
            "local x = 1\nif x then return 0 end\n--[[ prelude ]]\nlocal function now_ms()"
        ));
        assert!(text.ends_with("\nend\nreturn now_ms()\n"), "{text}");
        // purchase.lua: the sold-out answer's HMGET and return come before any function.
        let purchase = with_prelude(include_str!("../../../lua/purchase.lua"));
        let first_function = purchase
            .find("local function ")
            .expect("purchase.lua has functions");
        let sold_out = purchase
            .find("  return SOLD_OUT\nend\n")
            .expect("the sold-out answer");
        assert!(
            sold_out < first_function,
            "a function is made before the sold-out answer"
        );
    }

    /// The write calls (`HSET`, `HSETNX`, `HMSET`) of `code`, each up to its closing parenthesis.
    fn hash_writes(code: &str) -> Vec<&str> {
        let mut writes = Vec::new();
        for (at, _) in code.match_indices("redis.call(") {
            let call = &code[at..];
            let mut depth = 0;
            let end = call
                .char_indices()
                .find_map(|(i, c)| {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    (depth == 0 && c == ')').then_some(i + 1)
                })
                .unwrap_or(call.len());
            let call = &call[..end];
            if ["'HSET'", "'HSETNX'", "'HMSET'"]
                .iter()
                .any(|w| call["redis.call(".len()..].trim_start().starts_with(w))
            {
                writes.push(call);
            }
        }
        writes
    }

    #[test]
    fn every_script_that_writes_a_term_writes_the_terms_with_it() {
        const TERMS: [&str; 5] = ["'startMs'", "'endMs'", "'limit'", "'drawEndMs'", "'rate'"];
        let mut writers = Vec::new();
        for (script, source) in SOURCES {
            let code = code_of(&with_prelude(source));
            for write in hash_writes(&code) {
                if TERMS.iter().any(|t| write.contains(t)) {
                    assert!(
                        write.contains("'terms', sale_terms("),
                        "{script} writes a term without the terms: {write}"
                    );
                    writers.push(*script);
                }
            }
        }
        writers.dedup();
        assert_eq!(writers, ["preheat.lua", "adjust.lua"]);
        assert_eq!(
            hash_writes("redis.call('HSET', k, f(1), 'x')\nredis.call('GET', k)").len(),
            1
        );
    }

    #[test]
    fn every_prelude_function_has_a_caller_and_no_script_redefines_one() {
        for f in prelude_functions() {
            assert!(
                SOURCES.iter().any(|(_, s)| calls(&code_of(s), f.name)),
                "no script calls {}",
                f.name
            );
            for (script, source) in SOURCES {
                for shadow in [
                    format!("local function {}(", f.name),
                    format!("local {} ", f.name),
                ] {
                    assert!(!source.contains(&shadow), "{script} redefines {}", f.name);
                }
            }
        }
    }
}
