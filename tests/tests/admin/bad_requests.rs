//! Bad admin requests, one row each: refused with their status and code, and nothing changed.

use crate::{db_activity, setup, ADMIN, USER};
use admin::router;
use axum::http::StatusCode;
use axum::Router;
use chrono::{Duration as ChronoDuration, Utc};
use serde_json::{json, Value};
use testkit::call;
use testkit::request;
use testkit::RedisKind;

/// Every way to get an admin request wrong, through the router; none of them changes the DB.
/// One refused admin request: method, path, token, body, status, error code.
type BadRequest<'a> = (
    &'a str,
    String,
    Option<(&'a str, &'a str)>,
    Option<String>,
    u16,
    &'a str,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_admin_requests_are_refused_and_change_nothing() -> anyhow::Result<()> {
    let (env, state) = setup(RedisKind::Standalone, 2000, 500).await;
    let app: Router = router(state);
    let now = Utc::now();
    let start = (now + ChronoDuration::hours(1)).to_rfc3339();
    let end = (now + ChronoDuration::hours(2)).to_rfc3339();
    let valid = json!({"title": "Phones", "totalStock": 10, "perOrderLimit": 2, "priceMinor": 1999, "currency": "usd",
                       "startAt": start, "endAt": end});

    // Arrange: one good activity.
    let (status, created) = call(
        &app,
        request(
            "POST",
            "/admin/activities",
            Some(ADMIN),
            Some(&valid.to_string()),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["id"].as_i64().unwrap();
    assert_eq!(created["totalStock"], json!(10));
    assert_eq!(created["remainingStock"], json!(10));
    assert_eq!(created["perOrderLimit"], json!(2));
    assert_eq!(created["configVersion"], json!(1));
    assert_eq!(
        created["perUserRatePerSec"],
        json!(10),
        "a sale that names no rate gets the default one"
    );
    assert_eq!(
        (&created["priceMinor"], &created["currency"]),
        (&json!(1999), &json!("usd"))
    );
    let path = format!("/admin/activities/{id}");
    let before = db_activity(&env, id).await;

    // Every refused request, one row each: method, path, token, body, status, code.
    let unknown = format!("/admin/activities/{}", id + 1000);
    let (p, u) = (path.as_str(), unknown.as_str());
    let oversized = format!("{{\"title\": \"{}\"}}", "x".repeat(5000));
    let body = valid.to_string();
    let v = Some(body.as_str());
    let t = Some(r#"{"title":"x"}"#);
    let (bad, none, auth, forbidden) = (400, 404, 401, 403);
    #[rustfmt::skip]
    let mut cases: Vec<BadRequest> = [
        ("POST", "/admin/activities", None, v, auth, "unauthorized"),
        ("GET", "/admin/activities", None, v, auth, "unauthorized"),
        ("GET", p, None, v, auth, "unauthorized"),
        ("PUT", p, None, v, auth, "unauthorized"),
        ("POST", "/admin/activities", Some(USER), v, forbidden, "forbidden"),
        ("GET", "/admin/activities", Some(USER), v, forbidden, "forbidden"),
        ("GET", p, Some(USER), v, forbidden, "forbidden"),
        ("PUT", p, Some(USER), v, forbidden, "forbidden"),
        ("PUT", p, Some(ADMIN), Some(""), bad, "bad_request"),
        ("PUT", p, Some(ADMIN), Some("{}"), bad, "bad_request"),
        ("PUT", p, Some(ADMIN), Some("{\"title\": "), bad, "bad_request"),
        ("PUT", p, Some(ADMIN), Some("[1,2]"), bad, "bad_request"),
        ("PUT", p, Some(ADMIN), Some(oversized.as_str()), bad, "bad_request"),
        ("POST", "/admin/activities", Some(ADMIN), Some("{\"title\": \"x\"}"), bad, "bad_request"),
        ("GET", "/admin/activities/abc", Some(ADMIN), None, bad, "bad_request"),
        ("GET", "/admin/activities/0", Some(ADMIN), None, bad, "bad_request"),
        ("GET", "/admin/activities/-1", Some(ADMIN), None, bad, "bad_request"),
        ("PUT", "/admin/activities/abc", Some(ADMIN), t, bad, "bad_request"),
        ("PUT", "/admin/activities/0", Some(ADMIN), t, bad, "bad_request"),
        ("PUT", "/admin/activities/-1", Some(ADMIN), t, bad, "bad_request"),
        ("GET", u, Some(ADMIN), None, none, "not_found"),
        ("PUT", u, Some(ADMIN), t, none, "not_found"),
        ("GET", "/admin/activities?limit=0", Some(ADMIN), None, bad, "bad_request"),
        ("GET", "/admin/activities?limit=101", Some(ADMIN), None, bad, "bad_request"),
        ("GET", "/admin/activities?limit=abc", Some(ADMIN), None, bad, "bad_request"),
        ("GET", "/admin/activities?offset=-1", Some(ADMIN), None, bad, "bad_request"),
        ("GET", "/admin/activities?offset=x", Some(ADMIN), None, bad, "bad_request"),
        ("GET", "/admin/activities?page=2", Some(ADMIN), None, bad, "bad_request"),
    ]
    .into_iter()
    .map(|(m, p, who, b, status, code)| (m, p.to_string(), who, b.map(String::from), status, code))
    .collect();

    // Bad fields, one row each, tried on create (merged into a valid body) and on update.
    let bad_fields: Vec<Value> = vec![
        json!({"title": ""}),
        json!({"title": "   "}),
        json!({"title": "x".repeat(201)}),
        json!({"totalStock": 0}),
        json!({"totalStock": -5}),
        json!({"totalStock": 1_000_000_000_000i64}),
        json!({"totalStock": "10"}),
        json!({"perOrderLimit": 0}),
        json!({"startAt": end, "endAt": start}),
        json!({"startAt": start, "endAt": start}),
        json!({"startAt": "tomorrow at noon"}),
        json!({"title": "a\u{0}b"}),
        json!({"title": "a\nb"}),
        json!({"startAt": "1969-12-31T23:59:59Z"}),
        json!({"endAt": "9999-12-31T23:59:59-23:59"}),
        json!({"price": 10}),
        json!({"priceMinor": 0}),
        json!({"priceMinor": 100_000_000}),
        json!({"currency": "dollars"}),
        json!({"currency": "u$d"}),
    ];
    for field in bad_fields {
        let mut create = valid.clone();
        for (k, v) in field.as_object().unwrap() {
            create[k] = v.clone();
        }
        let admin = Some(ADMIN);
        cases.push((
            "POST",
            "/admin/activities".into(),
            admin,
            Some(create.to_string()),
            bad,
            "bad_request",
        ));
        cases.push((
            "PUT",
            path.clone(),
            admin,
            Some(field.to_string()),
            bad,
            "bad_request",
        ));
    }

    for (method, p, who, body, want_status, want_code) in cases {
        let (status, json) = call(&app, request(method, &p, who, body.as_deref())).await;
        let shown = body.as_deref().map(|b| &b[..b.len().min(60)]);
        assert_eq!(
            status.as_u16(),
            want_status,
            "{method} {p} {shown:?}: {json}"
        );
        assert_eq!(
            json["error"],
            json!(want_code),
            "{method} {p} {shown:?}: {json}"
        );
        assert!(
            json["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{method} {p}: a message says what is wrong"
        );
    }

    // Nothing changed: one activity, exactly as created.
    let count: i64 = sqlx::query_scalar("select count(*) from activities")
        .fetch_one(&env.pool)
        .await?;
    assert_eq!(count, 1);
    let after = db_activity(&env, id).await;
    assert_eq!(
        (
            after.title,
            after.total_stock,
            after.config_version,
            after.last_fence_token
        ),
        (before.title, before.total_stock, 1, before.last_fence_token)
    );

    // The good paths still answer.
    let (status, page) = call(&app, request("GET", "/admin/activities", Some(ADMIN), None)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (page["limit"].clone(), page["offset"].clone()),
        (json!(20), json!(0))
    );
    assert_eq!(page["items"][0]["id"], json!(id));
    let (status, page) = call(
        &app,
        request(
            "GET",
            "/admin/activities?limit=1&offset=1",
            Some(ADMIN),
            None,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["items"], json!([]));
    let (status, updated) = call(
        &app,
        request("PUT", &path, Some(ADMIN), Some("{\"perOrderLimit\": 3}")),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{updated}");
    assert_eq!(updated["perOrderLimit"], json!(3));
    assert_eq!(updated["title"], json!("Phones"));
    assert_eq!(updated["configVersion"], json!(2));
    Ok(())
}
