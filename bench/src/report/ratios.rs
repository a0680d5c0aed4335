//! The ratios between figures of one run: computed once (results.json keeps them) and printed
//! as a table beside the goal each one is held to.

use super::round;
use crate::buckets::BucketRow;
use crate::consumer::ConsumerResults;
use crate::entry::EntryResults;
use crate::results::Results;
use crate::scripts::ScriptRow;
use crate::strategies::Row;
use serde_json::{json, Map, Value};
use std::fmt::Write;

/// Every ratio, in the order the table prints them, with its goal (or what it shows).
const GOALS: [(&str, &str); 20] = [
    (
        "entryVsLimit",
        "≥ 0.95 (router + handler ÷ the bare script, 64 at once; requests built beforehand)",
    ),
    (
        "entryVsLimitWithRequestBuild",
        "(each attempt also builds its API Gateway-shaped request)",
    ),
    ("soldOutCacheVsLimit", "≥ 5 (requests built beforehand)"),
    (
        "soldOutCacheVsLimitWithRequestBuild",
        "(each attempt also builds its request)",
    ),
    ("acceptedVsSqs", "(shows our overhead over the emulator)"),
    ("consumerVsBaseline", "≥ 2"),
    (
        "consumerBatchVsBareInserts",
        "≥ 1.0 (batch path ÷ one autocommit single-row INSERT per order, same connections)",
    ),
    (
        "scriptServerCostVsCombinedSuccessHeavy",
        "≤ 1.5 (server µs per call, ours ÷ the combined check-and-set script)",
    ),
    ("scriptServerCostVsCombinedFailureHeavy", "≤ 1.5"),
    (
        "publicViewVsSoldOut",
        "≥ 0.9 (HTTP dev server, same concurrency: public view ÷ cached sold-out purchases)",
    ),
    (
        "publicViewDbTxPerRequest",
        "≤ 0.01 (database transactions per public view request)",
    ),
    ("luaVsHincrbyFailureHeavy", "≥ 1.0"),
    ("luaVsLock", "(success-heavy)"),
    ("luaVsLockFailureHeavy", ""),
    ("luaVsHincrbySuccessHeavy", ""),
    (
        "luaVsLimit",
        "(success-heavy: cost of the application around the script)",
    ),
    ("luaVsLimitFailureHeavy", ""),
    ("luaVsDbOnly", "(success-heavy)"),
    ("httpEntryVsTrivial", "(reported)"),
    (
        "bucketsThreeVsOne",
        "≥ 1.0 (attempts/s of one hot sale on the cluster, 3 buckets ÷ 1; its three nodes and the bench share this machine's cores: the CPU table under the buckets table)",
    ),
];

/// All ratios of `results` (rounded to 3 digits), `null` where a side was not measured.
pub fn measured(results: &Results) -> Map<String, Value> {
    let mut ratios = entry(results.entry.as_ref());
    let consumer = |ratio: fn(&ConsumerResults) -> f64| {
        results
            .consumer
            .as_ref()
            .map_or(Value::Null, |c| json!(round(ratio(c), 3)))
    };
    ratios.insert(
        "consumerVsBaseline".into(),
        consumer(|c| c.consumer_vs_baseline),
    );
    ratios.insert(
        "consumerBatchVsBareInserts".into(),
        consumer(|c| c.consumer_batch_vs_bare_inserts),
    );
    ratios.extend(strategies(&results.rows));
    ratios.extend(scripts(&results.scripts));
    ratios.insert("bucketsThreeVsOne".into(), buckets(&results.buckets));
    ratios
}

/// One hot sale's attempts/s with its stock in 3 buckets against 1.
fn buckets(rows: &[BucketRow]) -> Value {
    let rate = |n: u32| {
        rows.iter()
            .find(|r| r.buckets == n)
            .map(|r| r.attempts_per_s)
    };
    div(rate(3), rate(1))
}

/// Our purchase script's server time per call against the combined GET/SISMEMBER/DECR/SADD
/// script's, under each workload.
fn scripts(rows: &[ScriptRow]) -> Map<String, Value> {
    let cost = |script: &str, wl: &str| {
        rows.iter()
            .find(|r| r.script == script && r.workload == wl)
            .and_then(|r| r.server_us_per_call)
    };
    let mut ratios = Map::new();
    for (key, wl) in [
        ("scriptServerCostVsCombinedSuccessHeavy", "success-heavy"),
        ("scriptServerCostVsCombinedFailureHeavy", "failure-heavy"),
    ] {
        ratios.insert(key.into(), div(cost("ours", wl), cost("combined", wl)));
    }
    ratios
}

