//! Requests as API Gateway hands them to a function, the in-process call of a router, and the
//! few HTTP conversations tests hold with it (a purchase, a status, a payment at the provider).

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::Router;
use chrono::Utc;
use seckill_shared::domain::activity::Activity;
use seckill_shared::http::auth::USER_SCOPE;
use seckill_shared::infra::config::Config;
use seckill_shared::infra::payments::{self, signature, PaymentRequest};
use seckill_shared::infra::secret::ExposeSecret;
use serde_json::Value;
use tower::ServiceExt;

/// A request as the HTTP API delivers it to the function: the JWT authorizer's claims for
/// `user` (with `scope`) in the request context, no `Authorization` header needed.
pub fn request(
    method: &str,
    path: &str,
    user: Option<(&str, &str)>,
    body: Option<&str>,
) -> Request<Body> {
    let claims = user.map(|(sub, scope)| seckill_shared::http::auth::Claims {
        sub: sub.to_string(),
        scope: scope.to_string(),
        exp: u64::MAX / 2,
        iat: 0,
    });
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body.unwrap_or("").to_string()))
        .expect("a valid request");
    req.extensions_mut()
        .insert(seckill_shared::http::auth::request_context(
            claims.as_ref(),
            method,
            path,
        ));
    req
}

/// Calls a router in-process (as Lambda does: no TCP) and returns the status and JSON body
/// (`Value::Null` for an empty body).
pub async fn call(router: &Router, req: Request<Body>) -> (StatusCode, Value) {
    let (status, _, json) = call_with_headers(router, req).await;
    (status, json)
}

/// [`call`], with the response headers.
pub async fn call_with_headers(
    router: &Router,
    req: Request<Body>,
) -> (StatusCode, HeaderMap, Value) {
    let resp = router
        .clone()
        .oneshot(req)
        .await
        .expect("infallible router");
    let (parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .expect("readable body");
    let json = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
    };
    (parts.status, parts.headers, json)
}

/// A purchase of `a` by `user` through the entry's router (`body` `None`: one unit).
pub async fn buy(
    app: &Router,
    a: &Activity,
    user: &str,
    body: Option<&str>,
) -> (StatusCode, Value) {
    let path = format!("/activities/{}/orders", a.id);
    call(app, request("POST", &path, Some((user, USER_SCOPE)), body)).await
}

/// `user`'s status in `a` (`GET …/orders/me`), which answered 200.
pub async fn my_status(app: &Router, a: &Activity, user: &str) -> String {
    let path = format!("/activities/{}/orders/me", a.id);
    let (status, body) = call(app, request("GET", &path, Some((user, USER_SCOPE)), None)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["status"].as_str().unwrap_or_default().to_string()
}

/// The provider's webhook request for the payment a `POST /orders/{id}/pay` answered
/// (`started`): a `payment_intent.succeeded` event with id `event_id`, for `amount_minor`,
/// signed with `secret` at `signed_at` (unix seconds) as the provider signs.
pub fn provider_event(
    secret: &str,
    event_id: &str,
    started: &Value,
    amount_minor: i64,
    signed_at: i64,
) -> Request<Body> {
    let request = PaymentRequest {
        order_id: started["orderId"].as_i64().expect("a payment's orderId"),
        amount_minor,
        currency: started["currency"].as_str().expect("a currency").into(),
    };
    let payment_id = started["paymentId"].as_str().expect("a paymentId");
    let body = payments::succeeded_event(event_id, &request, payment_id);
    let header = signature::sign(secret.as_bytes(), signed_at, body.as_bytes());
    Request::post("/payments/webhook")
        .header("content-type", "application/json")
        .header(signature::HEADER, header)
        .body(Body::from(body))
        .expect("a valid request")
}

/// `POST /orders/{order_id}/pay` as `user` on `router`, then the provider's signed event for
/// the payment it started, as the buyer completing the payment causes. Answers the webhook's
/// answer, or the pay's when it was refused.
pub async fn pay_through_provider(
    router: &Router,
    config: &Config,
    order_id: i64,
    user: &str,
) -> (StatusCode, Value) {
    let path = format!("/orders/{order_id}/pay");
    let (status, started) = call(
        router,
        request("POST", &path, Some((user, USER_SCOPE)), None),
    )
    .await;
    if status != StatusCode::OK {
        return (status, started);
    }
    let secret = config
        .payments
        .webhook_secret
        .as_ref()
        .expect("PAYMENT_WEBHOOK_SECRET is set (scripts/env.sh)");
    let event_id = format!("evt_test_{}", uuid::Uuid::new_v4().simple());
    let amount = started["amountMinor"].as_i64().expect("an amountMinor");
    let event = provider_event(
        secret.expose_secret(),
        &event_id,
        &started,
        amount,
        Utc::now().timestamp(),
    );
    call(router, event).await
}
