//! The error every HTTP function answers with: JSON `{"error": code, "message": text}`.
//!
//! Each variant documents its status. Internal errors are logged with their cause and sent to
//! the client as a bare 500: no SQL, no hostnames, no secrets leave the process.

use axum::body::Bytes;
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use std::sync::LazyLock;

use crate::domain::refusal::Refusal;
use crate::domain::settings::Invalid;
use crate::protocol::admin::ChangeError;
use crate::protocol::cancel::CancelError;
use crate::protocol::lock::LockError;
use crate::store::conn::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400 `bad_request`: malformed JSON, wrong types, unknown fields, bad ids, oversized body.
    #[error("{0}")]
    BadRequest(String),
    /// 401 `unauthorized`: no, malformed, expired or badly signed token.
    #[error("{0}")]
    Unauthorized(String),
    /// 403 `forbidden`: a valid token without the needed scope.
    #[error("{0}")]
    Forbidden(String),
    /// 404 `not_found`: unknown activity or order, or someone else's order, or no such route.
    #[error("{0}")]
    NotFound(String),
    /// 405 `method_not_allowed`: the route exists, the method does not (e.g. `DELETE /health`).
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    /// The purchase script's refusal: 409 `not_started`, `ended`, `sold_out` or
    /// `already_purchased`, 400 `quantity_exceeds_limit`, 404 `not_found`, and 503
    /// `unavailable` for a script that ran after its caller stopped waiting (it changed
    /// nothing; to the client that is Redis being unavailable).
    #[error(transparent)]
    Refused(Refusal),
    /// 409 `busy`: the activity's admin lock is held by someone else.
    #[error("the activity is being changed by someone else; retry shortly")]
    Busy,
    /// 409 `stale_token`: a fencing token lower than one the database has seen.
    #[error("{0}")]
    StaleToken(String),
    /// 409 `conflict`: the request contradicts the current state (e.g. paying a cancelled order).
    #[error("{0}")]
    Conflict(String),
    /// 409 `draw_running`, with `Retry-After: 1`: a draw sale's window has closed and its
    /// drawer (reconcile) has not finished the draw yet; nothing was reserved.
    #[error("the draw is running; retry in a second")]
    DrawRunning,
    /// 503 `unavailable`: Redis, the queue or the database is out of reach; safe to retry.
    #[error("{0}")]
    Unavailable(String),
    /// 500 `internal`: logged with its cause, answered without details.
    #[error("internal error")]
    Internal(#[from] anyhow::Error),
}

/// The body of every error answer, whatever the status.
// The OpenAPI document describes it from this type, `error` restricted to `ApiError::codes`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// The stable machine-readable code clients switch on.
    #[schema(schema_with = error_code_schema)]
    pub error: &'static str,
    /// What went wrong, for a human.
    pub message: String,
}

fn error_code_schema() -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(ApiError::codes().into_iter().map(|(_, code)| code)))
        .description(Some("The stable machine-readable code clients switch on."))
        .build()
}

