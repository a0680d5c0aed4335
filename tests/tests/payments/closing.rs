//! A payment closed at the provider before its order's unit comes back, against localstripe (a
//! stateful fake of Stripe's API, `scripts/stack.sh` starts it on 8420): the owner's cancel and
//! the payment timeout's release cancel the PaymentIntent first; one the buyer paid keeps its
//! order, sold, for its event to pay whenever it arrives; a provider out of reach moves nothing.

use crate::{world, World};
use axum::http::StatusCode;
use chrono::{Duration as ChronoDuration, Utc};
use seckill_shared::domain::payment;
use seckill_shared::domain::status::{OrderStatus, PaymentStatus};
use seckill_shared::infra::pause;
use std::time::Duration;
use testkit::{self, call, request};

pub(crate) use testkit::localstripe::{buyer_pays, intent_status, stripe_at, LOCALSTRIPE};

/// The entry's router on the Stripe provider at localstripe.
pub(crate) fn stripe_app(w: &World) -> axum::Router {
    w.env
        .entry_router_with(|c| stripe_at(&mut c.config, LOCALSTRIPE))
}

/// `POST /orders/{id}/pay` on `app` as `user`: the PaymentIntent's id.
pub(crate) async fn start(app: &axum::Router, order_id: i64, user: &str) -> String {
    let path = format!("/orders/{order_id}/pay");
    let (status, started) = call(app, request("POST", &path, Some((user, "")), None)).await;
    assert_eq!(status, StatusCode::OK, "{started}");
    assert!(started["clientSecret"].is_string(), "{started}");
    started["paymentId"].as_str().unwrap().to_string()
}

/// A confirmed order of `user` for `qty` units, its payment started through the entry's router
/// on the Stripe provider at localstripe: the router, the order and its PaymentIntent.
pub(crate) async fn started(w: &World, user: &str, qty: i64) -> (axum::Router, i64, String) {
    let app = stripe_app(w);
    let id = w.confirmed(user, qty).await;
    let pi = start(&app, id, user).await;
    (app, id, pi)
}

/// Moves order `id` past its payment timeout.
pub(crate) async fn age(w: &World, id: i64) {
    let timeout = w.env.config.payment_timeout.as_secs_f64() + 1.0;
    sqlx::query!(
        "update orders set created_at = created_at - make_interval(secs => $2) where id = $1",
        id,
        timeout
    )
    .execute(&w.env.pool)
    .await
    .unwrap();
}

/// One release run of reconcile (its own role) on the provider at `api_base`.
async fn release(w: &World, api_base: &str) -> reconcile::ReconcileReport {
    let job = w.env.reconcile_with(|c| stripe_at(&mut c.config, api_base));
    let mut report = reconcile::ReconcileReport::default();
    job.release_unpaid(Utc::now() + ChronoDuration::seconds(1), &mut report)
        .await;
    report
}

/// The owner's cancel cancels the PaymentIntent at the provider before the unit comes back:
/// the client secret the buyer holds completes nothing any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_owners_cancel_cancels_the_payment_intent_first() -> anyhow::Result<()> {
    let w = world().await;
    let (app, id, pi) = started(&w, "alice", 1).await;
    assert_eq!(intent_status(&pi).await, "requires_payment_method");
    let stocks = w.stocks().await;

    let path = format!("/orders/{id}/cancel");
    let (status, body) = call(&app, request("POST", &path, Some(("alice", "")), None)).await;

    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(intent_status(&pi).await, "canceled");
    assert_eq!(w.status(id).await, OrderStatus::Cancelled);
    assert_eq!(w.stocks().await, (stocks.0 + 1, stocks.1.map(|s| s + 1)));
    let p = payment::of_order(&w.env.pool, id).await?.unwrap();
    assert_eq!(p.status, PaymentStatus::Cancelled);
    assert!(
        buyer_pays(&pi).await.is_err(),
        "a cancelled intent is not paid"
    );
    Ok(())
}

/// The buyer paid at the provider; the event has not come (an outage, say). The release past
/// the payment timeout asks the provider first and leaves the order as it is, its unit sold:
/// only the provider's signed event marks an order paid, and when it comes, late, it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_release_leaves_an_order_the_buyer_paid_to_its_late_event() -> anyhow::Result<()> {
    let w = world().await;
    let (app, id, pi) = started(&w, "alice", 2).await;
    buyer_pays(&pi).await.expect("paid at the provider");
    assert_eq!(intent_status(&pi).await, "succeeded");
    age(&w, id).await;
    let stocks = w.stocks().await;

    let report = release(&w, LOCALSTRIPE).await;

    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(report.released_unpaid, 0);
    assert_eq!(report.release_deferred, 1);
    assert_eq!(w.status(id).await, OrderStatus::Confirmed);
    assert_eq!(w.stocks().await, stocks, "the unit stays sold");
    paid_by_its_event(&w, &app, id, &pi).await;
    assert_eq!(w.stocks().await, stocks);
    Ok(())
}

