//! What the storefront and operator pages rely on, over real TCP against a dev server on the
//! local stack: the pages and their assets (content types, `Cache-Control: no-cache`, no token
//! needed), `POST /dev/token`, `GET /health`'s clock, and `GET /admin/ops` (queue depth, the
//! purchase counters, reconcile's checks). The browser suite (`make test-browser`) drives the
//! pages themselves.

use seckill_devserver::{DevConfig, DevServer};
use seckill_shared::http::auth::{mint, JwtVerifier, ADMIN_SCOPE, USER_SCOPE};
use seckill_shared::Config;
use serde_json::Value;
use std::time::Duration;
use testkit::{RedisKind, TestEnv};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SECRET: &str = "storefront-test-secret";

async fn start(env: &TestEnv) -> DevServer {
    start_with(env.config.clone()).await
}

async fn start_with(config: Config) -> DevServer {
    let mut dev = DevConfig::new(config, SECRET);
    dev.addr = ([127, 0, 0, 1], 0).into();
    dev.pollers = 1;
    dev.preheat_every = None;
    dev.reconcile_every = None;
    seckill_devserver::start(dev)
        .await
        .expect("the dev server starts against the local stack")
}

/// One request on a fresh connection: the status, the head (lowercased) and the body.
async fn http(
    server: &DevServer,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, String, String) {
    let mut stream = TcpStream::connect(server.addr()).await.expect("connect");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n",
        server.addr(),
        body.len()
    );
    if let Some(token) = token {
        req.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    stream.write_all(req.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .expect("an answer within 10 s")
        .expect("read");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status code");
    (status, head.to_ascii_lowercase(), body.to_string())
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_pages_and_their_assets_are_served_without_a_token() -> anyhow::Result<()> {
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let server = start(&env).await;
    for (path, content_type, marker) in [
        ("/", "text/html; charset=utf-8", "/assets/app.js"),
        ("/index.html", "text/html; charset=utf-8", "aria-live"),
        ("/ops.html", "text/html; charset=utf-8", "/assets/ops.js"),
        (
            "/assets/app.js",
            "text/javascript; charset=utf-8",
            "/dev/token",
        ),
        (
            "/assets/ops.js",
            "text/javascript; charset=utf-8",
            "/admin/ops",
        ),
        (
            "/assets/storefront/card.js",
            "text/javascript; charset=utf-8",
            "confirmCardPayment",
        ),
        (
            "/assets/style.css",
            "text/css; charset=utf-8",
            ":focus-visible",
        ),
    ] {
        let (status, head, body) = http(&server, "GET", path, None, "").await;
        assert_eq!(status, 200, "{path}: {head}");
        assert!(
            head.contains(&format!("content-type: {content_type}")),
            "{path}: {head}"
        );
        assert!(head.contains("cache-control: no-cache"), "{path}: {head}");
        assert!(
            head.contains(&format!(
                "content-security-policy: {}\r\n",
                seckill_devserver::web::CONTENT_SECURITY_POLICY
            )),
            "{path}: the same-origin policy without Stripe: {head}"
        );
        assert!(body.contains(marker), "{path} has {marker}");
    }
    let (status, _, body) = http(&server, "GET", "/assets/missing.js", None, "").await;
    assert_eq!(
        (status, json(&body)["error"].as_str()),
        (404, Some("not_found"))
    );
    server.shutdown().await?;
    Ok(())
}

/// With the `stripe` provider the pages may load Stripe.js, show its frames and let it call its
/// API, from the configured origins only: localstripe's one here, and nothing of Stripe's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_stripe_the_pages_allow_the_origin_of_stripe_js_and_nothing_else() -> anyhow::Result<()>
{
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let mut config = env.config.clone();
    let fake = "http://127.0.0.1:8420";
    config.payments.provider = "stripe".into();
    config.payments.api_key = Some("sk_test_storefront".to_string().into());
    config.payments.api_base = fake.into();
    config.payments.js_url = format!("{fake}/js.stripe.com/v3/");
    let server = start_with(config).await;

    for path in ["/", "/assets/storefront/card.js"] {
        let (status, head, _) = http(&server, "GET", path, None, "").await;
        assert_eq!(status, 200, "{path}: {head}");
        let want = format!(
            "content-security-policy: default-src 'self'; script-src 'self' {fake}; \
             style-src 'self'; img-src 'self' data:; connect-src 'self' {fake}; frame-src {fake}; \
             base-uri 'none'; form-action 'self'; frame-ancestors 'none'\r\n"
        );
        assert!(head.contains(&want), "{path}: {head}");
    }
    server.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dev_token_signs_a_plain_name_as_make_token_does() -> anyhow::Result<()> {
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let server = start(&env).await;
    let verifier = JwtVerifier::new(SECRET)?;

    let (status, _, body) = http(&server, "POST", "/dev/token", None, r#"{"user":"alice"}"#).await;
    assert_eq!(status, 200, "{body}");
    let answer = json(&body);
    assert_eq!(answer["user"], "alice");
    let token = answer["token"].as_str().expect("a token");
    let claims = verifier.verify_header(Some(&format!("Bearer {token}")))?;
    assert_eq!(
        (claims.sub.as_str(), claims.scope.as_str()),
        ("alice", "seckill:user")
    );
    // A user token buys nothing on the admin routes.
    let (status, _, _) = http(&server, "GET", "/admin/ops", Some(token), "").await;
    assert_eq!(status, 403);

    let (status, _, body) = http(
        &server,
        "POST",
        "/dev/token",
        None,
        r#"{"user":"ops","admin":true}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let admin = json(&body)["token"].as_str().unwrap().to_string();
    let claims = verifier.verify_header(Some(&format!("Bearer {admin}")))?;
    assert_eq!(claims.scope, format!("seckill:user {ADMIN_SCOPE}"));
    let (status, _, body) = http(&server, "GET", "/admin/activities", Some(&admin), "").await;
    assert_eq!(status, 200, "{body}");

    for bad in [
        r#"{"user":""}"#,
        r#"{"user":"a b"}"#,
        r#"{"user":"<script>"}"#,
        r#"{"user":"alice","admin":"yes"}"#,
        r#"{"user":"alice","scope":"seckill:admin"}"#,
        r#"{"admin":true}"#,
        "not json",
    ] {
        let (status, _, body) = http(&server, "POST", "/dev/token", None, bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert_eq!(json(&body)["error"], "bad_request", "{bad}");
    }
    server.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_tells_the_server_clock_and_is_never_cached() -> anyhow::Result<()> {
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let server = start(&env).await;
    let before = chrono::Utc::now();
    let (status, head, body) = http(&server, "GET", "/health", None, "").await;
    let after = chrono::Utc::now();
    assert_eq!(status, 200, "{body}");
    assert!(head.contains("cache-control: no-store"), "{head}");
    let health = json(&body);
    assert_eq!(health["status"], "ok");
    let told = health["serverTime"].as_str().expect("serverTime");
    // RFC 3339, UTC, milliseconds: 2026-12-01T12:00:00.123Z.
    assert_eq!(told.len(), 24, "{told}");
    assert!(told.ends_with('Z') && told.as_bytes()[19] == b'.', "{told}");
    let at = chrono::DateTime::parse_from_rfc3339(told)?;
    let slack = chrono::Duration::milliseconds(1);
    assert!(at >= before - slack && at <= after + slack, "{told}");
    server.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ops_counts_purchases_and_shows_the_queue_and_reconcile() -> anyhow::Result<()> {
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let activity = env.open_activity(5, 1).await?;
    let server = start(&env).await;
    let admin = mint(SECRET, "ops", ADMIN_SCOPE, 600)?;
    let alice = mint(SECRET, "alice", USER_SCOPE, 600)?;

    let (status, _, body) = http(&server, "GET", "/admin/ops", Some(&admin), "").await;
    assert_eq!(status, 200, "{body}");
    let ops = json(&body);
    assert_eq!(ops["counters"]["purchasesAccepted"], 0, "{ops}");
    assert!(
        ops["queue"]["visible"].is_i64(),
        "the queue answered: {ops}"
    );
    assert!(ops["queue"]["inFlight"].is_i64(), "{ops}");
    assert!(
        ops["now"].as_str().is_some_and(|n| n.ends_with('Z')),
        "{ops}"
    );

    let orders = format!("/activities/{}/orders", activity.id);
    let (status, _, _) = http(&server, "POST", &orders, Some(&alice), "{}").await;
    assert_eq!(status, 202);
    let (status, _, _) = http(&server, "POST", &orders, Some(&alice), "{}").await;
    assert_eq!(status, 409, "already purchased");
    let (status, _, _) = http(&server, "POST", &orders, None, "{}").await;
    assert_eq!(status, 401);
    // Not a purchase: not counted.
    let (status, _, _) = http(&server, "GET", &format!("{orders}/me"), Some(&alice), "").await;
    assert_eq!(status, 200);

    server.functions().reconcile(chrono::Utc::now()).await?;
    let (status, _, body) = http(&server, "GET", "/admin/ops", Some(&admin), "").await;
    assert_eq!(status, 200, "{body}");
    let ops = json(&body);
    let counters = &ops["counters"];
    assert_eq!(
        (
            &counters["purchasesAccepted"],
            &counters["purchasesRefused"],
            &counters["purchasesUnavailable"],
            &counters["purchasesFailed"],
        ),
        (&1.into(), &2.into(), &0.into(), &0.into()),
        "{ops}"
    );
    let checks = ops["reconcile"].as_array().expect("reconcile rows");
    let check = checks
        .iter()
        .find(|c| c["activityId"] == activity.id)
        .unwrap_or_else(|| panic!("reconcile checked sale {}: {ops}", activity.id));
    assert_eq!(check["drift"], 0, "{check}");
    assert!(
        check["repairs"].is_i64() && check["checkedAt"].is_string(),
        "{check}"
    );

    let (status, _, body) = http(&server, "GET", "/admin/ops", None, "").await;
    assert_eq!(
        (status, json(&body)["error"].as_str()),
        (401, Some("unauthorized"))
    );
    server.shutdown().await?;
    Ok(())
}

/// The local provider end to end over TCP: a purchase, `POST …/pay` (pays nothing), then
/// `POST <completeUrl>`, which sends the webhook a signed event: the order reads `paid`. A
/// second completion pays nothing more; an unknown payment is 404; the webhook itself refuses
/// an unsigned event.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_buyer_pays_through_the_local_provider() -> anyhow::Result<()> {
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let activity = env.open_activity(5, 1).await?;
    let server = start(&env).await;
    let alice = mint(SECRET, "alice", USER_SCOPE, 600)?;
    let orders = format!("/activities/{}/orders", activity.id);
    let (status, _, _) = http(&server, "POST", &orders, Some(&alice), "{}").await;
    assert_eq!(status, 202);
    let me = format!("{orders}/me");
    let mut order = Value::Null;
    for _ in 0..200 {
        order = json(&http(&server, "GET", &me, Some(&alice), "").await.2);
        if order["status"] == "confirmed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(order["status"], "confirmed", "{order}");

    let pay = format!("/orders/{}/pay", order["orderId"]);
    let (status, _, body) = http(&server, "POST", &pay, Some(&alice), "").await;
    assert_eq!(status, 200, "{body}");
    let payment = json(&body);
    assert_eq!(
        json(&http(&server, "GET", &me, Some(&alice), "").await.2)["status"],
        "confirmed"
    );
    let complete = payment["completeUrl"]
        .as_str()
        .expect("a completeUrl")
        .to_string();

    let (status, _, body) = http(&server, "POST", &complete, None, "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["outcome"], "paid", "{body}");
    assert_eq!(
        json(&http(&server, "GET", &me, Some(&alice), "").await.2)["status"],
        "paid"
    );
    let (status, _, body) = http(&server, "POST", &complete, None, "").await;
    assert_eq!(
        (status, json(&body)["outcome"].as_str()),
        (200, Some("already_paid"))
    );

    let (status, _, _) = http(
        &server,
        "POST",
        "/payments/local/pi_local_987654/complete",
        None,
        "",
    )
    .await;
    assert_eq!(status, 404);
    let (status, _, _) = http(&server, "POST", "/payments/local/evil/complete", None, "").await;
    assert_eq!(status, 404);
    let (status, _, body) = http(
        &server,
        "POST",
        "/payments/webhook",
        None,
        r#"{"id":"evt_x"}"#,
    )
    .await;
    assert_eq!(
        (status, json(&body)["error"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );
    Ok(())
}