impl ApiError {
    /// Every code an error body can carry, with its status: the list the OpenAPI document
    /// gives for `error`. A test checks it against [`ApiError::code`] and [`ApiError::status`].
    pub fn codes() -> Vec<(StatusCode, &'static str)> {
        let mut codes: Vec<(StatusCode, &'static str)> = vec![
            (StatusCode::BAD_REQUEST, "bad_request"),
            (StatusCode::UNAUTHORIZED, "unauthorized"),
            (StatusCode::FORBIDDEN, "forbidden"),
            (StatusCode::NOT_FOUND, "not_found"),
            (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            (StatusCode::CONFLICT, "busy"),
            (StatusCode::CONFLICT, "stale_token"),
            (StatusCode::CONFLICT, "conflict"),
            (StatusCode::CONFLICT, "draw_running"),
            (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        ];
        for refusal in Refusal::ALL {
            let e = ApiError::from(refusal);
            let pair = (e.status(), e.code());
            if !codes.contains(&pair) {
                codes.push(pair);
            }
        }
        codes
    }

    /// The stable machine-readable code clients switch on.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "bad_request",
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::Refused(Refusal::Expired { .. }) => "unavailable",
            ApiError::Refused(refusal) => refusal.code(),
            ApiError::Busy => "busy",
            ApiError::StaleToken(_) => "stale_token",
            ApiError::Conflict(_) => "conflict",
            ApiError::DrawRunning => "draw_running",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Internal(_) => "internal",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) | ApiError::Refused(Refusal::QuantityExceedsLimit) => {
                StatusCode::BAD_REQUEST
            }
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) | ApiError::Refused(Refusal::NotFound) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Refused(
                Refusal::NotStarted
                | Refusal::Ended
                | Refusal::SoldOut { .. }
                | Refusal::AlreadyPurchased
                | Refusal::PoolFull,
            )
            | ApiError::Busy
            | ApiError::StaleToken(_)
            | ApiError::Conflict(_)
            | ApiError::DrawRunning => StatusCode::CONFLICT,
            ApiError::Unavailable(_) | ApiError::Refused(Refusal::Expired { .. }) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Refused(Refusal::RateLimited { .. }) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A 503 for a dependency that is out of reach; the cause is logged, not sent.
    pub fn unavailable(what: &str, cause: impl std::fmt::Display) -> Self {
        tracing::warn!(dependency = what, error = %cause, "dependency unavailable");
        ApiError::Unavailable(format!("{what} is unavailable; retry shortly"))
    }
}

/// A refusal is answered with its own code and status (see [`ApiError::code`]).
impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> Self {
        ApiError::Refused(refusal)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::unavailable("redis", e)
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        if crate::infra::db::is_transient(&e) {
            ApiError::unavailable("database", e)
        } else {
            ApiError::Internal(anyhow::Error::new(e).context("database query failed"))
        }
    }
}

/// A setting that breaks a rule: 400, naming the field.
impl From<Invalid> for ApiError {
    fn from(e: Invalid) -> Self {
        ApiError::BadRequest(e.0)
    }
}

/// Someone else holds the lock: 409 `busy`; a lease lost or a newer token seen: 409
/// `stale_token`; Redis or the database out of reach: 503.
impl From<LockError> for ApiError {
    fn from(e: LockError) -> Self {
        match e {
            LockError::Busy => ApiError::Busy,
            LockError::Lost | LockError::StaleToken { .. } => ApiError::StaleToken(e.to_string()),
            LockError::Store(c) => c.into(),
            LockError::Db(d) => d.into(),
        }
    }
}

/// A change refused by a rule is a 400 (a field) or a 409 (what may change once the sale
/// started, stock below what is sold); an unknown sale 404; the lock's answers as the lock's.
impl From<ChangeError> for ApiError {
    fn from(e: ChangeError) -> Self {
        match e {
            ChangeError::Invalid(invalid) => invalid.into(),
            ChangeError::NotFound(_) => ApiError::NotFound(e.to_string()),
            ChangeError::BelowSold(_) | ChangeError::Conflict(_) => {
                ApiError::Conflict(e.to_string())
            }
            ChangeError::Lock(l) => l.into(),
            ChangeError::Db(d) => d.into(),
            ChangeError::Store(c) => c.into(),
        }
    }
}

