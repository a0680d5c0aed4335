//! Payment through the provider: `POST /orders/{id}/pay` starts a payment and pays nothing;
//! `POST /payments/webhook` takes the provider's signed events, decides each event id once,
//! and pays only the payment's exact amount for a live order. Through the entry router, against
//! real Redis and PostgreSQL, with the races against a cancel made to happen on purpose.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use chrono::Utc;
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::order;
use seckill_shared::domain::payment;
use seckill_shared::infra::pause;
use seckill_shared::infra::secret::ExposeSecret;
use seckill_shared::protocol::cancel::{self, CancelOutcome};
use serde_json::Value;
use std::time::Duration;
use testkit::{self, call, request, RedisKind, TestEnv};
use testkit::{consume, db_remaining, redis_stock, reserve, snapshot};

struct World {
    env: TestEnv,
    app: Router,
    sale: Activity,
}

async fn world() -> World {
    let env = TestEnv::new(RedisKind::Standalone).await.unwrap();
    let sale = env.open_sale(10, 5).await.unwrap();
    let app = env.entry_router();
    World { env, app, sale }
}

impl World {
    /// An order the consumer confirmed for `user`, `qty` units.
    async fn confirmed(&self, user: &str, qty: i64) -> i64 {
        let rid = reserve(&self.env, self.sale.id, user, qty)
            .await
            .attempt
            .request_id;
        consume(&self.env, self.sale.id, user, rid, qty)
            .await
            .unwrap()
    }

    /// `POST /orders/{id}/pay` as `user`.
    async fn start_pay(&self, order_id: i64, user: &str) -> (StatusCode, Value) {
        let path = format!("/orders/{order_id}/pay");
        call(&self.app, request("POST", &path, Some((user, "")), None)).await
    }

    fn secret(&self) -> String {
        let secret = self.env.config.payments.webhook_secret.as_ref().unwrap();
        secret.expose_secret().to_string()
    }

    /// The provider's event `event_id` for the payment `started`, of `amount`, signed now.
    fn event(&self, event_id: &str, started: &Value, amount: i64) -> Request<Body> {
        let now = Utc::now().timestamp();
        testkit::provider_event(&self.secret(), event_id, started, amount, now)
    }

    async fn deliver(&self, req: Request<Body>) -> (StatusCode, Value) {
        call(&self.app, req).await
    }

    async fn status(&self, order_id: i64) -> String {
        order::get(&self.env.pool, order_id)
            .await
            .unwrap()
            .unwrap()
            .status
    }

