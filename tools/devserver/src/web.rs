//! What the dev server adds for a browser, around the merged app of [`crate::app`]:
//!
//! - the storefront (`GET /`, `web/index.html`), the operator page (`GET /ops.html`) and their
//!   assets (`GET /assets/*`), embedded in the binary at build time, outside the JWT check,
//!   each with `Cache-Control: no-cache` and the policy of [`content_security_policy`] (the
//!   page's own origin, and Stripe.js's with the `stripe` provider);
//! - `POST /dev/token` `{"user": "alice", "admin": false}` → `{"token", "user", "expiresIn"}`:
//!   a token signed with the dev secret, as `make token` signs it, so the pages can sign a
//!   name in. Only on a loopback address (off loopback tokens are the only thing between a
//!   client and the admin routes), and never in a Lambda router;
//! - the purchase answers counted into [`admin::ops::PurchaseCounts`], which `GET /admin/ops`
//!   reads (the entry's own counters are flushed to its metrics, not kept).

use admin::ops::PurchaseCounts;
use axum::extract::{Request, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS};
use axum::http::{HeaderName, HeaderValue, Method};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use seckill_shared::http::auth::{issued_scope, mint};
use seckill_shared::http::extract::JsonBody;
use seckill_shared::infra::payments::PaymentSettings;
use seckill_shared::ApiError;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// One embedded file of `web/`.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

macro_rules! web_file {
    ($file:literal) => {
        include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../web/", $file))
    };
}

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

/// Every file the pages load; anything else under `/assets/` is the usual 404.
const ASSETS: &[Asset] = &[
    Asset {
        path: "/",
        content_type: HTML,
        body: web_file!("index.html"),
    },
    Asset {
        path: "/index.html",
        content_type: HTML,
        body: web_file!("index.html"),
    },
    Asset {
        path: "/ops.html",
        content_type: HTML,
        body: web_file!("ops.html"),
    },
    Asset {
        path: "/assets/app.js",
        content_type: JS,
        body: web_file!("assets/app.js"),
    },
    Asset {
        path: "/assets/storefront/state.js",
        content_type: JS,
        body: web_file!("assets/storefront/state.js"),
    },
    Asset {
        path: "/assets/storefront/api.js",
        content_type: JS,
        body: web_file!("assets/storefront/api.js"),
    },
    Asset {
        path: "/assets/storefront/view.js",
        content_type: JS,
        body: web_file!("assets/storefront/view.js"),
    },
    Asset {
        path: "/assets/storefront/render.js",
        content_type: JS,
        body: web_file!("assets/storefront/render.js"),
    },
    Asset {
        path: "/assets/storefront/buyer.js",
        content_type: JS,
        body: web_file!("assets/storefront/buyer.js"),
    },
    Asset {
        path: "/assets/storefront/card.js",
        content_type: JS,
        body: web_file!("assets/storefront/card.js"),
    },
    Asset {
        path: "/assets/ops.js",
        content_type: JS,
        body: web_file!("assets/ops.js"),
    },
    Asset {
        path: "/assets/style.css",
        content_type: CSS,
        body: web_file!("assets/style.css"),
    },
];

/// The pages' own origin only: no inline script, nothing fetched from elsewhere.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
    style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
    form-action 'self'; frame-ancestors 'none'";

/// Stripe.js's own origin.
pub const STRIPE_JS_ORIGIN: &str = "https://js.stripe.com";
/// The other origin Stripe documents Stripe.js's frames come from.
pub const STRIPE_HOOKS_ORIGIN: &str = "https://hooks.stripe.com";

/// The pages' policy for these payment settings: [`CONTENT_SECURITY_POLICY`], and with the
/// `stripe` provider what Stripe.js needs besides, as Stripe documents it: its script and its
/// frames from PAYMENT_JS_URL's origin (and from [`STRIPE_HOOKS_ORIGIN`] when that origin is
/// Stripe's own), its calls to PAYMENT_API_BASE's origin. Against a local fake on one origin
/// (localstripe) that origin is all it adds.
pub fn content_security_policy(payments: &PaymentSettings) -> String {
    let Some(origins) = payments.browser_origins() else {
        return CONTENT_SECURITY_POLICY.to_string();
    };
    let mut frames = vec![origins.script.as_str()];
    if origins.script == STRIPE_JS_ORIGIN {
        frames.push(STRIPE_HOOKS_ORIGIN);
    }
    format!(
        "default-src 'self'; script-src 'self' {script}; style-src 'self'; \
         img-src 'self' data:; connect-src 'self' {api}; frame-src {frames}; base-uri 'none'; \
         form-action 'self'; frame-ancestors 'none'",
        script = origins.script,
        api = origins.api,
        frames = frames.join(" "),
    )
}

