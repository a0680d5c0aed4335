//! End-to-end and invariant tests of seckill, against the real local services.
//!
//! One binary per concern in `tests/tests/`: a file, or a folder whose `main.rs` is the
//! binary and whose modules split it by concern (`--test chaos` runs `tests/tests/chaos/`).
//! The helpers every test shares are the test kit, `testkit/`; each binary's header says what
//! it proves, and a folder's `main.rs` names its modules.
//!
//! - `entry`, `public_view`, `http`, `storefront`: the purchase path and the public view
//!   through the entry's router (in process, and over TCP on the dev server), and the pages
//!   the dev server serves;
//! - `consumer`, `lifecycle`, `jobs`, `admin`, `lock`: the consumer, pay and cancel, preheat
//!   and reconcile, the admin function and its fenced lock;
//! - `payments`: a payment started at the provider, its signed webhook, each event decided
//!   once, and a payment racing a cancel;
//! - `edge`: the origin secret's check in front of the entry's and the admin's routers;
//! - `buckets`, `draw`, `draw_loss`: bucketed sales on the cluster, draw admission, and a draw
//!   sale whose Redis keys are lost at each step;
//! - `interleavings`, `chaos`: pause points between protocol steps, and the seeded chaos run;
//! - `db`, `roles`, `tls`: the pool, the least-privilege roles, TLS to the managed services;
//! - `binaries`, `lambda_invoke`, `openapi`: the built binaries, every function under the
//!   Lambda runtime API, and the OpenAPI document;
//! - `toolchain`: the pinned toolchain and the declared `rust-version` are one.

#[cfg(test)]
mod tests {
    /// The list above names every test binary: a new file or folder in `tests/tests/` is not
    /// done until it is listed here.
    #[test]
    fn the_crate_doc_names_every_test_binary() {
        let doc = include_str!("lib.rs");
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let binary = if path.join("main.rs").is_file() {
                name.as_str()
            } else if let Some(binary) = name.strip_suffix(".rs") {
                binary
            } else {
                continue;
            };
            assert!(
                doc.contains(&format!("`{binary}`")),
                "{binary} is not named"
            );
        }
    }
}