impl From<CancelError> for ApiError {
    fn from(e: CancelError) -> Self {
        match e {
            CancelError::Db(d) => d.into(),
            CancelError::Store(c) => c.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if let ApiError::Refused(refusal) = self {
            // Refusals are the bulk of a sale's traffic and their bodies never vary.
            let body = REFUSAL_BODIES[refusal.index()].clone();
            let json = HeaderValue::from_static("application/json");
            if let Refusal::RateLimited { retry_after_ms } = refusal {
                // Whole seconds (RFC 9110), rounded up: a client that waits that long is
                // inside its next second.
                let secs = (retry_after_ms.max(1) + 999) / 1000;
                let retry = HeaderValue::from(secs);
                return (status, [(CONTENT_TYPE, json), (RETRY_AFTER, retry)], body)
                    .into_response();
            }
            return (status, [(CONTENT_TYPE, json)], body).into_response();
        }
        if let ApiError::Internal(e) = &self {
            tracing::error!(error = ?e, "internal error");
        }
        if let ApiError::DrawRunning = self {
            return (
                status,
                [(RETRY_AFTER, HeaderValue::from(1))],
                Json(self.body()),
            )
                .into_response();
        }
        (status, Json(self.body())).into_response()
    }
}

impl ApiError {
    /// What [`IntoResponse`] sends for this error.
    fn body(&self) -> ErrorBody {
        ErrorBody {
            error: self.code(),
            message: self.to_string(),
        }
    }
}

/// Each refusal's error body, serialised once, by [`Refusal::index`]: the bytes `Json` would
/// write for it, since a refusal's code and message depend on the refusal alone.
static REFUSAL_BODIES: LazyLock<Vec<Bytes>> = LazyLock::new(|| {
    Refusal::ALL
        .iter()
        .map(|r| {
            let body = serde_json::to_vec(&ApiError::Refused(*r).body())
                .expect("an error body serialises");
            Bytes::from(body)
        })
        .collect()
});

/// Turns axum's JSON and path rejections into our 400 with a message saying what is wrong.
pub fn rejection_to_bad_request(rejection: impl std::fmt::Display) -> ApiError {
    ApiError::BadRequest(rejection.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One error of each variant. The match below has no wildcard, so a new variant does not
    /// compile until it is added here too, and then the test checks it is in [`ApiError::codes`].
    fn one_of_each() -> Vec<ApiError> {
        let mut all = vec![
            ApiError::BadRequest("x".into()),
            ApiError::Unauthorized("x".into()),
            ApiError::Forbidden("x".into()),
            ApiError::NotFound("x".into()),
            ApiError::MethodNotAllowed,
            ApiError::Busy,
            ApiError::StaleToken("x".into()),
            ApiError::Conflict("x".into()),
            ApiError::DrawRunning,
            ApiError::Unavailable("x".into()),
            ApiError::Internal(anyhow::anyhow!("x")),
        ];
        all.extend(Refusal::ALL.map(ApiError::from));
        for e in &all {
            match e {
                ApiError::BadRequest(_)
                | ApiError::Unauthorized(_)
                | ApiError::Forbidden(_)
                | ApiError::NotFound(_)
                | ApiError::MethodNotAllowed
                | ApiError::Refused(_)
                | ApiError::Busy
                | ApiError::StaleToken(_)
                | ApiError::Conflict(_)
                | ApiError::DrawRunning
                | ApiError::Unavailable(_)
                | ApiError::Internal(_) => {}
            }
        }
        all
    }

    #[tokio::test]
    async fn every_error_answers_the_json_its_code_and_message_make() {
        for e in one_of_each() {
            let want = serde_json::json!({"error": e.code(), "message": e.to_string()});
            let status = e.status();
            let resp = e.into_response();
            assert_eq!(resp.status(), status);
            assert_eq!(resp.headers()[CONTENT_TYPE], "application/json");
            let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16)
                .await
                .unwrap();
            let got: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn the_code_list_is_exactly_what_the_variants_answer() {
        let codes = ApiError::codes();
        let answered: Vec<(StatusCode, &str)> = one_of_each()
            .iter()
            .map(|e| (e.status(), e.code()))
            .collect();
        for pair in &answered {
            assert!(
                codes.contains(pair),
                "{pair:?} is answered but missing from ApiError::codes"
            );
        }
        for pair in &codes {
            assert!(
                answered.contains(pair),
                "{pair:?} is in ApiError::codes but no variant answers it"
            );
        }
    }
}