/// The entry section's ratios, as it measured them.
fn entry(e: Option<&EntryResults>) -> Map<String, Value> {
    let ratio = |v: Option<f64>| v.map_or(Value::Null, |v| json!(round(v, 3)));
    let mut ratios = Map::new();
    ratios.insert("entryVsLimit".into(), ratio(e.map(|e| e.entry_vs_limit)));
    ratios.insert(
        "entryVsLimitWithRequestBuild".into(),
        ratio(e.map(|e| e.entry_vs_limit_with_request_build)),
    );
    ratios.insert(
        "soldOutCacheVsLimitWithRequestBuild".into(),
        ratio(e.map(|e| e.sold_out_cache_vs_limit_with_request_build)),
    );
    ratios.insert(
        "soldOutCacheVsLimit".into(),
        ratio(e.map(|e| e.sold_out_cache_vs_limit)),
    );
    ratios.insert(
        "acceptedVsSqs".into(),
        ratio(e.and_then(|e| e.accepted_vs_sqs)),
    );
    ratios.insert(
        "httpEntryVsTrivial".into(),
        ratio(e.and_then(|e| e.http_entry_vs_trivial)),
    );
    let view = e.and_then(|e| e.view.as_ref());
    ratios.insert(
        "publicViewVsSoldOut".into(),
        ratio(view.map(|v| v.view_vs_sold_out)),
    );
    ratios.insert(
        "publicViewDbTxPerRequest".into(),
        view.map_or(Value::Null, |v| {
            json!(round(v.db_transactions_per_request, 4))
        }),
    );
    ratios.insert(
        "publicViewUnknownIdsDbTxPerRequest".into(),
        view.map_or(Value::Null, |v| {
            json!(round(v.unknown_db_transactions_per_request, 4))
        }),
    );
    ratios
}

/// `lua` against each other strategy, by attempts/s under the same workload.
fn strategies(rows: &[Row]) -> Map<String, Value> {
    let (sh, fh) = ("success-heavy", "failure-heavy");
    let vs = |other: &str, wl: &str| div(rate(rows, "lua", wl), rate(rows, other, wl));
    let mut ratios = Map::new();
    ratios.insert("luaVsHincrbyFailureHeavy".into(), vs("hincrby", fh));
    ratios.insert("luaVsLock".into(), vs("lock", sh));
    ratios.insert("luaVsLockFailureHeavy".into(), vs("lock", fh));
    ratios.insert("luaVsHincrbySuccessHeavy".into(), vs("hincrby", sh));
    ratios.insert("luaVsLimit".into(), vs("limit", sh));
    ratios.insert("luaVsLimitFailureHeavy".into(), vs("limit", fh));
    ratios.insert("luaVsDbOnly".into(), vs("db-only", sh));
    ratios
}

fn rate(rows: &[Row], name: &str, wl: &str) -> Option<f64> {
    rows.iter()
        .find(|r| r.name == name && r.workload == wl)
        .map(|r| r.attempts_per_s)
}

fn div(a: Option<f64>, b: Option<f64>) -> Value {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => json!(round(a / b, 3)),
        _ => Value::Null,
    }
}

pub fn table(s: &mut String, ratios: &Map<String, Value>) {
    s.push_str(
        "Ratios (each measured in this run; a goal missed is explained under \"Goals missed\" at the end)\n\n| ratio | value | goal | met |\n|---|---:|---|---|\n",
    );
    for (key, goal) in GOALS {
        let value = ratios.get(key).and_then(Value::as_f64);
        let met = match value.and_then(|v| met(goal, v)) {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "",
        };
        let _ = writeln!(s, "| {key} | {} | {goal} | {met} |", shown(ratios, key));
    }
    s.push('\n');
}

/// Whether `value` meets a goal written `≥ x …` or `≤ x …`; `None` for a figure only reported.
fn met(goal: &str, value: f64) -> Option<bool> {
    let threshold = |rest: &str| rest.split_whitespace().next()?.parse::<f64>().ok();
    if let Some(rest) = goal.strip_prefix("≥ ") {
        return Some(value >= threshold(rest)?);
    }
    if let Some(rest) = goal.strip_prefix("≤ ") {
        return Some(value <= threshold(rest)?);
    }
    None
}

fn shown(ratios: &Map<String, Value>, key: &str) -> String {
    match ratios.get(key).and_then(Value::as_f64) {
        // A count per request, not a ratio of two rates.
        Some(v) if key.ends_with("PerRequest") => format!("{v:.4}"),
        Some(v) => format!("{v:.2}×"),
        None => "not measured".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::met;

    #[test]
    fn a_goal_is_met_on_its_side_of_the_threshold_and_a_reported_figure_has_none() {
        assert_eq!(met("≥ 0.95 (router + handler)", 0.95), Some(true));
        assert_eq!(met("≥ 0.95 (router + handler)", 0.94), Some(false));
        assert_eq!(met("≤ 0.01 (per request)", 0.0019), Some(true));
        assert_eq!(met("≤ 1.2", 3.3), Some(false));
        assert_eq!(met("(success-heavy)", 40.0), None);
        assert_eq!(met("", 1.0), None);
    }
}
