//! What cost what on the entry's refusal path: each candidate timed alone, one call at a time
//! on one thread (its own current-thread runtime), in its former shape and its present one,
//! with the allocations one call makes (counted by [`crate::alloc`]). The former shapes are
//! rebuilt here from the same crates, so both sides run in the same binary and run.

use crate::alloc::allocations;
use axum::body::Body;
use axum::extract::Path;
use axum::http::{Request, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use seckill_shared::http::auth::request_context;
use seckill_shared::http::auth::Claims;
use seckill_shared::http::auth::Identity;
use seckill_shared::http::error::ErrorBody;
use seckill_shared::http::extract::ActivityId;
use seckill_shared::ApiError;
use seckill_shared::Refusal;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, RwLock};
use std::time::Instant;
use tower::ServiceExt;

/// One shape of a candidate: µs and allocations per call.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Variant {
    pub what: String,
    pub us: f64,
    pub allocations: f64,
}

/// A candidate cost: its former shape and, where it changed, its present one.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cost {
    pub candidate: String,
    pub before: Variant,
    pub after: Option<Variant>,
}

/// Calls per timed candidate.
const CALLS: usize = 50_000;

/// Every candidate, on a thread of its own. `sold_out` is the entry router and a request
/// factory for a refusal it answers from memory (the sold-out cache warm).
pub async fn measure<F>(sold_out: Router, request: F) -> anyhow::Result<Vec<Cost>>
where
    F: Fn(usize) -> Request<Body> + Send + 'static,
{
    Ok(tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime");
        rt.block_on(all(sold_out, request))
    })
    .await?)
}

async fn all<F: Fn(usize) -> Request<Body>>(sold_out: Router, request: F) -> Vec<Cost> {
    let mut costs = vec![
        span(),
        request_id(),
        refusal_body().await,
        identity(),
        path_id().await,
        sold_out_cache(),
        counters(),
    ];
    costs.push(Cost {
        candidate: "the whole router, a cached sold-out refusal (request built beforehand)".into(),
        before: handler(sold_out, request).await,
        after: None,
    });
    for c in &costs {
        eprintln!(
            "  {:<60} {:>7.3} µs {:>5.1} allocs{}",
            c.candidate,
            c.before.us,
            c.before.allocations,
            c.after
                .as_ref()
                .map(|a| format!("  -> {:.3} µs {:.1} allocs", a.us, a.allocations))
                .unwrap_or_default()
        );
    }
    costs
}

fn variant(what: &str, us: f64, allocations: f64) -> Variant {
    Variant {
        what: what.into(),
        us,
        allocations,
    }
}