/// How long a token from `POST /dev/token` lives: a working day.
pub const DEV_TOKEN_TTL_SECS: u64 = 8 * 3600;

/// `app` plus the pages (served with the policy `csp`), the purchase counter and (when
/// `mint_tokens`) `POST /dev/token`.
pub fn storefront(app: Router, jwt_secret: &str, mint_tokens: bool, csp: &str) -> Router {
    let counts = Arc::new(PurchaseCounts::default());
    let csp = HeaderValue::from_str(csp).expect("a policy is header-safe text");
    let mut pages = Router::new();
    for asset in ASSETS {
        let csp = csp.clone();
        pages = pages.route(asset.path, get(move || serve(asset, csp)));
    }
    if mint_tokens {
        let secret: Arc<str> = Arc::from(jwt_secret);
        pages = pages.route("/dev/token", post(dev_token).with_state(secret));
    }
    app.layer(middleware::from_fn_with_state(
        counts.clone(),
        count_purchases,
    ))
    .merge(pages)
    .layer(Extension(counts))
}

async fn serve(asset: &'static Asset, csp: HeaderValue) -> Response {
    let headers = [
        (CONTENT_TYPE, HeaderValue::from_static(asset.content_type)),
        (CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (HeaderName::from_static("content-security-policy"), csp),
    ];
    (headers, asset.body).into_response()
}

/// Counts each answer to `POST /activities/{id}/orders` by its status; every other request
/// passes untouched.
async fn count_purchases(
    State(counts): State<Arc<PurchaseCounts>>,
    req: Request,
    next: Next,
) -> Response {
    if req.method() != Method::POST || !is_purchase(req.uri().path()) {
        return next.run(req).await;
    }
    let response = next.run(req).await;
    counts.count(response.status().as_u16());
    response
}

/// `/activities/<id>/orders`, as the entry router routes it.
fn is_purchase(path: &str) -> bool {
    path.strip_prefix("/activities/")
        .and_then(|rest| rest.strip_suffix("/orders"))
        .is_some_and(|id| !id.is_empty() && !id.contains('/'))
}

/// `POST /dev/token` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenRequest {
    user: String,
    #[serde(default)]
    admin: bool,
}

/// `POST /dev/token` answer.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct TokenAnswer {
    token: String,
    user: String,
    /// Seconds until the token expires.
    expires_in: u64,
}

/// The longest user name `POST /dev/token` signs.
pub const MAX_USER_LEN: usize = 64;

/// A user name the pages may sign in as: 1 to [`MAX_USER_LEN`] ASCII letters, digits, `.`,
/// `_`, `-` or `@`.
pub fn valid_user(user: &str) -> bool {
    (1..=MAX_USER_LEN).contains(&user.len())
        && user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@'))
}

