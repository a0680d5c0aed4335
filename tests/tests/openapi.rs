//! The OpenAPI document (`docs/openapi.json`): the committed copy is what the code generates,
//! and what it says holds for every operation (error bodies, security, references).
//!
//! The document is generated from the handlers by `seckill_devserver::openapi`; `make openapi`
//! rewrites the committed copy.

use seckill_shared::http::auth::{ADMIN_SCOPE, USER_SCOPE};
use seckill_shared::http::routes::{self, Auth};
use seckill_shared::ApiError;
use serde_json::Value;

const COMMITTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json");

fn document() -> Value {
    serde_json::from_str(&seckill_devserver::openapi::render()).expect("the document is JSON")
}

/// Every (method, path, operation) of the document.
fn operations(doc: &Value) -> Vec<(String, String, Value)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("a path item") {
            out.push((method.to_uppercase(), path.clone(), op.clone()));
        }
    }
    out
}

#[test]
fn the_committed_document_is_the_generated_one() {
    let generated = seckill_devserver::openapi::render();
    let committed = std::fs::read_to_string(COMMITTED).unwrap_or_default();
    if committed != generated {
        let first = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(generated.lines().count()));
        panic!(
            "docs/openapi.json is stale (first difference at line {}): run `make openapi` and \
             commit docs/openapi.json",
            first + 1
        );
    }
}

#[test]
fn every_route_of_both_routers_is_documented() {
    let doc = document();
    let mut documented: Vec<String> = operations(&doc)
        .into_iter()
        .map(|(method, path, _)| format!("{method} {path}"))
        .collect();
    documented.sort();
    let expected = [
        "GET /activities/{activityId}",
        "GET /activities/{activityId}/orders/me",
        "GET /admin/activities",
        "GET /admin/activities/{activityId}",
        "GET /admin/ops",
        "GET /health",
        "GET /health/deep",
        "POST /activities/{activityId}/orders",
        "POST /admin/activities",
        "POST /orders/{orderId}/cancel",
        "POST /orders/{orderId}/pay",
        "POST /payments/webhook",
        "PUT /admin/activities/{activityId}",
    ];
    assert_eq!(documented, expected);
    assert_eq!(doc["openapi"], "3.1.0");
}

#[test]
fn every_error_status_answers_the_error_body() {
    let doc = document();
    for (method, path, op) in operations(&doc) {
        for (status, response) in op["responses"].as_object().expect("responses") {
            let schema = &response["content"]["application/json"]["schema"];
            if status.starts_with('2') {
                assert!(!schema.is_null(), "{method} {path} {status}: no JSON body");
            } else {
                assert_eq!(
                    schema["$ref"], "#/components/schemas/ErrorBody",
                    "{method} {path} {status}: not the error body"
                );
            }
        }
    }
}

#[test]
fn the_error_codes_are_the_ones_the_code_answers() {
    let doc = document();
    let listed = &doc["components"]["schemas"]["ErrorBody"]["properties"]["error"]["enum"];
    let codes: Vec<&str> = ApiError::codes()
        .into_iter()
        .map(|(_, code)| code)
        .collect();
    assert_eq!(listed, &serde_json::json!(codes));
}

