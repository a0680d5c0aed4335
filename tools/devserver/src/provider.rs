//! The local payment provider's other half: `POST /payments/local/{paymentId}/complete` plays
//! the provider a buyer pays at. It sends the webhook (`POST /payments/webhook`, through the
//! same router a provider's request reaches) a `payment_intent.succeeded` event for the
//! payment's exact amount, signed with `PAYMENT_WEBHOOK_SECRET` as Stripe signs, and answers
//! the webhook's answer. The order becomes paid there, not here.
//!
//! Only on a loopback address: off loopback anyone could pay for anything with it.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::Request;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use seckill_shared::domain::payment;
use seckill_shared::domain::status::PaymentStatus;
use seckill_shared::infra::payments::{
    self, signature, LocalProvider, PaymentRequest, Provider, LOCAL_PAYMENT_PREFIX,
};
use seckill_shared::infra::secret::{ExposeSecret, SecretString};
use seckill_shared::ApiError;
use sqlx::PgPool;
use std::sync::Arc;
use tower::ServiceExt;

struct Local {
    /// The app the event is sent to (its webhook route).
    app: Router,
    pool: PgPool,
    secret: Option<SecretString>,
}

/// `app` plus `POST /payments/local/{paymentId}/complete`.
pub fn local_provider(app: Router, pool: PgPool, secret: Option<SecretString>) -> Router {
    let local = Arc::new(Local {
        app: app.clone(),
        pool,
        secret,
    });
    let route = Router::new()
        .route("/payments/local/{payment_id}/complete", post(complete))
        .with_state(local);
    app.merge(route)
}

async fn complete(State(local): State<Arc<Local>>, Path(payment_id): Path<String>) -> Response {
    match event_for(&local, &payment_id).await {
        Ok(request) => local.app.clone().oneshot(request).await.into_response(),
        Err(e) => e.into_response(),
    }
}

/// The signed webhook request of `payment_id`'s success.
async fn event_for(local: &Local, payment_id: &str) -> Result<Request<Body>, ApiError> {
    let Some(secret) = &local.secret else {
        return Err(ApiError::Unavailable(
            "PAYMENT_WEBHOOK_SECRET is not set".into(),
        ));
    };
    let not_found = || ApiError::NotFound(format!("payment {payment_id} not found"));
    let digits = payment_id
        .strip_prefix(LOCAL_PAYMENT_PREFIX)
        .ok_or_else(not_found)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(not_found());
    }
    let payment = payment::by_provider_id(&local.pool, LocalProvider.name(), payment_id)
        .await?
        .ok_or_else(not_found)?;
    if payment.status == PaymentStatus::Cancelled {
        // As a provider refuses to confirm a cancelled payment: its order is being cancelled.
        return Err(ApiError::Conflict(format!(
            "payment {payment_id} was cancelled"
        )));
    }
    let request = PaymentRequest {
        order_id: payment.order_id,
        amount_minor: payment.amount_minor,
        currency: payment.currency,
    };
    let event_id = format!("evt_local_{}", uuid::Uuid::new_v4().simple());
    let body = payments::succeeded_event(&event_id, &request, payment_id);
    let header = signature::sign(
        secret.expose_secret().as_bytes(),
        chrono::Utc::now().timestamp(),
        body.as_bytes(),
    );
    Request::post("/payments/webhook")
        .header("content-type", "application/json")
        .header(signature::HEADER, header)
        .body(Body::from(body))
        .map_err(|e| ApiError::Internal(e.into()))
}
