//! Stripe: its own Python library signs and verifies the same scheme, and the Stripe provider
//! starts one payment intent per order against a recording server.

use crate::{amount, world, World};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use seckill_shared::domain::payment;
use serde_json::Value;
use testkit::{self, call, request};

/// Runs `tests/stripe/cross_check.py` (Stripe's Python library, which `scripts/stack.sh`
/// installs into the venv) with `args`, `input` on its stdin: its exit status and stdout.
fn stripe_library(args: &[&str], input: &str) -> (bool, String) {
    use std::io::Write;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut child = std::process::Command::new(root.join(".tools/venv/bin/python"))
        .arg(root.join("tests/stripe/cross_check.py"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the venv's python (bash scripts/stack.sh installs it, with stripe)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8(out.stdout).unwrap())
}

/// The signature scheme is Stripe's, proven by Stripe's own library both ways: it accepts the
/// header our signer (the local provider's) makes and refuses it on a changed body, and our
/// webhook pays an event whose header Stripe's library made.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stripes_own_library_signs_and_verifies_the_same_scheme() -> anyhow::Result<()> {
    let w = world().await;
    let id = w.confirmed("alice", 1).await;
    let (_, started) = w.start_pay(id, "alice").await;
    let secret = w.secret();

    let ours = w.event("evt_ours", &started, amount(&started));
    let header = ours.headers()["stripe-signature"].to_str()?.to_string();
    let body = axum::body::to_bytes(ours.into_body(), 1 << 20).await?;
    let body = String::from_utf8(body.to_vec())?;
    let given = |body: &str| serde_json::json!({"body": body, "header": header}).to_string();
    assert!(
        stripe_library(&["verify", &secret], &given(&body)).0,
        "Stripe accepts ours"
    );
    let changed = body.replace("evt_ours", "evt_changed");
    assert!(
        !stripe_library(&["verify", &secret], &given(&changed)).0,
        "and refuses a change"
    );

    let (signed, stripes) = stripe_library(&["sign", &secret], &changed);
    assert!(signed);
    let req = Request::post("/payments/webhook")
        .header("content-type", "application/json")
        .header("stripe-signature", stripes.trim())
        .body(Body::from(changed))?;
    let (status, answer) = w.deliver(req).await;
    assert_eq!(
        (status, answer["outcome"].as_str()),
        (StatusCode::OK, Some("paid")),
        "{answer}"
    );
    assert_eq!(answer["eventId"], "evt_changed");
    Ok(())
}

/// What the recording server saw of one request: its headers and its form.
#[derive(Clone, Debug, Default)]
struct Recorded {
    authorization: String,
    idempotency_key: String,
    form: std::collections::HashMap<String, String>,
}

/// A server on a loopback port that records each `POST /v1/payment_intents` and answers it
/// with `status` and `answer`, as Stripe's API answers (its documented PaymentIntent shape).
async fn stripe_recorder(
    status: StatusCode,
    answer: Value,
) -> (String, std::sync::Arc<std::sync::Mutex<Vec<Recorded>>>) {
    use axum::extract::State;
    use axum::http::HeaderMap;
    use axum::routing::post;
    type Seen = std::sync::Arc<std::sync::Mutex<Vec<Recorded>>>;
    let seen: Seen = Default::default();
    let read_back = answer.clone();
    let handler = move |State(seen): State<Seen>, headers: HeaderMap, body: String| {
        let answer = answer.clone();
        async move {
            let header = |name: &str| {
                headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string()
            };
            seen.lock().unwrap().push(Recorded {
                authorization: header("authorization"),
                idempotency_key: header("idempotency-key"),
                form: serde_urlencoded::from_str(&body).unwrap_or_default(),
            });
            (status, axum::Json(answer))
        }
    };
    let app = Router::new()
        .route("/v1/payment_intents", post(handler))
        .route(
            "/v1/payment_intents/{id}",
            axum::routing::get(move || async move { (status, axum::Json(read_back)) }),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, seen)
}

/// The entry's router with the Stripe provider at `api_base`, and the publishable key
/// `publishable_key` for the page's Stripe.js.
fn with_stripe_key(w: &World, api_base: &str, publishable_key: Option<&str>) -> Router {
    w.env.entry_router_with(|c| {
        let payments = &mut c.config.payments;
        payments.provider = "stripe".into();
        payments.api_base = api_base.into();
        payments.api_key = Some("sk_test_recorded".to_string().into());
        payments.publishable_key = publishable_key.map(str::to_string);
    })
}

/// The entry's router with the Stripe provider at `api_base` and a publishable key.
fn with_stripe(w: &World, api_base: &str) -> Router {
    with_stripe_key(w, api_base, Some("pk_test_recorded"))
}

/// The Stripe provider's side of the contract, against a recording server: one
/// PaymentIntent per order for the order's amount (form-encoded, the API key as bearer, the
/// stack's and the order's idempotency key, the order id and the stack's name in the metadata,
/// cards only), its client secret handed to the buyer with the publishable key and Stripe.js's
/// address when the server has a key; a refusing or unreachable API answers 503 and records
/// no payment.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_stripe_provider_starts_one_payment_intent_per_order() -> anyhow::Result<()> {
    let w = world().await;
    let id = w.confirmed("alice", 3).await;
    let intent = serde_json::json!({
        "id": "pi_3Recorded", "object": "payment_intent", "amount": 3 * w.activity.price_minor,
        "currency": "usd", "status": "requires_payment_method",
        "client_secret": "pi_3Recorded_secret_abc",
    });
    let (base, seen) = stripe_recorder(StatusCode::OK, intent).await;
    let app = with_stripe(&w, &base);
    let path = format!("/orders/{id}/pay");

    let (status, started) = call(&app, request("POST", &path, Some(("alice", "")), None)).await;

    assert_eq!(status, StatusCode::OK, "{started}");
    assert_eq!(
        (
            &started["provider"],
            &started["paymentId"],
            &started["clientSecret"]
        ),
        (
            &"stripe".into(),
            &"pi_3Recorded".into(),
            &"pi_3Recorded_secret_abc".into()
        )
    );
    assert!(started.get("completeUrl").is_none());
    assert_eq!(
        (&started["publishableKey"], &started["jsUrl"]),
        (
            &"pk_test_recorded".into(),
            &"https://js.stripe.com/v3/".into()
        ),
        "what the page's Stripe.js needs"
    );
    // Pressed again: the payment started before, read back with its client secret; no
    // second PaymentIntent is asked for. A server without a publishable key answers none.
    let keyless = with_stripe_key(&w, &base, None);
    let (status, again) = call(&keyless, request("POST", &path, Some(("alice", "")), None)).await;
    assert_eq!(
        (status, &again["paymentId"], &again["clientSecret"]),
        (
            StatusCode::OK,
            &started["paymentId"],
            &started["clientSecret"]
        )
    );
    assert!(again.get("publishableKey").is_none() && again.get("jsUrl").is_none());
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    for r in &seen {
        assert_eq!(r.authorization, "Bearer sk_test_recorded");
        assert_eq!(r.idempotency_key, format!("seckill-order-{id}"));
        assert_eq!(r.form["amount"], (3 * w.activity.price_minor).to_string());
        assert_eq!(r.form["currency"], "usd");
        assert_eq!(r.form["metadata[order_id]"], id.to_string());
        assert_eq!(r.form["metadata[stack]"], "seckill");
        assert_eq!(
            r.form["payment_method_types[]"], "card",
            "cards settle at once"
        );
        assert!(!r.form.contains_key("automatic_payment_methods[enabled]"));
    }

    let other = w.confirmed("bob", 1).await;
    let error = serde_json::json!({"error": {"type": "api_error", "message": "down"}});
    let (refusing, _) = stripe_recorder(StatusCode::INTERNAL_SERVER_ERROR, error).await;
    // Port 1 on loopback: nothing listens there.
    let dead = "http://127.0.0.1:1".to_string();
    for base in [refusing, dead] {
        let path = format!("/orders/{other}/pay");
        let app = with_stripe(&w, &base);
        let (status, body) = call(&app, request("POST", &path, Some(("bob", "")), None)).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, Some("unavailable")),
            "{base}: {body}"
        );
    }
    assert!(payment::of_order(&w.env.pool, other).await?.is_none());
    Ok(())
}
