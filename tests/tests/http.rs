//! The local dev server over real TCP: the entry and admin routers behind the JWT authorizer,
//! the queue poller and the consumer, against real Redis, PostgreSQL and the SQS emulator.
//!
//! Also the answers no route gives (404, 405) from both routers, in Lambda (the routers called
//! in-process) and behind the dev server, and the OpenAPI document it serves.
//!
//! Each test starts its own server on an ephemeral port with its own database, key prefix and
//! queue. Requests are written by hand on a `TcpStream` so nothing between the test and the
//! server (no client library) can add or fix up headers.

use seckill_devserver::{DevConfig, DevServer};
use seckill_shared::domain::activity::Activity;
use seckill_shared::http::auth::mint;
use seckill_shared::http::auth::{ADMIN_SCOPE, USER_SCOPE};
use seckill_shared::http::routes::{self, Auth};
use serde_json::Value;
use std::time::{Duration, Instant};
use testkit::RedisKind;
use testkit::TestEnv;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SECRET: &str = "http-test-secret";

async fn start(env: &TestEnv) -> DevServer {
    let mut dev = DevConfig::new(env.config.clone(), SECRET);
    dev.addr = ([127, 0, 0, 1], 0).into();
    dev.pollers = 2;
    dev.preheat_every = Some(Duration::from_secs(1));
    dev.reconcile_every = None;
    seckill_devserver::start(dev)
        .await
        .expect("the dev server starts against the local stack")
}

/// One HTTP/1.1 request on a fresh connection; returns the status and the JSON body.
async fn http(
    server: &DevServer,
    method: &str,
    path: &str,
    authorization: Option<&str>,
    body: &str,
) -> (u16, Value) {
    let (status, _, json) = http_with_head(server, method, path, authorization, body).await;
    (status, json)
}

/// [`http`], also returning the response head (status line and headers) as text.
async fn http_with_head(
    server: &DevServer,
    method: &str,
    path: &str,
    authorization: Option<&str>,
    body: &str,
) -> (u16, String, Value) {
    let mut stream = TcpStream::connect(server.addr()).await.expect("connect");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n",
        server.addr(),
        body.len()
    );
    if let Some(value) = authorization {
        req.push_str(&format!("Authorization: {value}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    stream.write_all(req.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .expect("the server answers within 10 s")
        .expect("read");
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status code");
    let json = if body.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_string()))
    };
    (status, head.to_string(), json)
}

fn bearer(user: &str, scope: &str) -> String {
    format!("Bearer {}", mint(SECRET, user, scope, 600).expect("mint"))
}