/// The payment's `payment_intent.succeeded` event, delivered now: it pays order `id`.
async fn paid_by_its_event(w: &World, app: &axum::Router, id: i64, pi: &str) {
    let p = payment::of_order(&w.env.pool, id).await.unwrap().unwrap();
    let started = serde_json::json!({
        "orderId": id, "paymentId": pi, "currency": p.currency, "amountMinor": p.amount_minor,
    });
    let event = testkit::provider_event(
        &w.secret(),
        &format!("evt_late_{id}"),
        &started,
        p.amount_minor,
        Utc::now().timestamp(),
    );
    let (status, answer) = call(app, event).await;
    assert_eq!(
        (status, answer["outcome"].as_str()),
        (StatusCode::OK, Some("paid")),
        "{answer}"
    );
    assert_eq!(w.status(id).await, OrderStatus::Paid);
}

/// The release pauses before it asks the provider to cancel, and the buyer pays meanwhile: the
/// provider refuses the cancel, the release reads the intent succeeded and leaves the order to
/// its event, which pays it. Never both a cancelled order and a charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_made_while_the_release_runs_keeps_the_order_for_its_event() -> anyhow::Result<()>
{
    let w = std::sync::Arc::new(world().await);
    let (app, id, pi) = started(&w, "alice", 1).await;
    age(&w, id).await;
    let stocks = w.stocks().await;
    let paused = pause::arm("pay.before_provider_cancel", w.activity.id);
    let releaser = {
        let w = w.clone();
        tokio::spawn(async move { release(&w, LOCALSTRIPE).await })
    };
    tokio::time::timeout(Duration::from_secs(30), paused.reached()).await?;
    buyer_pays(&pi).await.expect("paid before the cancel");
    paused.resume();
    let report = releaser.await?;

    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(report.released_unpaid, 0);
    assert_eq!(intent_status(&pi).await, "succeeded");
    assert_eq!(w.status(id).await, OrderStatus::Confirmed);
    assert_eq!(w.stocks().await, stocks, "the unit stays sold");
    paid_by_its_event(&w, &app, id, &pi).await;
    Ok(())
}

/// The release cancels the intent and pauses before it records anything; the buyer, too late,
/// tries to pay: the provider refuses, the release goes on and gives the unit back. Nobody was
/// charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_tried_after_the_release_cancelled_the_intent_charges_nothing(
) -> anyhow::Result<()> {
    let w = std::sync::Arc::new(world().await);
    let (_, id, pi) = started(&w, "alice", 1).await;
    age(&w, id).await;
    let stocks = w.stocks().await;
    let paused = pause::arm("pay.after_provider_cancel", w.activity.id);
    let releaser = {
        let w = w.clone();
        tokio::spawn(async move { release(&w, LOCALSTRIPE).await })
    };
    tokio::time::timeout(Duration::from_secs(30), paused.reached()).await?;
    assert!(buyer_pays(&pi).await.is_err(), "the provider refuses");
    paused.resume();
    let report = releaser.await?;

    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(report.released_unpaid, 1);
    assert_eq!(intent_status(&pi).await, "canceled");
    assert_eq!(w.status(id).await, OrderStatus::Cancelled);
    assert_eq!(w.stocks().await, (stocks.0 + 1, stocks.1.map(|s| s + 1)));
    Ok(())
}

/// The provider out of reach (a dead port): the release leaves an order with an open payment
/// as it is, its unit sold, for a later run; it does not count as an error of the run. Once
/// the provider answers, the order is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_out_of_reach_leaves_the_order_for_a_later_release() -> anyhow::Result<()> {
    let w = world().await;
    let (_, id, pi) = started(&w, "alice", 1).await;
    age(&w, id).await;
    let stocks = w.stocks().await;

    let report = release(&w, "http://127.0.0.1:1").await;

    assert_eq!(report.released_unpaid, 0, "{report:?}");
    assert_eq!(w.status(id).await, OrderStatus::Confirmed);
    assert_eq!(w.stocks().await, stocks, "no unit moved");
    assert_eq!(intent_status(&pi).await, "requires_payment_method");

    let report = release(&w, LOCALSTRIPE).await;
    assert_eq!(report.released_unpaid, 1, "{report:?}");
    assert_eq!(intent_status(&pi).await, "canceled");
    assert_eq!(w.status(id).await, OrderStatus::Cancelled);
    Ok(())
}
