//! A payment started at the provider and its signed webhook: the price times the quantity, a
//! missing, wrong or stale signature refused, a wrong amount or an unknown payment acknowledged
//! and changing nothing, a refund or a dispute at the provider recorded, each event decided once
//! however often it arrives, and an event met by a dead database paid on its redelivery.

use crate::{amount, world};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use chrono::Utc;
use seckill_shared::domain::status::OrderStatus;
use seckill_shared::infra::payments::signature;
use testkit::{self, call};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_is_started_for_the_price_times_the_quantity_and_pays_nothing(
) -> anyhow::Result<()> {
    let w = world().await;
    let id = w.confirmed("alice", 2).await;

    let (status, started) = w.start_pay(id, "alice").await;

    assert_eq!(status, StatusCode::OK, "{started}");
    assert_eq!(amount(&started), 2 * w.activity.price_minor);
    assert_eq!(started["currency"], "usd");
    assert_eq!(started["provider"], "local");
    assert_eq!(started["status"], "requires_payment");
    let payment_id = started["paymentId"].as_str().unwrap();
    assert_eq!(
        started["completeUrl"].as_str(),
        Some(format!("/payments/local/{payment_id}/complete").as_str())
    );
    assert!(
        started.get("publishableKey").is_none(),
        "Stripe.js is for Stripe's payments only"
    );
    assert_eq!(
        w.status(id).await,
        OrderStatus::Confirmed,
        "starting pays nothing"
    );
    let (status, body) = w.start_pay(id, "mallory").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    Ok(())
}

/// The order keeps the price it was bought at, and its payment is started from that: the
/// sale's row is changed under it here (a fixture: the admin API refuses a price change once
/// the sale is 10 s from its start).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_is_started_at_the_price_the_order_was_bought_at() -> anyhow::Result<()> {
    let w = world().await;
    let id = w.confirmed("alice", 2).await;
    let row = seckill_shared::domain::order::get(&w.env.pool, id)
        .await?
        .unwrap();
    assert_eq!(
        (row.unit_price_minor, row.currency.as_deref()),
        (Some(w.activity.price_minor), Some("usd"))
    );
    sqlx::query(
        "update activities set price_minor = price_minor * 10, currency = 'eur' where id = $1",
    )
    .bind(w.activity.id)
    .execute(&w.env.pool)
    .await?;

    let (status, started) = w.start_pay(id, "alice").await;

    assert_eq!(status, StatusCode::OK, "{started}");
    assert_eq!(amount(&started), 2 * w.activity.price_minor);
    assert_eq!(started["currency"], "usd");
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
    assert_eq!(w.status(id).await, OrderStatus::Confirmed);
    assert_eq!(w.events().await, 0);

    let (status, answer) = w.deliver(post(Some(&header), &body)).await;
    assert_eq!(
        (status, answer["outcome"].as_str()),
        (StatusCode::OK, Some("paid")),
        "{answer}"
    );
    assert_eq!(w.status(id).await, OrderStatus::Paid);
    Ok(())
}