fn orders(a: &Activity) -> String {
    format!("/activities/{}/orders", a.id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purchase_with_a_real_token_is_accepted_and_the_poller_confirms_it() -> anyhow::Result<()> {
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let activity = env.open_activity(5, 1).await?;
    let server = start(&env).await;

    let (status, body) = http(
        &server,
        "POST",
        &orders(&activity),
        Some(&bearer("alice", USER_SCOPE)),
        r#"{"quantity": 1}"#,
    )
    .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["status"], "pending");
    let request_id: uuid::Uuid = body["requestId"].as_str().unwrap().parse().unwrap();

    // Nobody but the dev server's poller reads this test's queue: a confirmed row means it
    // received the message, ran the consumer and acknowledged it.
    let deadline = Instant::now() + Duration::from_secs(15);
    let order = loop {
        if let Some(o) = seckill_shared::domain::order::by_request(&env.pool, request_id).await? {
            break o;
        }
        assert!(Instant::now() < deadline, "no order within 15 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(order.user_id, "alice", "identity comes from the token");
    assert_eq!(order.activity_id, activity.id);
    assert_eq!(order.quantity, 1);

    let (status, mine) = http(
        &server,
        "GET",
        &format!("{}/me", orders(&activity)),
        Some(&bearer("alice", USER_SCOPE)),
        "",
    )
    .await;
    assert_eq!(status, 200, "{mine}");
    assert_eq!(mine["status"], "confirmed", "{mine}");

    // The poller deleted the message it handled: the queue is empty once the order exists.
    let left = env.drain_messages(10).await?;
    assert!(
        left.is_empty(),
        "{} message(s) left on the queue",
        left.len()
    );
    server.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purchase_without_a_token_is_unauthorized() -> anyhow::Result<()> {
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let activity = env.open_activity(5, 1).await?;
    let server = start(&env).await;

    let (status, body) = http(
        &server,
        "POST",
        &orders(&activity),
        None,
        r#"{"quantity":1}"#,
    )
    .await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"], "unauthorized");
    // A user id in the body is no identity either.
    let (status, _) = http(
        &server,
        "POST",
        &orders(&activity),
        None,
        r#"{"quantity":1,"userId":"mallory"}"#,
    )
    .await;
    assert_eq!(status, 401);
    server.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_with_a_bad_signature_or_no_bearer_scheme_are_unauthorized() -> anyhow::Result<()> {
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let activity = env.open_activity(5, 1).await?;
    let server = start(&env).await;

    let forged = format!(
        "Bearer {}",
        mint("some-other-secret", "alice", USER_SCOPE, 600)?
    );
    let expired = format!("Bearer {}", expired_token("alice"));
    let raw = mint(SECRET, "alice", USER_SCOPE, 600)?;
    for auth in [
        forged.as_str(),
        expired.as_str(),
        "Bearer not.a.jwt",
        raw.as_str(),
    ] {
        let (status, body) = http(
            &server,
            "POST",
            &orders(&activity),
            Some(auth),
            r#"{"quantity":1}"#,
        )
        .await;
        assert_eq!(status, 401, "{auth}: {body}");
        assert_eq!(body["error"], "unauthorized");
    }
    // Nothing was reserved by any of them.
    let stock = seckill_shared::store::view::stock(&env.redis, activity.id).await?;
    assert_eq!(stock, Some(5));
    server.shutdown().await?;
    Ok(())
}

/// As API Gateway's JWT authorizer checks the purchase route's `AuthorizationScopes`: a valid
/// token without `seckill:user` is refused 403 before the function runs (nothing reserved), and
/// the same buyer's token with it buys.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_token_without_the_user_scope_is_forbidden_to_buy_and_one_with_it_buys(
) -> anyhow::Result<()> {
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let activity = env.open_activity(5, 1).await?;
    let server = start(&env).await;

    for scope in ["", ADMIN_SCOPE, "seckill:users openid"] {
        let (status, body) = http(
            &server,
            "POST",
            &orders(&activity),
            Some(&bearer("alice", scope)),
            r#"{"quantity":1}"#,
        )
        .await;
        assert_eq!(status, 403, "scope {scope:?}: {body}");
        assert_error_body(&format!("scope {scope:?}"), &body, "forbidden");
    }
    let stock = seckill_shared::store::view::stock(&env.redis, activity.id).await?;
    assert_eq!(stock, Some(5), "nothing was reserved");

    let (status, body) = http(
        &server,
        "POST",
        &orders(&activity),
        Some(&bearer("alice", USER_SCOPE)),
        r#"{"quantity":1}"#,
    )
    .await;
    assert_eq!(status, 202, "{body}");
    server.shutdown().await?;
    Ok(())
}

/// A route's pattern with every `{param}` as `1`.
fn concrete(pattern: &str) -> String {
    pattern
        .split('/')
        .map(|seg| if seg.starts_with('{') { "1" } else { seg })
        .collect::<Vec<_>>()
        .join("/")
}

/// Every row of `functions/routes.toml`, behind the dev server: a JWT route answers 401 without
/// a token and 403 (the error JSON) to a token holding every scope but its own, and with one of
/// its scopes the request reaches the handler (whatever the handler then answers, here on a
/// database with no sale); a route without a token asks none (nor, locally, an IAM signature).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_route_asks_of_a_caller_what_its_row_says() -> anyhow::Result<()> {
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let server = start(&env).await;
    let scopes = [USER_SCOPE, ADMIN_SCOPE];
    let mut checked = 0;
    for (method, pattern, row) in routes::all() {
        let path = concrete(pattern);
        let refused = |status: u16| status == 401 || status == 403;
        if row.auth != Auth::Jwt {
            let (status, body) = http(&server, method, &path, None, "").await;
            assert!(
                !refused(status),
                "{method} {pattern} without a token: {status} {body}"
            );
            continue;
        }
        let (status, body) = http(&server, method, &path, None, "").await;
        assert_eq!(status, 401, "{method} {pattern} without a token: {body}");
        assert_error_body(&format!("{method} {pattern}"), &body, "unauthorized");

        let others: Vec<&str> = scopes
            .into_iter()
            .filter(|s| !row.scopes.iter().any(|r| r == s))
            .collect();
        let (status, body) = http(
            &server,
            method,
            &path,
            Some(&bearer("alice", &others.join(" "))),
            "",
        )
        .await;
        assert_eq!(status, 403, "{method} {pattern} with {others:?}: {body}");
        assert_error_body(&format!("{method} {pattern}"), &body, "forbidden");

        for scope in &row.scopes {
            let (status, body) =
                http(&server, method, &path, Some(&bearer("alice", scope)), "").await;
            assert!(
                !refused(status),
                "{method} {pattern} with {scope}: {status} {body}"
            );
        }
        checked += 1;
    }
    assert!(checked >= 9, "{checked} routes behind the JWT authorizer");
    server.shutdown().await?;
    Ok(())
}

fn expired_token(user: &str) -> String {
    use jsonwebtoken::{encode, EncodingKey, Header};
    let claims = seckill_shared::http::auth::Claims {
        sub: user.into(),
        scope: USER_SCOPE.into(),
        exp: 1_000_000_000,
        iat: 999_999_000,
    };
    encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_user_token_on_an_admin_route_is_forbidden_and_an_admin_token_creates(
) -> anyhow::Result<()> {
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let server = start(&env).await;
    let now = chrono::Utc::now();
    let body = serde_json::json!({
        "title": "http test sale",
        "totalStock": 10,
        "perOrderLimit": 1,
        "priceMinor": 1999,
        "currency": "usd",
        "startAt": (now + chrono::Duration::minutes(5)).to_rfc3339(),
        "endAt": (now + chrono::Duration::hours(1)).to_rfc3339(),
    })
    .to_string();

    let (status, resp) = http(
        &server,
        "POST",
        "/admin/activities",
        Some(&bearer("alice", USER_SCOPE)),
        &body,
    )
    .await;
    assert_eq!(status, 403, "{resp}");
    assert_eq!(resp["error"], "forbidden");

    let (status, resp) = http(&server, "POST", "/admin/activities", None, &body).await;
    assert_eq!(status, 401, "{resp}");

    let (status, resp) = http(
        &server,
        "POST",
        "/admin/activities",
        Some(&bearer("root", ADMIN_SCOPE)),
        &body,
    )
    .await;
    assert_eq!(status, 201, "{resp}");
    assert!(resp["id"].as_i64().is_some(), "{resp}");
    server.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_answers_ok_without_a_token() -> anyhow::Result<()> {
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let server = start(&env).await;
    let (status, body) = http(&server, "GET", "/health", None, "").await;
    assert_eq!(status, 200, "{body}");
    server.shutdown().await?;
    Ok(())
}

/// Requests no route takes, one row each: (method, path, status, code, `Allow` for a 405).
/// The first rows reach the entry router, the others the admin router.
#[rustfmt::skip]
const UNROUTED: &[(&str, &str, u16, &str, Option<&str>)] = &[
    ("GET", "/no/such/route", 404, "not_found", None),
    ("GET", "/activities", 404, "not_found", None),
    ("POST", "/orders/1", 404, "not_found", None),
    ("DELETE", "/health", 405, "method_not_allowed", Some("GET,HEAD")),
    ("GET", "/activities/1/orders", 405, "method_not_allowed", Some("POST")),
    ("PUT", "/activities/1", 405, "method_not_allowed", Some("GET,HEAD")),
    ("GET", "/orders/1/pay", 405, "method_not_allowed", Some("POST")),
    ("DELETE", "/orders/1/cancel", 405, "method_not_allowed", Some("POST")),
    ("GET", "/admin", 404, "not_found", None),
    ("GET", "/admin/activities/1/stats", 404, "not_found", None),
    ("DELETE", "/admin/activities", 405, "method_not_allowed", Some("GET,HEAD,POST")),
    ("PATCH", "/admin/activities/1", 405, "method_not_allowed", Some("GET,HEAD,PUT")),
];

/// The `Allow` header's methods, sorted, from a response head.
fn allow(head: &str) -> Option<String> {
    let line = head
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("allow:"))?;
    let mut methods: Vec<&str> = line[6..].split(',').map(str::trim).collect();
    methods.sort();
    Some(methods.join(","))
}

fn assert_error_body(what: &str, json: &Value, code: &str) {
    assert_eq!(json["error"], code, "{what}: {json}");
    assert!(
        json["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: a message says what is wrong: {json}"
    );
    assert_eq!(
        json.as_object().map(|o| o.len()),
        Some(2),
        "{what}: only error and message: {json}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unknown_paths_and_wrong_methods_answer_the_error_json_from_both_lambda_routers(
) -> anyhow::Result<()> {
    use tower::ServiceExt;
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let entry = env.entry_router();
    let admin = env.admin_router();
    for (router, name) in [(&entry, "entry"), (&admin, "admin")] {
        for (method, path, status, code, allowed) in UNROUTED {
            // Each Lambda sees only its own routes: every other path is its 404.
            let own = path.starts_with("/admin") == (name == "admin");
            let (status, code, allowed) = if own {
                (*status, *code, *allowed)
            } else {
                (404, "not_found", None)
            };
            let req = testkit::request(method, path, Some(("alice", ADMIN_SCOPE)), None);
            let resp = router.clone().oneshot(req).await?;
            let what = format!("{name}: {method} {path}");
            assert_eq!(resp.status().as_u16(), status, "{what}");
            let got_allow = resp.headers().get("allow").map(|v| {
                let mut m: Vec<&str> = v.to_str().unwrap().split(',').map(str::trim).collect();
                m.sort();
                m.join(",")
            });
            assert_eq!(got_allow.as_deref(), allowed, "{what}: Allow");
            assert_eq!(
                resp.headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok()),
                Some("application/json"),
                "{what}"
            );
            let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16).await?;
            let json: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            assert_error_body(&what, &json, code);
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unknown_paths_and_wrong_methods_answer_the_error_json_behind_the_dev_server(
) -> anyhow::Result<()> {
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let server = start(&env).await;
    let admin_token = bearer("root", ADMIN_SCOPE);
    for (method, path, status, code, allowed) in UNROUTED {
        for auth in [None, Some(admin_token.as_str())] {
            let (got, head, json) = http_with_head(&server, method, path, auth, "").await;
            let what = format!("{method} {path} (token: {})", auth.is_some());
            assert_eq!(got, *status, "{what}: {json}");
            assert_eq!(allow(&head).as_deref(), *allowed, "{what}: Allow in {head}");
            assert!(
                head.to_ascii_lowercase()
                    .contains("content-type: application/json"),
                "{what}: {head}"
            );
            assert_error_body(&what, &json, code);
        }
    }
    // The dev server's own route answers the same way.
    let (status, head, json) = http_with_head(&server, "POST", "/openapi.json", None, "").await;
    assert_eq!(status, 405, "{head}");
    assert_error_body("POST /openapi.json", &json, "method_not_allowed");
    server.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_dev_server_serves_the_generated_openapi_document() -> anyhow::Result<()> {
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let server = start(&env).await;
    let (status, head, served) = http_with_head(&server, "GET", "/openapi.json", None, "").await;
    assert_eq!(status, 200, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    let generated: Value =
        serde_json::from_str(&seckill_devserver::openapi::render()).expect("JSON");
    assert_eq!(served, generated);
    server.shutdown().await?;
    Ok(())
}
