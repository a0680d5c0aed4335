//! Paying: `POST /orders/{id}/pay` starts the order's payment at the provider and answers what
//! the client needs to complete it; `POST /payments/webhook`, reached without a user token,
//! takes the provider's signed events: only a verified `payment_intent.succeeded` event for the
//! payment's exact amount marks the order paid, and a refund or a dispute made at the provider
//! is recorded on the payment (`protocol::pay::settle`).

use crate::counters::FUNCTION;
use crate::{db_guards, EntryState};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use seckill_shared::domain::order;
use seckill_shared::domain::payment::{Outcome, Payment};
use seckill_shared::domain::status::PaymentStatus;
use seckill_shared::http::auth::Identity;
use seckill_shared::http::error::ErrorBody;
use seckill_shared::http::extract::OrderId;
use seckill_shared::infra::metrics;
use seckill_shared::infra::payments::{signature, BrowserCheckout, Event, StartedPayment};
use seckill_shared::infra::secret::ExposeSecret;
use seckill_shared::protocol::pay::{self, Mismatch, Settled, StartError, Started};
use seckill_shared::ApiError;
use serde::Serialize;

/// 200 body of a pay: the order's payment at the provider.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PaymentStarted {
    order_id: i64,
    /// `local` (the dev server's provider) or the real provider's name.
    #[schema(example = "local")]
    provider: String,
    /// The provider's id of the payment; its events name it.
    payment_id: String,
    /// The order's amount in the currency's minor units: the sale's price times the quantity.
    amount_minor: i64,
    #[schema(example = "usd")]
    currency: String,
    /// `requires_payment` (the client completes it; the order becomes `paid` when the
    /// provider's event arrives) or `succeeded` (paid).
    #[schema(example = "requires_payment")]
    status: PaymentStatus,
    /// Where the client completes the payment, for a provider that completes at a URL of ours
    /// (the dev server's `local`: `POST` it).
    #[serde(skip_serializing_if = "Option::is_none")]
    complete_url: Option<String>,
    /// What the client completes the payment with at the provider (Stripe.js's
    /// `confirmCardPayment` takes it).
    #[serde(skip_serializing_if = "Option::is_none")]
    client_secret: Option<String>,
    /// With a `clientSecret`: the provider's publishable key (Stripe's `pk_...`), for
    /// `Stripe(publishableKey)`; absent when the server has none configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "pk_test_51Abc")]
    publishable_key: Option<String>,
    /// With a `publishableKey`: where the page loads Stripe.js from.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "https://js.stripe.com/v3/")]
    js_url: Option<String>,
}

impl PaymentStarted {
    /// The answer of `p`; `checkout` goes with a payment the client confirms at the provider
    /// itself (one with a client secret).
    fn of(p: Payment, started: Option<StartedPayment>, checkout: Option<BrowserCheckout>) -> Self {
        let (complete_url, client_secret) = match started {
            Some(s) => (s.complete_url, s.client_secret),
            None => (None, None),
        };
        let checkout = checkout.filter(|_| client_secret.is_some());
        let (publishable_key, js_url) = match checkout {
            Some(c) => (Some(c.publishable_key), Some(c.js_url)),
            None => (None, None),
        };
        Self {
            order_id: p.order_id,
            provider: p.provider,
            payment_id: p.provider_payment_id,
            amount_minor: p.amount_minor,
            currency: p.currency,
            status: p.status,
            complete_url,
            client_secret,
            publishable_key,
            js_url,
        }
    }
}

#[utoipa::path(
    post,
    path = "/orders/{orderId}/pay",
    tag = "orders",
    operation_id = "pay",
    summary = "Start the payment of a confirmed order at the provider (the order becomes paid when the provider's signed event arrives)",
    params(OrderId),
    responses(
        (status = 200, description = "The order's one payment: `requires_payment` to complete (a POST of `completeUrl` with the local provider; with Stripe, Stripe.js from `jsUrl` confirms `clientSecret` with `publishableKey`), or `succeeded`", body = PaymentStarted),
        (status = 400, description = "Bad id (`bad_request`)", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such order, or someone else's", body = ErrorBody),
        (status = 409, description = "Cancelled, failed, past its payment timeout, or a sale with no price (`conflict`)", body = ErrorBody),
        (status = 429, description = "More requests that reach the database than the per-user rate (`rate_limited`); `Retry-After` says when to retry", body = ErrorBody),
        (status = 503, description = "The database or the payment provider is out of reach, or no provider is configured", body = ErrorBody),
        (status = 500, description = "Unexpected; logged", body = ErrorBody),
    )
)]
pub(crate) async fn pay(
    State(state): State<EntryState>,
    identity: Identity,
    OrderId(order_id): OrderId,
) -> Result<Json<PaymentStarted>, ApiError> {
    let s = &state.inner;
    db_guards::admit(&state, &identity.user_id).await?;
    let order = match order::get(&s.pool, order_id).await? {
        Some(o) if o.user_id == identity.user_id => o,
        _ => return Err(ApiError::NotFound(format!("order {order_id} not found"))),
    };
    let Some(provider) = &s.payments else {
        return Err(ApiError::Unavailable(
            "no payment provider is configured".into(),
        ));
    };
    let now = chrono::Utc::now();
    let timeout = s.config.payment_timeout;
    match pay::start(&s.pool, provider.as_ref(), &order, now, timeout).await {
        Ok(Started::Pending { payment, started }) => {
            let checkout = s.config.payments.browser_checkout();
            Ok(Json(PaymentStarted::of(payment, Some(started), checkout)))
        }
        Ok(Started::Paid(payment)) => Ok(Json(PaymentStarted::of(payment, None, None))),
        Ok(Started::NotPayable(why)) => Err(ApiError::Conflict(why)),
        Err(StartError::Db(e)) => Err(e.into()),
        Err(StartError::Provider(e)) => {
            tracing::warn!(order_id, error = %e, "payment provider unavailable");
            Err(ApiError::Unavailable(
                "the payment provider is out of reach; retry shortly".into(),
            ))
        }
    }
}

