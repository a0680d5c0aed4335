//! No way around the edge: with the edge on, CloudFront adds the origin secret to every
//! request it sends the HTTP API (`x-origin-verify`), and [`guard`] refuses any request without
//! one of the accepted values (403) before a handler runs, so before any Redis or database
//! work. A call to the raw execute-api URL skips neither the WAF nor the edge cache. Exempt:
//! `GET /health/deep`, which IAM-signed monitors call on the execute-api URL itself.

use crate::http::error::ApiError;
use crate::infra::config::{EdgeOrigin, OriginValue};
use crate::infra::secret::ExposeSecret;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The header CloudFront sends the origin secret in.
pub const HEADER: &str = "x-origin-verify";

/// The one path reached without the edge.
pub const EXEMPT: &str = "/health/deep";

/// `router` behind the origin check, when `origin` accepts any value; else `router` as is.
pub fn guard(router: Router, origin: &EdgeOrigin) -> Router {
    let accepted = origin.accepted();
    if accepted.is_empty() {
        return router;
    }
    router.layer(middleware::from_fn_with_state(Arc::new(accepted), check))
}

async fn check(
    State(accepted): State<Arc<Vec<OriginValue>>>,
    req: Request,
    next: Next,
) -> Response {
    if req.uri().path() == EXEMPT {
        return next.run(req).await;
    }
    let given = req.headers().get(HEADER).map(|v| v.as_bytes());
    // Compared in constant time, each accepted value whole; a previous value only until its
    // end.
    let now = chrono::Utc::now();
    let known = given.is_some_and(|given| {
        accepted
            .iter()
            .any(|a| bool::from(a.value.expose_secret().as_bytes().ct_eq(given)) && a.valid_at(now))
    });
    if known {
        next.run(req).await
    } else {
        ApiError::Forbidden("this API is served through its edge only".into()).into_response()
    }
}