#[test]
fn each_operation_asks_for_what_its_route_s_row_says() {
    let doc = document();
    assert_eq!(doc["security"], serde_json::json!([{"bearer": []}]));
    let schemes = &doc["components"]["securitySchemes"];
    assert_eq!(
        schemes["bearer"],
        serde_json::json!({
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "JWT",
            "description": schemes["bearer"]["description"],
        })
    );
    assert_eq!(schemes["sigv4"]["type"], "apiKey");
    assert_eq!(schemes["sigv4"]["in"], "header");
    assert_eq!(schemes["sigv4"]["name"], "Authorization");
    for (method, path, op) in operations(&doc) {
        let row = routes::route(&method, &path)
            .unwrap_or_else(|| panic!("{method} {path}: no row in functions/routes.toml"));
        let responses = &op["responses"];
        let what = format!("{method} {path}");
        match row.auth {
            Auth::None => {
                assert_eq!(op["security"], serde_json::json!([{}]), "{what}");
                assert!(responses["401"].is_null(), "{what} documents 401");
            }
            Auth::Iam => {
                assert_eq!(op["security"], serde_json::json!([{"sigv4": []}]), "{what}");
                assert!(responses["401"].is_null(), "{what} documents 401");
            }
            Auth::Jwt => {
                assert_eq!(
                    op["security"],
                    serde_json::json!([{ "bearer": row.scopes }]),
                    "{what}"
                );
                assert!(!responses["401"].is_null(), "{what}: no 401");
                assert_eq!(
                    !responses["403"].is_null(),
                    !row.scopes.is_empty(),
                    "{what}: a 403 for a token without the route's scope"
                );
            }
        }
    }
    // The user routes need the user scope, the admin routes the admin scope.
    let purchase = &doc["paths"]["/activities/{activityId}/orders"]["post"];
    assert_eq!(
        purchase["security"],
        serde_json::json!([{"bearer": [USER_SCOPE]}])
    );
    let ops = &doc["paths"]["/admin/ops"]["get"];
    assert_eq!(
        ops["security"],
        serde_json::json!([{"bearer": [ADMIN_SCOPE]}])
    );
}

#[test]
fn every_reference_names_a_schema_of_the_document() {
    fn refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
        match v {
            Value::Object(map) => {
                if let Some(Value::String(r)) = map.get("$ref") {
                    out.push(r);
                }
                map.values().for_each(|v| refs(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let doc = document();
    let mut found = Vec::new();
    refs(&doc, &mut found);
    assert!(!found.is_empty());
    for r in found {
        let name = r
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("{r}: not a schema reference"));
        assert!(
            doc["components"]["schemas"][name].is_object(),
            "{r} does not resolve"
        );
    }
}

#[test]
fn the_documented_bounds_are_the_validated_ones() {
    use seckill_shared::domain::settings::MAX_DRAW_WINDOW_MS;
    use seckill_shared::domain::settings::MAX_PER_ORDER_LIMIT;
    use seckill_shared::domain::settings::MAX_RATE_PER_SEC;
    use seckill_shared::domain::settings::MAX_TOTAL_STOCK;
    let doc = document();
    let schemas = &doc["components"]["schemas"];
    for schema in ["NewActivity", "ActivityPatch"] {
        let p = &schemas[schema]["properties"];
        assert_eq!(p["totalStock"]["maximum"], MAX_TOTAL_STOCK, "{schema}");
        assert_eq!(
            p["perOrderLimit"]["maximum"], MAX_PER_ORDER_LIMIT,
            "{schema}"
        );
        assert_eq!(p["title"]["maxLength"], 200, "{schema}");
        assert_eq!(
            p["buckets"]["maximum"],
            seckill_shared::domain::settings::MAX_BUCKETS,
            "{schema}"
        );
        assert_eq!(p["buckets"]["minimum"], 1, "{schema}");
        assert_eq!(p["drawWindowMs"]["maximum"], MAX_DRAW_WINDOW_MS, "{schema}");
        assert_eq!(p["drawWindowMs"]["minimum"], 1, "{schema}");
        assert_eq!(
            p["perUserRatePerSec"]["maximum"], MAX_RATE_PER_SEC,
            "{schema}"
        );
        assert_eq!(p["perUserRatePerSec"]["minimum"], 0, "{schema}");
        assert_eq!(
            p["maxEntrants"]["maximum"],
            seckill_shared::domain::settings::MAX_MAX_ENTRANTS,
            "{schema}"
        );
        assert_eq!(p["maxEntrants"]["minimum"], 1, "{schema}");
    }
    assert_eq!(
        schemas["PurchaseBody"]["properties"]["quantity"]["maximum"],
        MAX_PER_ORDER_LIMIT
    );
}
