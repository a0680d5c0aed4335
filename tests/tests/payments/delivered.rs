//! The webhook fed by the provider itself: localstripe (a stateful fake of Stripe) sends the
//! `payment_intent.succeeded` event of a PaymentIntent the buyer confirmed, signed with the
//! endpoint's secret as Stripe signs, to the entry's router served on a local port. Nothing here
//! builds or signs an event: what pays the order is what the fake sent.

use crate::closing::{buyer_pays, start, stripe_at, LOCALSTRIPE};
use crate::world;
use seckill_shared::domain::payment;
use seckill_shared::domain::status::{OrderStatus, PaymentStatus};
use std::future::IntoFuture;
use std::time::{Duration, Instant};

/// localstripe's webhook endpoints live as long as its process and cannot be removed: this
/// suite uses one, under this id, and narrows it to an event nobody sends when it is done.
const ENDPOINT_ID: &str = "seckill-tests-delivered";

/// Points localstripe's endpoint [`ENDPOINT_ID`] at `url` with `secret`, for `events`.
async fn endpoint(url: &str, secret: &str, events: &[&str]) {
    let mut form = vec![("url", url.to_string()), ("secret", secret.to_string())];
    form.extend(events.iter().map(|e| ("events[]", e.to_string())));
    let answer = reqwest::Client::new()
        .post(format!("{LOCALSTRIPE}/_config/webhooks/{ENDPOINT_ID}"))
        .form(&form)
        .send()
        .await
        .unwrap();
    assert!(answer.status().is_success(), "{}", answer.status());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_event_the_provider_sends_and_signs_pays_the_order_once() -> anyhow::Result<()> {
    let w = world().await;
    // A stack name of this test's own: events localstripe sends for other tests' intents (it
    // sends every event to every endpoint) are another stack's, and ignored.
    let stack = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let app = w.env.entry_router_with(|c| {
        stripe_at(&mut c.config, LOCALSTRIPE);
        c.config.payments.stack = stack.clone();
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/payments/webhook", listener.local_addr()?);
    let served = tokio::spawn(axum::serve(listener, app.clone()).into_future());
    endpoint(&url, &w.secret(), &["payment_intent.succeeded"]).await;

    let id = w.confirmed("alice", 2).await;
    let pi = start(&app, id, "alice").await;
    assert_eq!(w.status(id).await, OrderStatus::Confirmed);
    buyer_pays(&pi).await.expect("the card is accepted");

    // localstripe sends the event a second after the charge.
    let deadline = Instant::now() + Duration::from_secs(20);
    while w.status(id).await != OrderStatus::Paid && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    endpoint(&url, &w.secret(), &["seckill.tests.none"]).await;
    served.abort();

    assert_eq!(
        w.status(id).await,
        OrderStatus::Paid,
        "the provider's event paid it"
    );
    let row = payment::of_order(&w.env.pool, id).await?.unwrap();
    assert_eq!(row.status, PaymentStatus::Succeeded);
    assert_eq!(row.amount_minor, 2 * w.activity.price_minor);
    let events: Vec<(String, String)> =
        sqlx::query_as("select kind, outcome from payment_events where provider_payment_id = $1")
            .bind(&pi)
            .fetch_all(&w.env.pool)
            .await?;
    assert_eq!(
        events,
        vec![("payment_intent.succeeded".to_string(), "paid".to_string())],
        "one event, decided once"
    );
    Ok(())
}
