//! The error every HTTP function answers with: JSON `{"error": code, "message": text}`.
//!
//! Each variant documents its status. Internal errors are logged with their cause and sent to
//! the client as a bare 500: no SQL, no hostnames, no secrets leave the process.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400 `bad_request`: malformed JSON, wrong types, unknown fields, bad ids, oversized body.
    #[error("{0}")]
    BadRequest(String),
    /// 400 `quantity_exceeds_limit`: more than the activity's per-order limit.
    #[error("quantity {quantity} exceeds the per-order limit of {limit}")]
    QuantityExceedsLimit { quantity: i64, limit: i64 },
    /// 400 `quantity_exceeds_limit` when the limit is only known to the Lua script.
    #[error("quantity exceeds the per-order limit")]
    QuantityOverLimit,
    /// 401 `unauthorized`: no, malformed, expired or badly signed token.
    #[error("{0}")]
    Unauthorized(String),
    /// 403 `forbidden`: a valid token without the needed scope.
    #[error("{0}")]
    Forbidden(String),
    /// 404 `not_found`: unknown activity or order, or someone else's order.
    #[error("{0}")]
    NotFound(String),
    /// 409 `not_started`.
    #[error("the sale has not started yet")]
    NotStarted,
    /// 409 `ended`.
    #[error("the sale has ended")]
    Ended,
    /// 409 `sold_out`.
    #[error("sold out")]
    SoldOut,
    /// 409 `already_purchased`: one order per user per activity.
    #[error("you already hold an order for this activity")]
    AlreadyPurchased,
    /// 409 `busy`: the activity's admin lock is held by someone else.
    #[error("the activity is being changed by someone else; retry shortly")]
    Busy,
    /// 409 `stale_token`: a fencing token lower than one the database has seen.
    #[error("{0}")]
    StaleToken(String),
    /// 409 `conflict`: the request contradicts the current state (e.g. paying a cancelled order).
    #[error("{0}")]
    Conflict(String),
    /// 503 `unavailable`: Redis, the queue or the database is out of reach; safe to retry.
    #[error("{0}")]
    Unavailable(String),
    /// 500 `internal`: logged with its cause, answered without details.
    #[error("internal error")]
    Internal(#[from] anyhow::Error),
}

#[derive(Serialize)]
struct Body<'a> {
    error: &'a str,
    message: String,
}

impl ApiError {
    /// The stable machine-readable code clients switch on.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "bad_request",
            ApiError::QuantityExceedsLimit { .. } | ApiError::QuantityOverLimit => {
                "quantity_exceeds_limit"
            }
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::NotFound(_) => "not_found",
            ApiError::NotStarted => "not_started",
            ApiError::Ended => "ended",
            ApiError::SoldOut => "sold_out",
            ApiError::AlreadyPurchased => "already_purchased",
            ApiError::Busy => "busy",
            ApiError::StaleToken(_) => "stale_token",
            ApiError::Conflict(_) => "conflict",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Internal(_) => "internal",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_)
            | ApiError::QuantityExceedsLimit { .. }
            | ApiError::QuantityOverLimit => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::NotStarted
            | ApiError::Ended
            | ApiError::SoldOut
            | ApiError::AlreadyPurchased
            | ApiError::Busy
            | ApiError::StaleToken(_)
            | ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A 503 for a dependency that is out of reach; the cause is logged, not sent.
    pub fn unavailable(what: &str, cause: impl std::fmt::Display) -> Self {
        tracing::warn!(dependency = what, error = %cause, "dependency unavailable");
        ApiError::Unavailable(format!("{what} is unavailable; retry shortly"))
    }
}

impl From<crate::cache::CacheError> for ApiError {
    fn from(e: crate::cache::CacheError) -> Self {
        ApiError::unavailable("redis", e)
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        if crate::db::is_transient(&e) {
            ApiError::unavailable("database", e)
        } else {
            ApiError::Internal(anyhow::Error::new(e).context("database query failed"))
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if let ApiError::Internal(e) = &self {
            tracing::error!(error = ?e, "internal error");
        }
        let body = Body {
            error: self.code(),
            message: self.to_string(),
        };
        (status, Json(body)).into_response()
    }
}

/// Turns axum's JSON and path rejections into our 400 with a message saying what is wrong.
pub fn rejection_to_bad_request(rejection: impl std::fmt::Display) -> ApiError {
    ApiError::BadRequest(rejection.to_string())
}
