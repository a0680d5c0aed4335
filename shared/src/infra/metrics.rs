//! CloudWatch Embedded Metric Format: one JSON line on stdout becomes metrics in Lambda.
//!
//! Namespace `Seckill`; the dimension is the function name. The alarms these feed are in
//! docs/deploy.md, "Alarms and the metrics that feed them".

use serde_json::{json, Map, Value};

/// Writes one EMF line with counters (unit `Count`) and extra properties for log search.
///
/// Inside Lambda (`AWS_LAMBDA_FUNCTION_NAME` is set) the line goes to stdout, where CloudWatch
/// turns it into metrics. Elsewhere (the dev server, tests, the demo) it is a debug-level
/// tracing event, so a local run's output stays readable.
pub fn emit(function: &str, counters: &[(&str, f64)], properties: &[(&str, Value)]) {
    let line = emf_line(
        function,
        counters,
        properties,
        chrono::Utc::now().timestamp_millis(),
    );
    if in_lambda() {
        println!("{line}");
    } else {
        tracing::debug!(target: "emf", "{line}");
    }
}

fn in_lambda() -> bool {
    static IN_LAMBDA: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *IN_LAMBDA.get_or_init(|| std::env::var_os("AWS_LAMBDA_FUNCTION_NAME").is_some())
}

/// The EMF document, separate from printing so it can be checked.
pub fn emf_line(
    function: &str,
    counters: &[(&str, f64)],
    properties: &[(&str, Value)],
    ts_ms: i64,
) -> String {
    let mut doc = Map::new();
    doc.insert(
        "_aws".into(),
        json!({
            "Timestamp": ts_ms,
            "CloudWatchMetrics": [{
                "Namespace": "Seckill",
                "Dimensions": [["Function"]],
                "Metrics": counters.iter().map(|(n, _)| json!({"Name": n, "Unit": "Count"})).collect::<Vec<_>>(),
            }],
        }),
    );
    doc.insert("Function".into(), Value::from(function));
    for (name, value) in counters {
        doc.insert((*name).into(), json!(value));
    }
    for (name, value) in properties {
        doc.insert((*name).into(), value.clone());
    }
    Value::Object(doc).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn emf_line_names_every_metric_it_carries() {
        let line = super::emf_line(
            "reconcile",
            &[("Drift", 3.0), ("Repairs", 1.0)],
            &[("activityId", 7.into())],
            1,
        );
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let names: Vec<_> = v["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["Name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(names, ["Drift", "Repairs"]);
        assert_eq!(v["Drift"], 3.0);
        assert_eq!(v["activityId"], 7);
    }
}
