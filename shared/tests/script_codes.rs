//! Every Lua script's reply codes are named on both sides, and the two lists agree: the
//! constants at the top of `lua/<script>.lua` and the `codes!` enum beside its wrapper. Every
//! `return` of a script answers a named code (or data), never a bare integer. The scripts are
//! read as Redis runs them, behind the functions of `lua/prelude.lua` they call; the prelude
//! declares no code and answers values, so it adds none to any script.

use seckill_shared::protocol::lock;
use seckill_shared::store::{
    buckets, cancel, draw, ledger, meta, purchase, repair, scripts, user_rate,
};
use std::collections::BTreeSet;
use std::path::PathBuf;

/// Each script that answers codes, with the Rust enum's codes.
fn coded() -> Vec<(&'static str, &'static [(&'static str, i64)])> {
    vec![
        (purchase::Code::SCRIPT, purchase::Code::ALL),
        (purchase::Borrowed::SCRIPT, purchase::Borrowed::ALL),
        (purchase::Credited::SCRIPT, purchase::Credited::ALL),
        (ledger::GiveBackCode::SCRIPT, ledger::GiveBackCode::ALL),
        (ledger::SettleCode::SCRIPT, ledger::SettleCode::ALL),
        (cancel::CancelBegin::SCRIPT, cancel::CancelBegin::ALL),
        (meta::PreheatOutcome::SCRIPT, meta::PreheatOutcome::ALL),
        (meta::AdjustCode::SCRIPT, meta::AdjustCode::ALL),
        (meta::RebuildCode::SCRIPT, meta::RebuildCode::ALL),
        (buckets::UnloadCode::SCRIPT, buckets::UnloadCode::ALL),
        (repair::FixStockCode::SCRIPT, repair::FixStockCode::ALL),
        (repair::DropUserCode::SCRIPT, repair::DropUserCode::ALL),
        (repair::RestoreCode::SCRIPT, repair::RestoreCode::ALL),
        (draw::DrawCode::SCRIPT, draw::DrawCode::ALL),
        (draw::LeaveCode::SCRIPT, draw::LeaveCode::ALL),
        (draw::RestoreCode::SCRIPT, draw::RestoreCode::ALL),
        (lock::AcquireCode::SCRIPT, lock::AcquireCode::ALL),
        (lock::RenewCode::SCRIPT, lock::RenewCode::ALL),
        (lock::ReleaseCode::SCRIPT, lock::ReleaseCode::ALL),
        (lock::StampCode::SCRIPT, lock::StampCode::ALL),
        (user_rate::RateCode::SCRIPT, user_rate::RateCode::ALL),
    ]
}

/// The scripts that answer data only (a snapshot, a list, a count).
const DATA: &[&str] = &[
    "snapshot.lua",
    "mark_users.lua",
    "mark_lost.lua",
    "draw_settle.lua",
];

/// `NotFound` → `NOT_FOUND`.
fn upper_snake(camel: &str) -> String {
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// A line without its `--` comment (no script has `--` inside a string).
fn code_of(line: &str) -> &str {
    line.split("--").next().unwrap_or("")
}

/// The named constants a script declares: `local NAME = <integer>`.
fn constants(source: &str) -> BTreeSet<(String, i64)> {
    source
        .lines()
        .filter_map(|line| {
            let rest = code_of(line).trim().strip_prefix("local ")?;
            let (name, value) = rest.split_once('=')?;
            let name = name.trim();
            let is_const = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            let value = value.trim().parse::<i64>().ok()?;
            is_const.then(|| (name.to_string(), value))
        })
        .collect()
}

/// The first value of every `return` of a script: `return X` or `return {X, ...}`.
fn returned_first_values(source: &str) -> Vec<String> {
    let mut firsts = Vec::new();
    for line in source.lines() {
        let code = code_of(line);
        let mut rest = code;
        while let Some(at) = rest.find("return") {
            let before = rest[..at].chars().last();
            let after = &rest[at + "return".len()..];
            rest = after;
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let value = after.trim_start().trim_start_matches('{').trim_start();
            let first: String = value
                .chars()
                .take_while(|c| !matches!(c, ',' | '}' | ' '))
                .collect();
            firsts.push(first);
        }
    }
    firsts
}

fn lua_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../lua")
}

#[test]
fn every_script_in_lua_is_compiled_in_and_named_here() {
    let mut on_disk: Vec<String> = std::fs::read_dir(lua_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".lua") && n != "prelude.lua")
        .collect();
    on_disk.sort();
    let mut compiled: Vec<String> = scripts::SOURCES
        .iter()
        .map(|(n, _)| n.to_string())
        .collect();
    compiled.sort();
    assert_eq!(compiled, on_disk, "scripts::SOURCES and lua/ disagree");
    let mut named: Vec<String> = coded().iter().map(|(n, _)| n.to_string()).collect();
    named.extend(DATA.iter().map(|n| n.to_string()));
    named.sort();
    assert_eq!(
        named, on_disk,
        "a script neither declares codes nor answers data"
    );
}

/// What Redis runs for `script`: the prelude's functions it calls, then the script.
fn run_text(script: &str) -> String {
    let source = scripts::SOURCES
        .iter()
        .find(|(n, _)| *n == script)
        .unwrap_or_else(|| panic!("{script} is not compiled in"))
        .1;
    scripts::with_prelude(source)
}

#[test]
fn each_scripts_constants_are_its_wrappers_codes() {
    for (script, codes) in coded() {
        let lua = constants(&run_text(script));
        let rust: BTreeSet<(String, i64)> = codes
            .iter()
            .map(|(name, value)| (upper_snake(name), *value))
            .collect();
        assert_eq!(
            lua, rust,
            "{script}: its constants and its codes! enum disagree"
        );
    }
    for script in DATA {
        assert!(
            constants(&run_text(script)).is_empty(),
            "{script} answers data, not codes"
        );
    }
}

#[test]
fn every_return_names_its_code() {
    for (script, _) in scripts::SOURCES {
        let source = run_text(script);
        let declared: BTreeSet<String> = constants(&source).into_iter().map(|(n, _)| n).collect();
        let firsts = returned_first_values(&source);
        assert!(!firsts.is_empty(), "{script} has no return");
        for first in firsts {
            assert!(
                first.parse::<i64>().is_err(),
                "{script}: `return {first}` answers a bare code; name it"
            );
            let is_name = first
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            if is_name {
                assert!(
                    declared.contains(&first),
                    "{script}: {first} is not declared"
                );
            }
        }
    }
}

#[test]
fn the_reader_of_returns_sees_what_it_must() {
    let lua =
        "local A = 0 -- a\nlocal B_2 = 7\nif x then return A end\nreturn {B_2, 1}\n-- return 3\n";
    assert_eq!(
        constants(lua),
        BTreeSet::from([("A".to_string(), 0), ("B_2".to_string(), 7)])
    );
    assert_eq!(returned_first_values(lua), ["A", "B_2"]);
    assert_eq!(returned_first_values("if y then return 1 end"), ["1"]);
    assert_eq!(upper_snake("WouldGoNegative"), "WOULD_GO_NEGATIVE");
}

#[test]
fn the_prelude_declares_no_code_and_answers_none() {
    assert!(constants(scripts::PRELUDE).is_empty());
    for first in returned_first_values(scripts::PRELUDE) {
        let is_code = first.parse::<i64>().is_ok()
            || first
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        assert!(!is_code, "prelude.lua: `return {first}` answers a code");
    }
}
