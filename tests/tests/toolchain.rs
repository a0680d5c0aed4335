//! The toolchain: `rust-toolchain.toml` pins the one release every build, test and deploy here
//! runs on, and the workspace's `rust-version` (the oldest release cargo lets build the crates)
//! names that same release, since no older one is ever built or tested. Moving to a new release
//! is one change to both files.

use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace")
        .to_path_buf()
}

/// The TOML file at `path` (relative to the repository's root).
fn read(path: &str) -> toml::Table {
    let text = std::fs::read_to_string(repo_root().join(path)).expect(path);
    text.parse()
        .unwrap_or_else(|e| panic!("{path} is not TOML: {e}"))
}

/// The string at `keys` in `table`, or a panic naming the missing key.
fn string<'a>(table: &'a toml::Table, file: &str, keys: &[&str]) -> &'a str {
    let (last, tables) = keys.split_last().expect("a key");
    let mut at = table;
    for key in tables {
        at = at
            .get(*key)
            .and_then(toml::Value::as_table)
            .unwrap_or_else(|| panic!("{file} has no [{}]", keys.join(".")));
    }
    at.get(*last)
        .and_then(toml::Value::as_str)
        .unwrap_or_else(|| panic!("{file} has no {}", keys.join(".")))
}

#[test]
fn the_declared_rust_version_is_the_pinned_toolchain() {
    let toolchain = read("rust-toolchain.toml");
    let manifest = read("Cargo.toml");

    let channel = string(&toolchain, "rust-toolchain.toml", &["toolchain", "channel"]);
    let msrv = string(
        &manifest,
        "Cargo.toml",
        &["workspace", "package", "rust-version"],
    );

    assert_eq!(
        channel, msrv,
        "rust-toolchain.toml pins {channel} but Cargo.toml's [workspace.package] rust-version is \
         {msrv}: only the pinned release is built and tested here, so declare that one (change both)"
    );
}

#[test]
fn the_pinned_toolchain_carries_the_lambdas_target() {
    let toolchain = read("rust-toolchain.toml");
    let targets: Vec<&str> = toolchain["toolchain"]
        .get("targets")
        .and_then(toml::Value::as_array)
        .map(|targets| targets.iter().filter_map(toml::Value::as_str).collect())
        .unwrap_or_default();

    assert!(
        targets.contains(&"aarch64-unknown-linux-gnu"),
        "rust-toolchain.toml's targets {targets:?} lack aarch64-unknown-linux-gnu, the functions' \
         architecture (template.yaml's Architectures: [arm64], `make build --arm64`)"
    );
}