/// µs and allocations per call of `f`, over [`CALLS`] calls.
fn time(what: &str, mut f: impl FnMut(usize)) -> Variant {
    for i in 0..CALLS / 10 {
        f(i);
    }
    let a = allocations();
    let t = Instant::now();
    for i in 0..CALLS {
        f(i);
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / CALLS as f64;
    variant(what, us, (allocations() - a) as f64 / CALLS as f64)
}

/// [`time`] for an async call.
async fn time_async<Fut: std::future::Future<Output = ()>>(
    what: &str,
    calls: usize,
    mut f: impl FnMut(usize) -> Fut,
) -> Variant {
    let a = allocations();
    let t = Instant::now();
    for i in 0..calls {
        f(i).await;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / calls as f64;
    variant(what, us, (allocations() - a) as f64 / calls as f64)
}

/// The purchase span with its three fields recorded, as `#[instrument]` at info made it, under
/// the bench's subscriber (JSON at info, as in Lambda), against the same span at debug level.
fn span() -> Cost {
    use tracing::field::{display, Empty};
    let id = uuid::Uuid::now_v7();
    let record = |span: tracing::Span| {
        let _entered = span.enter();
        span.record("activity_id", 1_i64);
        span.record("request_id", display(id));
        span.record("outcome", "already_purchased");
    };
    let before = time("info span, three fields recorded", |_| {
        record(tracing::info_span!(
            "purchase",
            activity_id = Empty,
            request_id = Empty,
            outcome = Empty
        ))
    });
    let after = time("debug span (off at info)", |_| {
        record(tracing::debug_span!(
            "purchase",
            activity_id = Empty,
            request_id = Empty,
            outcome = Empty
        ))
    });
    Cost {
        candidate: "per-request tracing span".into(),
        before,
        after: Some(after),
    }
}

/// The request id the script gets: v7 (kept) and v4, each with its string form.
fn request_id() -> Cost {
    let v7 = time("Uuid::now_v7 + to_string (kept)", |_| {
        std::hint::black_box(uuid::Uuid::now_v7().to_string());
    });
    let v4 = time("Uuid::new_v4 + to_string", |_| {
        std::hint::black_box(uuid::Uuid::new_v4().to_string());
    });
    Cost {
        candidate: format!("request id (v4 for comparison: {:.3} µs)", v4.us),
        before: v7,
        after: None,
    }
}

/// A refusal's answer, body read: serde_json of the error struct per refusal, against the
/// body serialised once per refusal code.
async fn refusal_body() -> Cost {
    let refusal = Refusal::AlreadyPurchased;
    let before = time_async(
        "serde_json of ErrorBody per refusal",
        CALLS,
        |_| async move {
            let e = ApiError::from(refusal);
            let body = ErrorBody {
                error: e.code(),
                message: e.to_string(),
            };
            let resp = (StatusCode::CONFLICT, Json(body)).into_response();
            let _ = axum::body::to_bytes(resp.into_body(), 1 << 16).await;
        },
    )
    .await;
    let after = time_async(
        "pre-serialised body per refusal code",
        CALLS,
        |_| async move {
            let resp = ApiError::from(refusal).into_response();
            let _ = axum::body::to_bytes(resp.into_body(), 1 << 16).await;
        },
    )
    .await;
    Cost {
        candidate: "refusal error body".into(),
        before,
        after: Some(after),
    }
}

/// The caller's identity from the API Gateway request context's JWT claims.
fn identity() -> Cost {
    let claims = Claims {
        sub: "user-0000001".into(),
        scope: String::new(),
        exp: u64::MAX / 2,
        iat: 0,
    };
    let ctx = request_context(Some(&claims), "POST", "/activities/1/orders");
    Cost {
        candidate: "request context -> identity (claims lookup)".into(),
        before: time("Identity::from_context", |_| {
            std::hint::black_box(Identity::from_context(&ctx));
        }),
        after: None,
    }
}

/// A router with one route and the id extractor, request built in the loop: the former
/// `Path<HashMap<String, String>>` against `RawPathParams` (in `ActivityId` now).
async fn path_id() -> Cost {
    let path = "/activities/{activityId}/orders";
    let map = Router::new().route(
        path,
        post(|Path(p): Path<HashMap<String, String>>| async move {
            match p.get("activityId").map(|v| v.parse::<i64>()) {
                Some(Ok(id)) if id > 0 => StatusCode::NO_CONTENT,
                _ => StatusCode::BAD_REQUEST,
            }
        }),
    );
    let raw = Router::new().route(
        path,
        post(|ActivityId(_): ActivityId| async { StatusCode::NO_CONTENT }),
    );
    let call = |router: Router| {
        move |_| {
            let router = router.clone();
            async move {
                let req = Request::post("/activities/42/orders")
                    .body(Body::empty())
                    .expect("a valid request");
                let resp = router.oneshot(req).await.expect("infallible");
                assert_eq!(resp.status(), StatusCode::NO_CONTENT);
            }
        }
    };
    let before = time_async("Path<HashMap<String, String>>", CALLS, call(map)).await;
    let after = time_async("RawPathParams", CALLS, call(raw)).await;
    Cost {
        candidate: "router + path id extractor (request built in the loop)".into(),
        before,
        after: Some(after),
    }
}

/// The sold-out cache's read on one thread: the former mutex against the read lock.
fn sold_out_cache() -> Cost {
    let entry = (0_i64, Instant::now());
    let mutex = Mutex::new(HashMap::from([(1_i64, entry)]));
    let rwlock = RwLock::new(HashMap::from([(1_i64, entry)]));
    let ttl = std::time::Duration::from_secs(1);
    let fresh = |e: Option<&(i64, Instant)>| matches!(e, Some((left, at)) if 1 > *left && at.elapsed() < ttl);
    let before = time("Mutex<HashMap>", |_| {
        std::hint::black_box(fresh(mutex.lock().expect("unpoisoned").get(&1)));
    });
    let after = time("RwLock<HashMap> read", |_| {
        std::hint::black_box(fresh(rwlock.read().expect("unpoisoned").get(&1)));
    });
    Cost {
        candidate: "sold-out cache read (one thread, no contention)".into(),
        before,
        after: Some(after),
    }
}

/// The purchase counters' work per request: an atomic increment and the flush-time check.
fn counters() -> Cost {
    let n = AtomicU64::new(0);
    let last = AtomicU64::new(0);
    let base = OnceLock::new();
    Cost {
        candidate: "metrics counters (increment + flush check)".into(),
        before: time("atomic add + clock read", |_| {
            n.fetch_add(1, Ordering::Relaxed);
            let now = base.get_or_init(Instant::now).elapsed().as_millis() as u64;
            std::hint::black_box(now < last.load(Ordering::Relaxed) + 10_000);
        }),
        after: None,
    }
}

/// The entry router answering a refusal from memory, one request at a time.
async fn handler<F: Fn(usize) -> Request<Body>>(router: Router, request: F) -> Variant {
    let calls = CALLS / 5;
    let requests: Vec<Request<Body>> = (0..calls).map(request).collect();
    let mut unexpected = 0;
    let a = allocations();
    let t = Instant::now();
    for req in requests {
        let resp = router.clone().oneshot(req).await.expect("infallible");
        unexpected += usize::from(resp.status() != StatusCode::CONFLICT);
        let _ = axum::body::to_bytes(resp.into_body(), 1 << 16).await;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / calls as f64;
    if unexpected > 0 {
        eprintln!("  ! the sold-out router answered {unexpected} requests with another status");
    }
    variant(
        "seckill_entry::router, body read",
        us,
        (allocations() - a) as f64 / calls as f64,
    )
}