    async fn events(&self) -> i64 {
        sqlx::query_scalar!(r#"select count(*) as "n!" from payment_events"#)
            .fetch_one(&self.env.pool)
            .await
            .unwrap()
    }

    async fn stocks(&self) -> (i64, Option<i64>) {
        (
            db_remaining(&self.env, self.sale.id).await,
            redis_stock(&self.env, self.sale.id).await,
        )
    }
}

fn amount(started: &Value) -> i64 {
    started["amountMinor"].as_i64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_is_started_for_the_price_times_the_quantity_and_pays_nothing(
) -> anyhow::Result<()> {
    let w = world().await;
    let id = w.confirmed("alice", 2).await;

    let (status, started) = w.start_pay(id, "alice").await;

    assert_eq!(status, StatusCode::OK, "{started}");
    assert_eq!(amount(&started), 2 * w.sale.price_minor);
    assert_eq!(started["currency"], "usd");
    assert_eq!(started["provider"], "local");
    assert_eq!(started["status"], "requires_payment");
    let payment_id = started["paymentId"].as_str().unwrap();
    assert_eq!(
        started["completeUrl"].as_str(),
        Some(format!("/payments/local/{payment_id}/complete").as_str())
    );
    assert_eq!(w.status(id).await, "confirmed", "starting pays nothing");
    let (status, body) = w.start_pay(id, "mallory").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_wrong_or_stale_signature_is_refused_and_changes_nothing() -> anyhow::Result<()> {
    let w = world().await;
    let id = w.confirmed("alice", 1).await;
    let (_, started) = w.start_pay(id, "alice").await;
    let good = w.event("evt_1", &started, amount(&started));
    let (parts, body) = good.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20).await?;
    let header = parts.headers["stripe-signature"].to_str()?.to_string();
    let post = |signature: Option<&str>, body: &[u8]| {
        let mut req = Request::post("/payments/webhook").header("content-type", "application/json");
        if let Some(s) = signature {
            req = req.header("stripe-signature", s);
        }
        req.body(Body::from(body.to_vec())).unwrap()
    };
    let now = Utc::now().timestamp();
    let wrong_secret =
        testkit::provider_event("whsec_other", "evt_1", &started, amount(&started), now);
    let stale =
        testkit::provider_event(&w.secret(), "evt_1", &started, amount(&started), now - 301);
    let tampered = String::from_utf8(body.to_vec())?
        .replace(&format!("\"amount\":{}", amount(&started)), "\"amount\":1");
    assert_ne!(tampered.as_bytes(), &body[..]);

    for (what, req) in [
        ("no signature", post(None, &body)),
        ("garbage signature", post(Some("t=1,v1=zz"), &body)),
        ("another secret", wrong_secret),
        ("signed 301 s ago", stale),
        ("a changed body", post(Some(&header), tampered.as_bytes())),
    ] {
        let (status, answer) = w.deliver(req).await;
        assert_eq!(
            (status, answer["error"].as_str()),
            (StatusCode::BAD_REQUEST, Some("bad_request")),
            "{what}: {answer}"
        );
    }
    assert_eq!(w.status(id).await, "confirmed");
    assert_eq!(w.events().await, 0);

    let (status, answer) = w.deliver(post(Some(&header), &body)).await;
    assert_eq!(
        (status, answer["outcome"].as_str()),
        (StatusCode::OK, Some("paid")),
        "{answer}"
    );
    assert_eq!(w.status(id).await, "paid");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wrong_amount_or_an_unknown_payment_is_refused_and_changes_nothing() -> anyhow::Result<()>
{
    let w = world().await;
    let id = w.confirmed("alice", 1).await;
    let (_, started) = w.start_pay(id, "alice").await;

    let (status, answer) = w
        .deliver(w.event("evt_low", &started, amount(&started) - 1))
        .await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (StatusCode::CONFLICT, Some("conflict")),
        "{answer}"
    );
    let mut other_currency = started.clone();
    other_currency["currency"] = "eur".into();
    let (status, _) = w
        .deliver(w.event("evt_eur", &other_currency, amount(&started)))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let mut unknown = started.clone();
    unknown["paymentId"] = "pi_local_999999".into();
    let (status, answer) = w
        .deliver(w.event("evt_unknown", &unknown, amount(&started)))
        .await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let mut other_order = started.clone();
    other_order["orderId"] = (id + 1000).into();
    let (status, _) = w
        .deliver(w.event("evt_other", &other_order, amount(&started)))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);

    assert_eq!(w.status(id).await, "confirmed");
    assert_eq!(w.events().await, 0, "no refused event is recorded");
    Ok(())
}

/// The provider redelivers an event until it gets a 2xx, and may deliver it twice at once:
/// each event id is decided by exactly one delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_event_is_decided_once_however_often_and_concurrently_it_arrives() -> anyhow::Result<()>
{
    let w = world().await;
    let id = w.confirmed("alice", 1).await;
    let (_, started) = w.start_pay(id, "alice").await;

    let answers = futures::future::join_all(
        (0..8).map(|_| w.deliver(w.event("evt_twice", &started, amount(&started)))),
    )
    .await;

    for (status, answer) in &answers {
        assert_eq!(
            (*status, answer["outcome"].as_str()),
            (StatusCode::OK, Some("paid")),
            "{answer}"
        );
    }
    let decided = answers
        .iter()
        .filter(|(_, a)| a["replayed"] == false)
        .count();
    assert_eq!(decided, 1, "{answers:?}");
    assert_eq!(w.events().await, 1);
    assert_eq!(w.status(id).await, "paid");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_after_a_cancel_or_the_timeout_is_owed_back_and_brings_no_unit_back(
) -> anyhow::Result<()> {
    let w = world().await;
    let cancelled = w.confirmed("alice", 1).await;
    let (_, started) = w.start_pay(cancelled, "alice").await;
    let path = format!("/orders/{cancelled}/cancel");
    let (status, _) = call(&w.app, request("POST", &path, Some(("alice", "")), None)).await;
    assert_eq!(status, StatusCode::OK);
    let stocks = w.stocks().await;

    let (status, answer) = w
        .deliver(w.event("evt_late", &started, amount(&started)))
        .await;

    assert_eq!(
        (status, answer["outcome"].as_str()),
        (StatusCode::OK, Some("refund_due")),
        "{answer}"
    );
    assert_eq!(w.status(cancelled).await, "cancelled");
    assert_eq!(w.stocks().await, stocks, "no unit moves");

    // Past the payment timeout the order is being released: its payment is owed back too,
    // and a new start is refused.
    let expired = w.confirmed("bob", 1).await;
    let (_, started) = w.start_pay(expired, "bob").await;
    let timeout = w.env.config.payment_timeout.as_secs_f64();
    sqlx::query!(
        "update orders set created_at = created_at - make_interval(secs => $2) where id = $1",
        expired,
        timeout
    )
    .execute(&w.env.pool)
    .await?;
    let (status, answer) = w
        .deliver(w.event("evt_expired", &started, amount(&started)))
        .await;
    assert_eq!(
        (status, answer["outcome"].as_str()),
        (StatusCode::OK, Some("refund_due")),
        "{answer}"
    );
    assert_eq!(
        w.status(expired).await,
        "confirmed",
        "the release takes it back, not the event"
    );
    let (status, _) = w.start_pay(expired, "bob").await;
    assert_eq!(status, StatusCode::CONFLICT);

    let due = payment::refunds_due(&w.env.pool, 10).await?;
    let mut owed: Vec<i64> = due.iter().map(|(_, order, _, _)| *order).collect();
    owed.sort();
    assert_eq!(owed, vec![cancelled, expired]);
    Ok(())
}

/// A cancel (the owner's, or the payment timeout's) announced in Redis, paused before its
/// database step, while the payment's event arrives and pays: the cancel then finds the order
/// paid, gives nothing back and withdraws its announcement.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_landing_inside_a_cancel_wins_and_the_cancel_gives_nothing_back(
) -> anyhow::Result<()> {
    let w = world().await;
    let id = w.confirmed("alice", 2).await;
    let (_, started) = w.start_pay(id, "alice").await;
    let stocks = w.stocks().await;
    let order = order::get(&w.env.pool, id).await?.unwrap();

    let paused = pause::arm("cancel.after_begin", w.sale.id);
    let (pool, redis, o) = (w.env.pool.clone(), w.env.redis.clone(), order.clone());
    let canceller =
        tokio::spawn(async move { cancel::cancel_order(&pool, &redis, &o, Utc::now()).await });
    tokio::time::timeout(Duration::from_secs(30), paused.reached()).await?;
    let (status, answer) = w
        .deliver(w.event("evt_inside", &started, amount(&started)))
        .await;
    assert_eq!(
        (status, answer["outcome"].as_str()),
        (StatusCode::OK, Some("paid")),
        "{answer}"
    );
    paused.resume();
    let outcome = canceller.await??;

    assert!(
        matches!(outcome, CancelOutcome::NotCancellable(ref s) if s == "paid"),
        "{outcome:?}"
    );
    assert_eq!(w.status(id).await, "paid");
    assert_eq!(w.stocks().await, stocks, "no unit came back");
    let snap = snapshot(&w.env, w.sale.id).await;
    assert!(
        snap.ledger.is_empty(),
        "the cancel's announcement is withdrawn: {snap:?}"
    );
    assert_eq!(snap.participants, 1, "alice keeps her quota");
    Ok(())
}

/// The event holds the order's row lock, paused before it decides, while a cancel runs: the
/// cancel's database step waits for the lock, then finds the order paid.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_racing_a_locked_payment_waits_and_gives_nothing_back() -> anyhow::Result<()> {
    let w = world().await;
    let id = w.confirmed("alice", 1).await;
    let (_, started) = w.start_pay(id, "alice").await;
    let stocks = w.stocks().await;
    let order = order::get(&w.env.pool, id).await?.unwrap();