/// Signed events that do not match their payment (another amount, currency or order) or name
/// a payment this stack never started (another stack's, on the same provider account) change
/// nothing and are acknowledged (200 `mismatch`, with why), so that the provider does not retry
/// them for days; those of our payments are recorded for the operator. Before, each was a
/// 404 or 409 the provider retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mismatched_or_foreign_event_changes_nothing_and_is_acknowledged() -> anyhow::Result<()> {
    let w = world().await;
    let id = w.confirmed("alice", 1).await;
    let (_, started) = w.start_pay(id, "alice").await;
    let mismatch = |answer: &serde_json::Value| {
        assert_eq!(answer["outcome"], "mismatch", "{answer}");
        assert!(answer["detail"].is_string(), "{answer}");
    };

    let (status, answer) = w
        .deliver(w.event("evt_low", &started, amount(&started) - 1))
        .await;
    assert_eq!(status, StatusCode::OK);
    mismatch(&answer);
    let mut other_currency = started.clone();
    other_currency["currency"] = "eur".into();
    let (status, answer) = w
        .deliver(w.event("evt_eur", &other_currency, amount(&started)))
        .await;
    assert_eq!(status, StatusCode::OK);
    mismatch(&answer);
    let mut other_order = started.clone();
    other_order["orderId"] = (id + 1000).into();
    let (status, answer) = w
        .deliver(w.event("evt_other", &other_order, amount(&started)))
        .await;
    assert_eq!(status, StatusCode::OK);
    mismatch(&answer);
    let mut unknown = started.clone();
    unknown["paymentId"] = "pi_local_999999".into();
    let (status, answer) = w
        .deliver(w.event("evt_unknown", &unknown, amount(&started)))
        .await;
    assert_eq!(status, StatusCode::OK);
    mismatch(&answer);

    assert_eq!(w.status(id).await, OrderStatus::Confirmed);
    let recorded: Vec<String> = sqlx::query_scalar!(
        "select event_id from payment_events where outcome = 'mismatch' order by event_id"
    )
    .fetch_all(&w.env.pool)
    .await?;
    assert_eq!(recorded, vec!["evt_eur", "evt_low", "evt_other"]);
    // The same event, redelivered: the recorded outcome, nothing changes.
    let (status, answer) = w
        .deliver(w.event("evt_low", &started, amount(&started) - 1))
        .await;
    assert_eq!(
        (status, &answer["replayed"]),
        (StatusCode::OK, &true.into())
    );
    // The right event still pays.
    let (_, answer) = w
        .deliver(w.event("evt_right", &started, amount(&started)))
        .await;
    assert_eq!(answer["outcome"], "paid", "{answer}");
    Ok(())
}

/// The provider's own refund (`charge.refunded`, made at its dashboard) and a dispute
/// (`charge.dispute.created`) of a paid order, signed as the provider signs them: the payment
/// records the refund with its id and the dispute's time, the order stays paid and no unit
/// comes back; each event id once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refund_or_a_dispute_at_the_provider_is_recorded_and_brings_no_unit_back(
) -> anyhow::Result<()> {
    let w = world().await;
    let id = w.confirmed("alice", 2).await;
    let (_, started) = w.start_pay(id, "alice").await;
    let (_, answer) = w
        .deliver(w.event("evt_paid", &started, amount(&started)))
        .await;
    assert_eq!(answer["outcome"], "paid");
    let stocks = w.stocks().await;
    let pi = started["paymentId"].as_str().unwrap();
    let signed = |body: serde_json::Value| {
        let body = body.to_string();
        let now = Utc::now().timestamp();
        let header = signature::sign(w.secret().as_bytes(), now, body.as_bytes());
        Request::post("/payments/webhook")
            .header("content-type", "application/json")
            .header("stripe-signature", header)
            .body(Body::from(body))
            .unwrap()
    };
    let charge = |event_id: &str, kind: &str, object: serde_json::Value| {
        serde_json::json!({"id": event_id, "object": "event", "type": kind,
                           "data": {"object": object}})
    };
    let refunded = charge(
        "evt_refunded",
        "charge.refunded",
        serde_json::json!({
            "id": "ch_1", "object": "charge", "payment_intent": pi,
            "amount": amount(&started), "amount_refunded": amount(&started),
            "currency": "usd", "refunded": true,
            "refunds": {"object": "list", "data": [{"id": "re_dashboard", "object": "refund"}]},
        }),
    );
    let disputed = charge(
        "evt_disputed",
        "charge.dispute.created",
        serde_json::json!({
            "id": "dp_1", "object": "dispute", "charge": "ch_1", "payment_intent": pi,
            "amount": amount(&started), "currency": "usd", "status": "needs_response",
        }),
    );

    let (status, answer) = w.deliver(signed(refunded.clone())).await;
    assert_eq!(
        (status, answer["outcome"].as_str()),
        (StatusCode::OK, Some("refunded"))
    );
    let (status, answer) = w.deliver(signed(disputed)).await;
    assert_eq!(
        (status, answer["outcome"].as_str()),
        (StatusCode::OK, Some("disputed"))
    );
    let (_, again) = w.deliver(signed(refunded)).await;
    assert_eq!(again["replayed"], true);

    let row = sqlx::query!(
        "select refund_state, refund_id, disputed_at from payments where order_id = $1",
        id
    )
    .fetch_one(&w.env.pool)
    .await?;
    assert_eq!(row.refund_state.as_deref(), Some("refunded"));
    assert_eq!(row.refund_id.as_deref(), Some("re_dashboard"));
    assert!(row.disputed_at.is_some());
    assert_eq!(w.status(id).await, OrderStatus::Paid);
    assert_eq!(w.stocks().await, stocks, "no unit comes back");
    assert_eq!(w.events().await, 3);
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
    assert_eq!(w.status(id).await, OrderStatus::Paid);
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
        (OrderStatus::Confirmed, 0)
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
    assert_eq!(w.status(id).await, OrderStatus::Paid);
    Ok(())
}

