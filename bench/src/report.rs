//! The printed table, `RESULTS.md` and `results.json`.
//!
//! # Layout
//! - [`machine`]: where and when the run happened (RESULTS.md's header).
//! - One module per section of the table, in the order it prints them: [`strategies`],
//!   [`scripts`], [`buckets`], [`ratios`] (also computed here for results.json), [`entry`],
//!   [`consumer`], [`polls`], [`draw`], [`reconcile`], [`memory`], [`binaries`].
//! - `method.md`: "How it was measured", the end of RESULTS.md.

mod binaries;
mod buckets;
mod consumer;
mod draw;
mod entry;
mod machine;
mod memory;
mod polls;
mod ratios;
mod reconcile;
mod scripts;
mod strategies;

pub use machine::{redis_clients, Machine};

use crate::results::{Results, Sizes};
use serde_json::{json, Value};
use std::fmt::Write;

/// RESULTS.md's closing section: how each figure was measured.
const METHOD: &str = include_str!("report/method.md");

/// One run's results, ready to be written out.
pub struct Document {
    machine: Machine,
    sizes: Sizes,
    results: Results,
    ratios: serde_json::Map<String, Value>,
}

impl Document {
    pub fn new(machine: Machine, sizes: Sizes, results: Results) -> Self {
        Self {
            machine,
            sizes,
            ratios: ratios::measured(&results),
            results,
        }
    }

    pub fn json(&self) -> Value {
        let m = &self.machine;
        json!({
            "machine": {
                "uname": m.uname, "cpu": m.cpu, "nproc": m.nproc,
                "loadStart": m.load_start, "loadEnd": m.load_end,
                "redisVersion": m.redis_version, "redisClientsAtStart": m.redis_clients_at_start,
                "seconds": round(m.seconds, 1),
            },
            "date": m.date,
            "command": m.command,
            "sizes": self.sizes,
            "rows": self.results.rows,
            "scripts": self.results.scripts,
            "buckets": self.results.buckets,
            "ratios": self.ratios,
            "entry": self.results.entry,
            "consumer": self.results.consumer,
            "polls": self.results.polls,
            "draw": self.results.draw,
            "reconcile": self.results.reconcile,
            "memory": self.results.memory,
            "binaries": self.results.binaries,
        })
    }

    /// The tables (printed to stdout and embedded in RESULTS.md).
    pub fn table(&self) -> String {
        let mut s = String::new();
        let r = &self.results;
        if !r.rows.is_empty() {
            strategies::table(&mut s, &r.rows, &self.sizes);
        }
        if !r.scripts.is_empty() {
            scripts::table(&mut s, &r.scripts);
        }
        if !r.buckets.is_empty() {
            buckets::table(&mut s, &r.buckets);
        }
        ratios::table(&mut s, &self.ratios);
        if let Some(e) = &r.entry {
            entry::table(&mut s, e);
        }
        if let Some(c) = &r.consumer {
            consumer::table(&mut s, c);
        }
        if let Some(p) = &r.polls {
            polls::table(&mut s, p);
        }
        if !r.draw.is_empty() {
            draw::table(&mut s, &r.draw);
        }
        if !r.reconcile.is_empty() {
            reconcile::table(&mut s, &r.reconcile);
        }
        if !r.memory.is_empty() {
            memory::table(&mut s, &r.memory);
        }
        if !r.binaries.is_empty() {
            binaries::table(&mut s, &r.binaries);
        }
        s
    }

    pub fn markdown(&self) -> String {
        let m = &self.machine;
        let mut s = String::new();
        s.push_str("# Benchmark results\n\n");
        s.push_str("Written by `make bench` (`bench/`, package `seckill-bench`); every figure below was measured in the one run described here. Absolute figures drift run to run on a shared 2-core machine; the ratios are the point.\n\n");
        let _ = writeln!(s, "- command: `{}`", m.command);
        let _ = writeln!(s, "- date: {} (run took {:.0} s)", m.date, m.seconds);
        let _ = writeln!(s, "- machine: `{}`", m.uname);
        let _ = writeln!(s, "- cpu: {} × {}", m.nproc, m.cpu);
        let _ = writeln!(
            s,
            "- load average at start / end: {} / {}",
            m.load_start, m.load_end
        );
        let _ = writeln!(
            s,
            "- Redis {} on 127.0.0.1:6379 ({} clients connected at start), PostgreSQL on 127.0.0.1:5432 (a fresh database), SQS emulator moto on 127.0.0.1:4566 (fresh queues)\n",
            m.redis_version,
            m.redis_clients_at_start.map(|c| c.to_string()).unwrap_or_else(|| "?".into())
        );
        s.push_str(&self.table());
        s.push_str(METHOD);
        s
    }
}

fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}

#[cfg(test)]
mod tests;