async fn dev_token(
    State(secret): State<Arc<str>>,
    JsonBody(req): JsonBody<TokenRequest>,
) -> Result<Json<TokenAnswer>, ApiError> {
    if !valid_user(&req.user) {
        return Err(ApiError::BadRequest(format!(
            "user must be 1 to {MAX_USER_LEN} letters, digits, '.', '_', '-' or '@', got {:?}",
            req.user
        )));
    }
    // What the user pool issues: `seckill:user`, and `seckill:admin` too for an operator.
    let scope = issued_scope(req.admin);
    let token = mint(&secret, &req.user, &scope, DEV_TOKEN_TTL_SECS).map_err(ApiError::Internal)?;
    tracing::info!(user = %req.user, admin = req.admin, "dev token minted");
    Ok(Json(TokenAnswer {
        token,
        user: req.user,
        expires_in: DEV_TOKEN_TTL_SECS,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_purchase_route_is_counted() {
        for path in ["/activities/1/orders", "/activities/42/orders"] {
            assert!(is_purchase(path), "{path}");
        }
        for path in [
            "/activities/1/orders/me",
            "/activities//orders",
            "/activities/1",
            "/orders/1/pay",
            "/activities/1/x/orders",
        ] {
            assert!(!is_purchase(path), "{path}");
        }
    }

    #[test]
    fn user_names_are_short_and_plain() {
        for ok in [
            "alice",
            "ops",
            "buyer-2",
            "a.b_c@d",
            &"x".repeat(MAX_USER_LEN),
        ] {
            assert!(valid_user(ok), "{ok}");
        }
        for bad in [
            "",
            " alice",
            "a b",
            "é",
            "<script>",
            &"x".repeat(MAX_USER_LEN + 1),
        ] {
            assert!(!valid_user(bad), "{bad}");
        }
    }

    async fn post_token(router: Router) -> axum::http::StatusCode {
        use tower::ServiceExt;
        let req = axum::http::Request::post("/dev/token")
            .header(CONTENT_TYPE, "application/json")
            .body(axum::body::Body::from(r#"{"user":"alice"}"#))
            .unwrap();
        router.oneshot(req).await.unwrap().status()
    }

    #[tokio::test]
    async fn tokens_are_minted_only_when_asked_to() {
        let app = || Router::new().route("/health", get(|| async { "ok" }));
        assert_eq!(
            post_token(storefront(app(), "s", true, CONTENT_SECURITY_POLICY)).await,
            200
        );
        // Off loopback the route does not exist at all.
        assert_eq!(
            post_token(storefront(app(), "s", false, CONTENT_SECURITY_POLICY)).await,
            404
        );
    }

    #[tokio::test]
    async fn purchase_answers_reach_the_counts_the_app_sees() {
        use tower::ServiceExt;
        let app = Router::new()
            .route(
                "/activities/{id}/orders",
                post(|| async { axum::http::StatusCode::ACCEPTED }),
            )
            .route(
                "/counts",
                get(|Extension(c): Extension<Arc<PurchaseCounts>>| async move {
                    c.snapshot().purchases_accepted.to_string()
                }),
            );
        let router = storefront(app, "s", false, CONTENT_SECURITY_POLICY);
        for _ in 0..2 {
            let req = axum::http::Request::post("/activities/7/orders")
                .body(axum::body::Body::empty())
                .unwrap();
            router.clone().oneshot(req).await.unwrap();
        }
        let req = axum::http::Request::get("/counts")
            .body(axum::body::Body::empty())
            .unwrap();
        let body = router.oneshot(req).await.unwrap().into_body();
        let bytes = axum::body::to_bytes(body, 64).await.unwrap();
        assert_eq!(&bytes[..], b"2");
    }

    /// The policy's directives, each with its sources.
    fn directives(policy: &str) -> std::collections::BTreeMap<String, Vec<String>> {
        policy
            .split(';')
            .filter_map(|d| {
                let mut words = d.split_whitespace().map(str::to_string);
                Some((words.next()?, words.collect()))
            })
            .collect()
    }

    fn payments(args: &[&str]) -> PaymentSettings {
        #[derive(clap::Parser)]
        struct Args {
            #[command(flatten)]
            payments: PaymentSettings,
        }
        let argv = ["devserver"].iter().chain(args);
        <Args as clap::Parser>::try_parse_from(argv)
            .expect("valid settings")
            .payments
    }

    #[test]
    fn the_pages_allow_stripe_js_only_with_the_stripe_provider() {
        let stripe = |js: &str, api: &str| {
            let args = ["--payment-provider", "stripe", "--payment-js-url", js];
            directives(&content_security_policy(&payments(
                &[&args[..], &["--payment-api-base", api]].concat(),
            )))
        };
        let own = directives(CONTENT_SECURITY_POLICY);
        let local = payments(&["--payment-provider", "local"]);
        assert_eq!(directives(&content_security_policy(&local)), own);

        // Stripe's own: what Stripe documents, and nothing else changes.
        let mut want = own.clone();
        let add = |want: &mut std::collections::BTreeMap<String, Vec<String>>, d: &str, s: &str| {
            want.entry(d.to_string())
                .or_default()
                .extend(s.split(' ').map(str::to_string))
        };
        add(&mut want, "script-src", "https://js.stripe.com");
        add(&mut want, "connect-src", "https://api.stripe.com");
        add(
            &mut want,
            "frame-src",
            "https://js.stripe.com https://hooks.stripe.com",
        );
        assert_eq!(
            stripe("https://js.stripe.com/v3/", "https://api.stripe.com"),
            want
        );

        // localstripe: its one origin, and nothing of Stripe's.
        let mut want = own;
        let fake = "http://127.0.0.1:8420";
        add(&mut want, "script-src", fake);
        add(&mut want, "connect-src", fake);
        add(&mut want, "frame-src", fake);
        assert_eq!(stripe(&format!("{fake}/js.stripe.com/v3/"), fake), want);
    }

    #[test]
    fn every_page_and_asset_is_embedded() {
        for asset in ASSETS {
            assert!(!asset.body.is_empty(), "{}", asset.path);
        }
        let index = std::str::from_utf8(ASSETS[0].body).unwrap();
        assert!(index.contains("/assets/app.js"), "index.html loads app.js");
    }
}