/// 200 body of the webhook: what the event came to.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookAnswer {
    event_id: String,
    /// `paid`, `already_paid`, `refund_due` (the order could no longer be paid: the money is
    /// owed back, no unit comes back), `refunded` and `disputed` (a refund or a dispute at the
    /// provider: no unit comes back), `mismatch` (not this stack's payment, or not its order,
    /// amount or currency: nothing changed, recorded for the operator), or `ignored` (a kind
    /// that changes nothing).
    #[schema(example = "paid")]
    outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    order_id: Option<i64>,
    /// The event was decided before (a redelivery): nothing changed now.
    replayed: bool,
    /// Why a `mismatch` changed nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
}

#[utoipa::path(
    post,
    path = "/payments/webhook",
    tag = "orders",
    operation_id = "paymentWebhook",
    summary = "The payment provider's signed events (Stripe-Signature): a payment's success, a refund, a dispute; each event id is decided once",
    request_body(content = String, content_type = "application/json",
        description = "A provider event: `id`, `type`, `data.object` {`id`, `amount`, `currency`, `payment_intent` (a charge's or a dispute's), `amount_refunded`, `metadata.order_id`}"),
    params(("Stripe-Signature" = Option<String>, Header,
        description = "`t=<unix seconds>,v1=<hex HMAC-SHA256 of \"<t>.<body>\">`")),
    responses(
        (status = 200, description = "Decided now or before (`replayed`); a `mismatch` (not this stack's payment, or not its order, amount or currency) changed nothing and is acknowledged so that the provider does not retry it; or ignored", body = WebhookAnswer),
        (status = 400, description = "No, malformed, stale or wrong signature, or not an event (`bad_request`); nothing changed", body = ErrorBody),
        (status = 503, description = "The database is out of reach, or no webhook secret is configured", body = ErrorBody),
        (status = 500, description = "Unexpected; logged", body = ErrorBody),
    )
)]
pub(crate) async fn webhook(
    State(state): State<EntryState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<WebhookAnswer>, ApiError> {
    let s = &state.inner;
    let settings = &s.config.payments;
    let (Some(secret), Some(provider)) = (&settings.webhook_secret, &s.payments) else {
        return Err(ApiError::Unavailable("payments are not configured".into()));
    };
    let header = headers.get(signature::HEADER).and_then(|v| v.to_str().ok());
    let now = chrono::Utc::now();
    signature::verify(
        secret.expose_secret().as_bytes(),
        header,
        &body,
        now.timestamp(),
        settings.webhook_tolerance,
    )
    .map_err(|refused| ApiError::BadRequest(format!("signature refused: {refused}")))?;
    let event: Event = serde_json::from_slice(&body)
        .map_err(|e| ApiError::BadRequest(format!("not a payment event: {e}")))?;
    let stack = &settings.stack;
    let settled = pay::settle(&s.pool, provider.name(), stack, &event, now).await?;
    let answer = |outcome: &'static str, order_id, replayed| WebhookAnswer {
        event_id: event.id.clone(),
        outcome,
        order_id,
        replayed,
        detail: None,
    };
    match settled {
        Settled::Decided { outcome, order_id } => {
            if outcome == Outcome::Disputed {
                metrics::emit(FUNCTION, &[("PaymentDisputes", 1.0)], &[]);
            }
            Ok(Json(answer(outcome.as_str(), Some(order_id), false)))
        }
        Settled::Replayed { outcome, order_id } => {
            Ok(Json(answer(outcome.as_str(), Some(order_id), true)))
        }
        Settled::Ignored => Ok(Json(answer("ignored", None, false))),
        Settled::Mismatched(mismatch) => {
            metrics::emit(FUNCTION, &[("PaymentMismatches", 1.0)], &[]);
            let order_id = match &mismatch {
                Mismatch::UnknownPayment(_) => None,
                Mismatch::OtherOrder { order, .. } => Some(*order),
                Mismatch::Amount { .. } => None,
            };
            Ok(Json(WebhookAnswer {
                detail: Some(mismatch.to_string()),
                ..answer("mismatch", order_id, false)
            }))
        }
    }
}
