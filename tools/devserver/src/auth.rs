//! API Gateway's JWT authorizer, played locally.
//!
//! In AWS the HTTP API verifies the token and hands the function a request context with the
//! claims; the function never sees a raw credential it would have to trust. Here the same
//! happens in a middleware in front of the very routers the Lambdas run: verify the HS256
//! bearer token, attach [`request_context`] (with the claims, or without any when the token is
//! missing or invalid, so the handlers' `Identity` extractor answers 401 exactly as it would in
//! AWS), and strip the `Authorization` header so no handler can be tempted to read it. Then,
//! once the router has matched a route, [`check_route`] answers what the authorizer answers
//! for that route's row of `functions/routes.toml` (401 without a valid token, 403 without one
//! of its scopes) before the handler runs, as API Gateway refuses before the function runs.

use axum::body::Bytes;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use lambda_http::request::RequestContext;
use seckill_shared::http::auth::{request_context, Identity, JwtVerifier};
use seckill_shared::http::extract::with_fallbacks;
use seckill_shared::http::routes;
use std::sync::Arc;

/// The one local app: the entry and admin routers merged, each of their routes behind its
/// scope check ([`check_route`]), plus `GET /openapi.json`, all behind the authorizer. Each
/// router brings its own 404 answer (axum merges only one): they are reset and the same one is
/// put on the whole, so an unknown path is the error JSON whichever router would have had it.
pub fn app(entry: Router, admin: Router, verifier: JwtVerifier) -> Router {
    let document = Bytes::from(crate::openapi::render());
    let serve_document = get(move || {
        let document = document.clone();
        async move { ([(CONTENT_TYPE, "application/json")], document) }
    });
    let merged = entry
        .reset_fallback()
        .merge(admin.reset_fallback())
        .route_layer(middleware::from_fn(check_route))
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

/// The authorizer's decision on the matched route (its row of `functions/routes.toml`, by the
/// pattern the router matched): refused with the error JSON every route answers, or let
/// through with the route's scopes the token holds in the context (`jwt.scopes`, as API
/// Gateway fills it). A route the table lacks passes unchecked: `route_table_tests` below fails
/// on any route of the two routers without a row.
pub async fn check_route(mut req: Request, next: Next) -> Response {
    let row = req
        .extensions()
        .get::<MatchedPath>()
        .and_then(|matched| routes::route(req.method().as_str(), matched.as_str()));
    let Some(row) = row else {
        return next.run(req).await;
    };
    let ctx = req.extensions_mut().get_mut::<RequestContext>();
    let identity = ctx.as_deref().and_then(Identity::from_context);
    match row.admit(identity.as_ref()) {
        Ok(held) => {
            if let Some(RequestContext::ApiGatewayV2(ctx)) = ctx {
                if let Some(jwt) = ctx.authorizer.as_mut().and_then(|a| a.jwt.as_mut()) {
                    jwt.scopes = (!held.is_empty()).then_some(held);
                }
            }
            next.run(req).await
        }
        Err(refused) => refused.into_response(),
    }
}

#[cfg(test)]
mod route_table_tests {
    use std::collections::BTreeSet;

    /// (METHOD, path) of every operation of an OpenAPI document: the routers' own listing of
    /// what they serve (each router is built from its `api()`).
    fn operations(doc: utoipa::openapi::OpenApi) -> BTreeSet<(String, String)> {
        let json = serde_json::to_value(doc).expect("a document serializes");
        let mut out = BTreeSet::new();
        for (path, item) in json["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("a path item").keys() {
                out.insert((method.to_uppercase(), path.clone()));
            }
        }
        out
    }

    #[test]
    fn every_route_of_both_routers_has_its_row_and_every_row_its_route() {
        let mut served = operations(seckill_entry::api().into_openapi());
        served.extend(operations(admin::api().into_openapi()));
        let rows: BTreeSet<(String, String)> = seckill_shared::http::routes::all()
            .map(|(m, p, _)| (m.to_string(), p.to_string()))
            .collect();
        assert!(served.len() >= 13, "{served:?}");
        let missing: Vec<_> = served.difference(&rows).collect();
        assert!(
            missing.is_empty(),
            "routes without a row in functions/routes.toml (say there what API Gateway asks of \
             a caller, and give template.yaml's event the same Auth): {missing:?}"
        );
        let stale: Vec<_> = rows.difference(&served).collect();
        assert!(stale.is_empty(), "rows of no route: {stale:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use seckill_shared::http::auth::Identity;
    use tower::ServiceExt;

    const SECRET: &str = "auth-test-secret";

    /// A route that needs an identity, behind the authorizer: the entry and admin handlers'
    /// `Identity` extractor, without their services.
    fn whoami() -> Router {
        Router::new()
            .route("/me", get(|who: Identity| async move { who.user_id }))
            .layer(middleware::from_fn_with_state(
                Arc::new(JwtVerifier::new(SECRET).unwrap()),
                authorize,
            ))
    }

    /// A token for alice valid for an hour, with `nbf` this many seconds from now (none: no
    /// `nbf` claim).
    fn token(nbf_from_now: Option<i64>) -> String {
        let now = chrono::Utc::now().timestamp();
        let mut claims = serde_json::json!({ "sub": "alice", "exp": now + 3600, "iat": now });
        if let Some(d) = nbf_from_now {
            claims["nbf"] = (now + d).into();
        }
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
        )
        .unwrap()
    }

    async fn get_me(token: &str) -> (StatusCode, String) {
        let req = Request::get("/me")
            .header(AUTHORIZATION, format!("Bearer {token}"))
            .body(Body::empty())
            .unwrap();
        let resp = whoami().oneshot(req).await.unwrap();
        let status = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn a_token_not_valid_yet_is_unauthorized() {
        let (status, body) = get_me(&token(Some(60))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["error"], "unauthorized", "{body}");
    }

    #[tokio::test]
    async fn a_token_whose_nbf_has_passed_or_lies_within_the_leeway_is_accepted() {
        for nbf in [None, Some(-60), Some(0), Some(3)] {
            let (status, body) = get_me(&token(nbf)).await;
            assert_eq!(
                (status, body.as_str()),
                (StatusCode::OK, "alice"),
                "nbf {nbf:?}"
            );
        }
    }
}
