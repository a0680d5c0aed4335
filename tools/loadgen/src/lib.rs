//! Load generation for seckill, and the `make demo` show built on it.
//!
//! # Layout
//! - [`load`]: the generator: a request [`load::Plan`], concurrent keep-alive clients with
//!   JWTs, HdrHistogram latencies, outcomes by error code, a timeline of 100 ms buckets.
//! - [`demo`]: the flash sale end to end through the in-process dev server, checked against
//!   PostgreSQL and Redis afterwards; first come, first served or by draw
//!   ([`demo::admission`]: the entrants' status polls and the draw's fairness figures).
//! - [`chart`]: the demo's PNG at 100 ms resolution (responses by class, p99, stock remaining,
//!   in total and per stock bucket), and who got a unit by when they arrived.

pub mod chart;
pub mod demo;
pub mod load;

/// `target/demo` of this workspace (or of `CARGO_TARGET_DIR`), where the demo writes.
pub fn default_out_dir() -> std::path::PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    target.join("demo")
}
