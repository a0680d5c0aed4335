//! `GET /health` and `GET /health/deep`.
//!
//! `/health` is liveness: the function runs and routes, nothing more, so it does no I/O at
//! all and a load balancer or an uptime probe polling it costs Redis and the database nothing.
//! It also tells the function's clock (`serverTime`, never cached), so a page can count down
//! to a sale's start on the server's clock rather than the browser's.
//! `/health/deep` asks each dependency once (Redis `PING`, a database round trip, the order
//! queues' `GetQueueAttributes`), concurrently and each within [`DEEP_CHECK_TIMEOUT`], and
//! answers 503 when any did not answer. Its answer is kept per container for
//! [`DEEP_CHECK_CACHE`] (concurrent callers share one check), so a flood of it costs the
//! dependencies three calls per period; a 503 names nothing (the log does), so it tells a
//! caller nothing about what stands behind the API. In AWS only IAM-signed callers reach it.

use crate::EntryState;
use aws_sdk_sqs::types::QueueAttributeName;
use axum::extract::State;
use axum::http::header::CACHE_CONTROL;
use axum::response::IntoResponse;
use axum::Json;
use chrono::{SecondsFormat, Utc};
use seckill_shared::http::error::ErrorBody;
use seckill_shared::ApiError;
use serde::Serialize;
use std::future::Future;
use std::time::{Duration, Instant};

/// The longest one dependency may take to answer the deep check (less when its own timeout
/// is shorter), so the check answers well within the function's timeout.
pub const DEEP_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a container answers the deep check from its last one.
pub const DEEP_CHECK_CACHE: Duration = Duration::from_secs(5);

/// The last deep check of this container: when it ran, and its answer (`None`: a dependency
/// was out of reach).
#[derive(Default)]
pub(crate) struct DeepCache {
    last: tokio::sync::Mutex<Option<(Instant, Option<DeepHealth>)>>,
}

/// 200 body of `GET /health`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Health {
    #[schema(example = "ok")]
    status: &'static str,
    /// The function's clock when it answered: RFC 3339, UTC, milliseconds.
    #[schema(example = "2026-12-01T12:00:00.123Z")]
    server_time: String,
}

/// `Cache-Control` of `GET /health`: the clock it tells is stale at once.
pub const HEALTH_CACHE: &str = "no-store";

#[utoipa::path(
    get,
    path = "/health",
    tag = "health",
    operation_id = "health",
    summary = "Liveness: 200 whenever the function runs (no I/O, no token needed)",
    responses(
        (status = 200, description = "The function answers, with its clock; dependencies are not asked (see `/health/deep`); `Cache-Control: no-store`", body = Health),
    )
)]
pub(crate) async fn health() -> impl IntoResponse {
    let body = Health {
        status: "ok",
        server_time: Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true),
    };
    ([(CACHE_CONTROL, HEALTH_CACHE)], Json(body))
}

/// One dependency's answer to the deep check.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    #[schema(example = "ok")]
    status: &'static str,
    /// How long it took to answer.
    latency_ms: u64,
}

/// 200 body of `GET /health/deep`: every dependency answered.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct DeepHealth {
    #[schema(example = "ok")]
    status: &'static str,
    redis: Check,
    database: Check,
    queue: Check,
}

#[utoipa::path(
    get,
    path = "/health/deep",
    tag = "health",
    operation_id = "deepHealth",
    summary = "Readiness: asks Redis, the database and the order queues, at most once per 5 s per container (IAM-signed callers only in AWS)",
    responses(
        (status = 200, description = "Each dependency answered within its bound", body = DeepHealth),
        (status = 503, description = "A dependency is out of reach (`unavailable`; which one is logged, not answered)", body = ErrorBody),
    )
)]
pub(crate) async fn deep_health(
    State(state): State<EntryState>,
) -> Result<Json<DeepHealth>, ApiError> {
    let mut last = state.inner.deep.last.lock().await;
    let answer = match &*last {
        Some((at, answer)) if at.elapsed() < DEEP_CHECK_CACHE => answer.clone(),
        _ => {
            let answer = deep_check(&state).await;
            *last = Some((Instant::now(), answer.clone()));
            answer
        }
    };
    answer
        .map(Json)
        .ok_or_else(|| ApiError::Unavailable("a dependency is out of reach".into()))
}

/// Asks each dependency once; `None` when any did not answer (each failure logged).
async fn deep_check(state: &EntryState) -> Option<DeepHealth> {
    let s = &state.inner;
    let config = &s.config;
    let ping = redis::cmd("PING");
    let (redis, database, queue) = tokio::join!(
        check(config.redis_timeout, async {
            s.redis.cmd::<String>(&ping).await.map(drop)
        }),
        check(
            config.db_acquire_timeout,
            seckill_shared::infra::db::ping(&s.pool)
        ),
        check(config.sqs_timeout, async {
            // The orders' queue, then the entries' when it is another.
            let (orders, entries) = (&s.queues.orders, &s.queues.entries);
            for q in std::iter::once(orders).chain((entries.url != orders.url).then_some(entries)) {
                q.client
                    .get_queue_attributes()
                    .queue_url(&q.url)
                    .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
                    .send()
                    .await
                    .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(e).to_string())?;
            }
            Ok::<(), String>(())
        }),
    );
    let answers = [
        ("redis", &redis),
        ("database", &database),
        ("queue", &queue),
    ];
    let mut down = Vec::new();
    for (name, answer) in answers {
        if let Err(cause) = answer {
            // The cause stays in the log: it may name hosts.
            tracing::warn!(dependency = name, error = %cause, "deep health check failed");
            down.push(name);
        }
    }
    match (redis, database, queue) {
        (Ok(redis), Ok(database), Ok(queue)) => Some(DeepHealth {
            status: "ok",
            redis,
            database,
            queue,
        }),
        _ => {
            tracing::warn!(down = %down.join(", "), "deep health check: out of reach");
            None
        }
    }
}

/// Runs one dependency's probe within its own timeout, capped at [`DEEP_CHECK_TIMEOUT`].
async fn check<E: std::fmt::Display>(
    own_timeout: Duration,
    probe: impl Future<Output = Result<(), E>>,
) -> Result<Check, String> {
    let bound = own_timeout.min(DEEP_CHECK_TIMEOUT);
    let started = Instant::now();
    match tokio::time::timeout(bound, probe).await {
        Ok(Ok(())) => Ok(Check {
            status: "ok",
            latency_ms: started.elapsed().as_millis() as u64,
        }),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {bound:?}")),
    }
}