    let paused = pause::arm("pay.settle_locked", w.sale.id);
    let event = w.event("evt_locked", &started, amount(&started));
    let app = w.app.clone();
    let webhook = tokio::spawn(async move { call(&app, event).await });
    tokio::time::timeout(Duration::from_secs(30), paused.reached()).await?;
    let (pool, redis) = (w.env.pool.clone(), w.env.redis.clone());
    let canceller =
        tokio::spawn(async move { cancel::cancel_order(&pool, &redis, &order, Utc::now()).await });
    wait_for_a_lock_wait(&w.env.pool).await?;
    paused.resume();
    let (status, answer) = webhook.await?;
    let outcome = canceller.await??;

    assert_eq!(
        (status, answer["outcome"].as_str()),
        (StatusCode::OK, Some("paid")),
        "{answer}"
    );
    assert!(
        matches!(outcome, CancelOutcome::NotCancellable(_)),
        "{outcome:?}"
    );
    assert_eq!(w.status(id).await, "paid");
    assert_eq!(w.stocks().await, stocks);
    assert!(snapshot(&w.env, w.sale.id).await.ledger.is_empty());
    Ok(())
}

/// Until a session of this database waits for a row lock (the cancel's update behind the
/// paused event's lock).
async fn wait_for_a_lock_wait(pool: &sqlx::PgPool) -> anyhow::Result<()> {
    for _ in 0..300 {
        let waiting: i64 = sqlx::query_scalar!(
            r#"select count(*) as "n!" from pg_stat_activity
               where datname = current_database() and wait_event_type = 'Lock'"#
        )
        .fetch_one(pool)
        .await?;
        if waiting > 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    anyhow::bail!("no session waited for the order's lock")
}

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
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, seen)
}