/// Anonymous traffic on the webhook (no signature, or one made with another secret) while the
/// provider delivers signed events, through the router: a refused request costs no database
/// connection, so the signed deliveries, on the one connection a deployed entry holds, all pay
/// in the middle of the flood. (In AWS the route's own throttle, and with the edge on the WAF's
/// allow-list of the provider's addresses, bound what reaches the function at all.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_unsigned_requests_does_not_stop_signed_deliveries() -> anyhow::Result<()> {
    use futures::StreamExt;
    use seckill_shared::infra::shape::Function;

    let w = world().await;
    let mut entry = Function::Entry.local_config(&w.env.config)?;
    entry.db_max_connections = 1;
    let one_connection = entry.database_pool_lazy()?;
    let app = w.env.entry_router_with(|c| c.pool = one_connection);
    let mut signed = Vec::new();
    for n in 0..5 {
        let user = format!("payer{n}");
        let id = w.confirmed(&user, 1).await;
        let (_, started) = w.start_pay(id, &user).await;
        signed.push((id, started));
    }
    let forged = |n: usize| {
        let (_, started) = &signed[n % signed.len()];
        let event = format!("evt_forged_{n}");
        let mut req = testkit::provider_event(
            "whsec_not_the_endpoints",
            &event,
            started,
            amount(started),
            Utc::now().timestamp(),
        );
        if n.is_multiple_of(2) {
            req.headers_mut().remove(signature::HEADER);
        }
        req
    };

    const FLOOD: usize = 4000;
    let flood = futures::stream::iter(0..FLOOD)
        .map(|n| call(&app, forged(n)))
        .buffer_unordered(64)
        .collect::<Vec<_>>();
    let deliveries = async {
        let mut answers = Vec::new();
        for (n, (_, started)) in signed.iter().enumerate() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            let event = w.event(&format!("evt_real_{n}"), started, amount(started));
            answers.push(call(&app, event).await);
        }
        answers
    };
    let (flooded, delivered) = tokio::join!(flood, deliveries);

    let refused = flooded
        .iter()
        .filter(|(status, body)| {
            *status == StatusCode::BAD_REQUEST
                && body["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("signature refused"))
        })
        .count();
    assert_eq!(
        refused, FLOOD,
        "every forged request is refused at its signature"
    );
    for ((id, _), (status, body)) in signed.iter().zip(&delivered) {
        assert_eq!(
            (*status, body["outcome"].as_str()),
            (StatusCode::OK, Some("paid")),
            "{body}"
        );
        assert_eq!(w.status(*id).await, OrderStatus::Paid);
    }
    assert_eq!(
        w.events().await,
        signed.len() as i64,
        "only the signed events are recorded"
    );
    Ok(())
}
