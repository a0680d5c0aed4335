//! API Gateway's JWT authorizer, played locally.
//!
//! In AWS the HTTP API verifies the token and hands the function a request context with the
//! claims; the function never sees a raw credential it would have to trust. Here the same
//! happens in a middleware in front of the very routers the Lambdas run: verify the HS256
//! bearer token, attach [`request_context`] (with the claims, or without any when the token is
//! missing or invalid, so the handlers' `Identity` extractor answers 401 exactly as it would in
//! AWS), and strip the `Authorization` header so no handler can be tempted to read it.

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use seckill_shared::auth::{request_context, JwtVerifier};
use seckill_shared::http::with_fallbacks;
use std::sync::Arc;

/// The one local app: the entry and admin routers merged, plus `GET /openapi.json`, behind the
/// authorizer. Each router brings its own 404 answer (axum merges only one): they are reset and
/// the same one is put on the whole, so an unknown path is the error JSON whichever router
/// would have had it.
pub fn app(entry: Router, admin: Router, verifier: JwtVerifier) -> Router {
    let document = Bytes::from(crate::openapi::render());
    let serve_document = get(move || {
        let document = document.clone();
        async move { ([(CONTENT_TYPE, "application/json")], document) }
    });
    let merged = entry
        .reset_fallback()
        .merge(admin.reset_fallback())
        .route("/openapi.json", serve_document);
    with_fallbacks(merged).layer(middleware::from_fn_with_state(
        Arc::new(verifier),
        authorize,
    ))
}

/// Verifies the bearer token, if any, and attaches the request context the handlers read.
pub async fn authorize(
    State(verifier): State<Arc<JwtVerifier>>,
    mut req: Request,
    next: Next,
) -> Response {
    let header = req.headers_mut().remove(AUTHORIZATION);
    let claims = match header.as_ref().map(|h| h.to_str()) {
        None => None,
        Some(Ok(value)) => match verifier.verify_header(Some(value)) {
            Ok(claims) => Some(claims),
            Err(e) => {
                tracing::debug!(error = %e, "rejected bearer token");
                None
            }
        },
        Some(Err(_)) => {
            tracing::debug!("authorization header is not visible ASCII");
            None
        }
    };
    let ctx = request_context(claims.as_ref(), req.method().as_str(), req.uri().path());
    // Replaces anything already there: identity comes from this verification only.
    req.extensions_mut().insert(ctx);
    next.run(req).await
}