/// The entry's router with the Stripe provider at `api_base`.
fn with_stripe(w: &World, api_base: &str) -> Router {
    w.env.entry_router_with(|c| {
        let payments = &mut c.config.payments;
        payments.provider = "stripe".into();
        payments.api_base = api_base.into();
        payments.api_key = Some("sk_test_recorded".to_string().into());
    })
}

/// The Stripe provider's side of the contract, against a recording server: one
/// PaymentIntent per order for the order's amount (form-encoded, the API key as bearer, the
/// order's idempotency key, the order id in the metadata), its client secret handed to the
/// buyer; a refusing or unreachable API answers 503 and records no payment.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_stripe_provider_starts_one_payment_intent_per_order() -> anyhow::Result<()> {
    let w = world().await;
    let id = w.confirmed("alice", 3).await;
    let intent = serde_json::json!({
        "id": "pi_3Recorded", "object": "payment_intent", "amount": 3 * w.sale.price_minor,
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
    let (status, again) = call(&app, request("POST", &path, Some(("alice", "")), None)).await;
    assert_eq!(
        (status, &again["paymentId"]),
        (StatusCode::OK, &started["paymentId"])
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    for r in &seen {
        assert_eq!(r.authorization, "Bearer sk_test_recorded");
        assert_eq!(r.idempotency_key, format!("seckill-order-{id}"));
        assert_eq!(r.form["amount"], (3 * w.sale.price_minor).to_string());
        assert_eq!(r.form["currency"], "usd");
        assert_eq!(r.form["metadata[order_id]"], id.to_string());
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

/// The database out of reach when the event arrives: 503 and nothing recorded, so the
/// provider delivers it again; the redelivery, once the database is back, pays the order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_event_met_by_a_dead_database_is_paid_on_its_redelivery() -> anyhow::Result<()> {
    let w = world().await;
    let id = w.confirmed("alice", 1).await;
    let (_, started) = w.start_pay(id, "alice").await;
    let down = w.env.entry_router_with(|c| c.pool = testkit::dead_pool());

    let (status, body) = call(&down, w.event("evt_outage", &started, amount(&started))).await;

    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(
        (w.status(id).await, w.events().await),
        ("confirmed".into(), 0)
    );
    let (status, answer) = w
        .deliver(w.event("evt_outage", &started, amount(&started)))
        .await;
    assert_eq!(
        (
            status,
            answer["outcome"].as_str(),
            answer["replayed"].as_bool()
        ),
        (StatusCode::OK, Some("paid"), Some(false))
    );
    assert_eq!(w.status(id).await, "paid");
    Ok(())
}
