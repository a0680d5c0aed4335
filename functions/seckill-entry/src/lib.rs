//! `seckill-entry`: the HTTP function every click of a sale reaches.
//!
//! A purchase is decided by one Lua script on Redis (`lua/purchase.lua`): window open, quantity
//! within the limit, stock left, user not yet holding an order. An accepted purchase leaves a
//! pending reservation in the activity's ledger and is sent to SQS as an [`OrderMessage`]; the
//! caller gets 202 at once and the order consumer writes the order. If the send fails the
//! reservation is compensated (guarded by its ledger entry, so at most once) and the caller
//! gets 503: nothing was sold, retrying is safe.
//!
//! In front of Redis sit two cheap guards, both per container: a sold-out cache (once Redis
//! said `sold_out`, the same answer comes from memory for `sold_out_cache_ttl`, so a sold-out
//! flood does not reach Redis) and a small circuit breaker (after a run of Redis failures,
//! answer 503 at once for a moment instead of waiting out a timeout per request).
//!
//! The same [`router`] runs in Lambda (`lambda_http::run`) and in the local dev server.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use seckill_shared::activity::{self, MAX_PER_ORDER_LIMIT};
use seckill_shared::auth::Identity;
use seckill_shared::cache::Redis;
use seckill_shared::http::{ActivityId, JsonBody, OrderId};
use seckill_shared::lifecycle::{self, CancelOutcome};
use seckill_shared::order::{self, OrderStatus};
use seckill_shared::queue::{self, OrderMessage, OrderQueue};
use seckill_shared::sale::{self, Compensation, Decision, EntryKind};
use seckill_shared::{db, ApiError, Config};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::Span;
use uuid::Uuid;

/// The name this function reports its metrics under.
pub const FUNCTION: &str = "seckill-entry";

/// Everything a request needs, built once per container. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct EntryState {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    redis: Redis,
    pool: PgPool,
    queue: OrderQueue,
    sold_out: SoldOutCache,
    breaker: Breaker,
    counters: Counters,
}

impl EntryState {
    pub fn new(config: Config, redis: Redis, pool: PgPool, queue: OrderQueue) -> Self {
        let breaker = Breaker::new(config.redis_timeout);
        Self {
            inner: Arc::new(Inner {
                sold_out: SoldOutCache::new(config.sold_out_cache_ttl),
                config,
                redis,
                pool,
                queue,
                breaker,
                counters: Counters::default(),
            }),
        }
    }

    /// Builds the clients a cold start needs: Redis (connected, bounded), a lazy pool (the hot
    /// path never touches the database) and the SQS client from the AWS environment.
    pub async fn connect(config: &Config) -> anyhow::Result<Self> {
        let redis = Redis::connect(config).await?;
        let pool = db::connect_lazy(config)?;
        let client = queue::sqs_client().await;
        let queue = OrderQueue::new(client, config.order_queue_url.clone(), config.sqs_timeout);
        Ok(Self::new(config.clone(), redis, pool, queue))
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    pub fn redis(&self) -> &Redis {
        &self.inner.redis
    }

    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }
}

/// The function's HTTP API (paths as API Gateway routes them). Unknown routes answer 404 and
/// wrong methods 405, both as error JSON.
pub fn router(state: EntryState) -> Router {
    Router::new()
        .route("/activities/{activityId}/orders", post(purchase))
        .route("/activities/{activityId}/orders/me", get(my_order))
        .route("/activities/{activityId}", get(public_activity))
        .route("/orders/{orderId}/pay", post(pay))
        .route("/orders/{orderId}/cancel", post(cancel))
        .route("/health", get(health))
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async {
            let body = json!({"error": "method_not_allowed", "message": "method not allowed on this route"});
            (StatusCode::METHOD_NOT_ALLOWED, Json(body))
        })
        .with_state(state)
}

/// The purchase body: `{"quantity": n}`, `quantity` optional (default 1). A `userId` is
/// accepted and ignored: identity comes only from the verified token. Any other field, a
/// repeated field, or anything but a JSON object is refused, so a typo (`"quantiy"`) is not
/// silently read as the default and `[1]` is not read as a body (serde's derive would).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurchaseBody {
    pub quantity: i64,
}

impl<'de> Deserialize<'de> for PurchaseBody {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = PurchaseBody;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(r#"an object like {"quantity": 1}"#)
            }

            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut map: M,
            ) -> Result<Self::Value, M::Error> {
                use serde::de::Error;
                let mut quantity = None;
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    match key.as_ref() {
                        "quantity" if quantity.is_some() => {
                            return Err(M::Error::duplicate_field("quantity"))
                        }
                        "quantity" => quantity = Some(map.next_value::<i64>()?),
                        "userId" => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                        other => {
                            return Err(M::Error::unknown_field(other, &["quantity", "userId"]))
                        }
                    }
                }
                Ok(PurchaseBody {
                    quantity: quantity.unwrap_or(1),
                })
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

/// 202 body of an accepted purchase.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Accepted {
    request_id: Uuid,
    status: &'static str,
}

#[tracing::instrument(skip_all, fields(activity_id, request_id, outcome))]
async fn purchase(
    State(state): State<EntryState>,
    identity: Identity,
    ActivityId(activity_id): ActivityId,
    JsonBody(body): JsonBody<PurchaseBody>,
) -> Result<Response, ApiError> {
    let span = Span::current();
    span.record("activity_id", activity_id);
    let quantity = body.quantity;
    if !(1..=MAX_PER_ORDER_LIMIT).contains(&quantity) {
        return Err(ApiError::BadRequest(format!(
            "quantity must be an integer between 1 and {MAX_PER_ORDER_LIMIT}, got {quantity}"
        )));
    }
    let s = &state.inner;

    if s.sold_out.refuses(activity_id, quantity) {
        // A sold-out flood is the common case here: keep it to a counter, not a log line.
        s.counters.reject(Rejection::SoldOutCached);
        return Err(ApiError::SoldOut);
    }
    if s.breaker.is_open() {
        s.counters.reject(Rejection::Unavailable);
        return Err(ApiError::Unavailable(
            "redis is unavailable; retry shortly".into(),
        ));
    }

    let request_id = Uuid::now_v7();
    span.record("request_id", tracing::field::display(request_id));
    let decision = match sale::purchase(
        &s.redis,
        activity_id,
        &identity.user_id,
        quantity,
        request_id,
    )
    .await
    {
        Ok(d) => {
            s.breaker.success();
            d
        }
        Err(e) => {
            s.breaker.failure();
            s.counters.reject(Rejection::Unavailable);
            span.record("outcome", "unavailable");
            tracing::info!("purchase refused");
            return Err(e.into());
        }
    };
    span.record("outcome", decision.outcome());

    let (stock_left, now_ms) = match decision {
        Decision::Accepted { stock_left, now_ms } => (stock_left, now_ms),
        refused => {
            if let Decision::SoldOut { stock_left } = refused {
                s.sold_out.remember(activity_id, stock_left);
            }
            s.counters.reject(Rejection::from(refused));
            // Refusals are the bulk of a sale's traffic: they are counted (EMF, every 10 s),
            // and logged one by one only at debug, so a flood does not pay for a log line each.
            tracing::debug!("purchase refused");
            return Err(refusal(refused));
        }
    };
    if stock_left == 0 {
        // The next request would be refused by Redis anyway: answer it from memory.
        s.sold_out.remember(activity_id, 0);
    }

    let message = OrderMessage {
        request_id,
        activity_id,
        user_id: identity.user_id.clone(),
        quantity: quantity as i32,
        reserved_at_ms: now_ms,
    };
    if let Err(send_error) = s.queue.send(&message).await {
        span.record("outcome", "compensated");
        seckill_shared::pause::point("entry.after_send_error", activity_id).await;
        // The message may or may not be on the queue; either way the reservation is given
        // back once (the ledger entry guards it) and a late consumer finds no reservation.
        let compensated = sale::compensate(
            &s.redis,
            activity_id,
            &identity.user_id,
            request_id,
            Compensation::Full,
        )
        .await;
        s.sold_out.forget(activity_id);
        s.counters.compensation();
        match compensated {
            Ok(qty) => {
                tracing::warn!(error = %send_error, given_back = ?qty, "send failed; reservation compensated")
            }
            Err(e) => tracing::error!(error = %send_error, compensation_error = %e,
                "send failed and compensation failed; reconcile returns the reservation after its grace period"),
        }
        return Err(ApiError::unavailable("order queue", send_error));
    }

    s.counters.accept();
    tracing::info!(quantity, stock_left, "purchase accepted");
    Ok((
        StatusCode::ACCEPTED,
        Json(Accepted {
            request_id,
            status: "pending",
        }),
    )
        .into_response())
}

/// The documented error of each refusal.
fn refusal(decision: Decision) -> ApiError {
    match decision {
        Decision::NotFound => ApiError::NotFound("no such activity on sale".into()),
        Decision::NotStarted => ApiError::NotStarted,
        Decision::Ended => ApiError::Ended,
        Decision::QuantityExceedsLimit => ApiError::QuantityOverLimit,
        Decision::SoldOut { .. } => ApiError::SoldOut,
        Decision::AlreadyPurchased => ApiError::AlreadyPurchased,
        Decision::Accepted { .. } => {
            ApiError::Internal(anyhow::anyhow!("an accepted purchase is not a refusal"))
        }
    }
}

/// `GET /activities/{id}/orders/me`: where the caller's purchase is.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MyOrder {
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order_id: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantity: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

async fn my_order(
    State(state): State<EntryState>,
    identity: Identity,
    ActivityId(activity_id): ActivityId,
) -> Result<Json<MyOrder>, ApiError> {
    let s = &state.inner;
    // The ledger first: the consumer commits the order before it drops the entry, so a
    // reservation missing here is either in the database already or was given back.
    let entry = sale::ledger_entry(&s.redis, activity_id, &identity.user_id).await?;
    if let Some(e) = entry.filter(|e| e.kind == EntryKind::Reservation) {
        return Ok(Json(MyOrder {
            status: "pending".into(),
            request_id: e.request_id(),
            quantity: Some(e.quantity),
            ..MyOrder::default()
        }));
    }
    let Some(o) = order::latest_for_user(&s.pool, activity_id, &identity.user_id).await? else {
        return Ok(Json(MyOrder {
            status: "none".into(),
            ..MyOrder::default()
        }));
    };
    Ok(Json(MyOrder {
        reason: (o.status == OrderStatus::Failed.as_str())
            .then(|| o.failure_reason.clone())
            .flatten(),
        status: o.status,
        request_id: Some(o.request_id),
        order_id: Some(o.id),
        quantity: Some(i64::from(o.quantity)),
    }))
}

/// `GET /activities/{id}`: what anyone may see of a sale.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PublicActivity {
    pub id: i64,
    pub title: String,
    pub start_at: chrono::DateTime<chrono::Utc>,
    pub end_at: chrono::DateTime<chrono::Utc>,
    pub remaining_stock: i64,
    pub state: &'static str,
}

async fn public_activity(
    State(state): State<EntryState>,
    ActivityId(activity_id): ActivityId,
) -> Result<Json<PublicActivity>, ApiError> {
    let s = &state.inner;
    let a = activity::get(&s.pool, activity_id)
        .await?
        .filter(|a| a.state != "draft")
        .ok_or_else(|| ApiError::NotFound(format!("activity {activity_id} not found")))?;
    // Redis has the live figure; before preheat, after expiry or while Redis is out of reach
    // the database's (which lags by the pending reservations) is the best there is.
    let remaining_stock = match sale::stock(&s.redis, activity_id).await {
        Ok(Some(stock)) => stock.max(0),
        Ok(None) => i64::from(a.remaining_stock),
        Err(e) => {
            tracing::warn!(error = %e, "redis stock unavailable; answering the database's");
            i64::from(a.remaining_stock)
        }
    };
    Ok(Json(PublicActivity {
        id: a.id,
        state: a.phase(chrono::Utc::now()).as_str(),
        title: a.title,
        start_at: a.start_at,
        end_at: a.end_at,
        remaining_stock,
    }))
}

async fn pay(
    State(state): State<EntryState>,
    identity: Identity,
    OrderId(order_id): OrderId,
) -> Result<Json<order::Order>, ApiError> {
    let order = lifecycle::pay_order(
        &state.inner.pool,
        order_id,
        &identity.user_id,
        chrono::Utc::now(),
    )
    .await?;
    Ok(Json(order))
}

/// 200 body of a cancel: `releasedQuantity` is 0 for a repeated cancel.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Cancelled {
    order_id: i64,
    status: &'static str,
    released_quantity: i64,
}

async fn cancel(
    State(state): State<EntryState>,
    identity: Identity,
    OrderId(order_id): OrderId,
) -> Result<Json<Cancelled>, ApiError> {
    let s = &state.inner;
    let order = lifecycle::owned_order(&s.pool, order_id, &identity.user_id).await?;
    let outcome = lifecycle::cancel_order(&s.pool, &s.redis, &order, chrono::Utc::now()).await?;
    let released_quantity = match outcome {
        CancelOutcome::Cancelled { quantity } => {
            // Units came back: this container must not keep answering sold_out from memory.
            s.sold_out.forget(order.activity_id);
            quantity
        }
        CancelOutcome::AlreadyCancelled => 0,
        CancelOutcome::NotCancellable(status) => {
            return Err(ApiError::Conflict(format!(
                "order {order_id} is {status} and cannot be cancelled"
            )))
        }
        CancelOutcome::Busy => return Err(ApiError::Busy),
    };
    Ok(Json(Cancelled {
        order_id,
        status: "cancelled",
        released_quantity,
    }))
}

/// `GET /health`: 200 when Redis and the database answer, 503 otherwise.
async fn health(State(state): State<EntryState>) -> Result<Json<serde_json::Value>, ApiError> {
    let s = &state.inner;
    let _: String = s.redis.cmd(&redis::cmd("PING")).await?;
    let db = tokio::time::timeout(
        s.config.db_acquire_timeout,
        sqlx::query_scalar::<_, i32>("select 1").fetch_one(&s.pool),
    )
    .await;
    match db {
        Ok(Ok(_)) => Ok(Json(json!({"status": "ok"}))),
        Ok(Err(e)) => Err(ApiError::unavailable("database", e)),
        Err(_) => Err(ApiError::unavailable("database", "timed out")),
    }
}

/// Per-container memory of "Redis said sold out": activity -> (units Redis had left, when).
/// A request asking for more than that is refused without reaching Redis while the memory is
/// fresh. The memory is short because stock comes back (cancellations, compensations).
struct SoldOutCache {
    ttl: Duration,
    seen: Mutex<HashMap<i64, (i64, Instant)>>,
}

impl SoldOutCache {
    fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            seen: Mutex::new(HashMap::new()),
        }
    }

    fn refuses(&self, activity_id: i64, quantity: i64) -> bool {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        matches!(seen.get(&activity_id), Some((left, at)) if quantity > *left && at.elapsed() < self.ttl)
    }

    fn remember(&self, activity_id: i64, stock_left: i64) {
        if self.ttl.is_zero() {
            return;
        }
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        // Drop stale entries now and then so a long-lived container does not collect them.
        if seen.len() > 1024 {
            seen.retain(|_, (_, at)| at.elapsed() < self.ttl);
        }
        seen.insert(activity_id, (stock_left, Instant::now()));
    }

    fn forget(&self, activity_id: i64) {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&activity_id);
    }
}

/// A small circuit breaker in front of Redis: after [`Breaker::THRESHOLD`] failures in a row it
/// opens for a cooldown, during which requests get 503 at once instead of each waiting out the
/// Redis timeout (which would pile up concurrent Lambda invocations, each billed for the wait).
/// After the cooldown requests go through again; the first success closes it.
struct Breaker {
    base: Instant,
    cooldown: Duration,
    failures: AtomicU32,
    /// Milliseconds since `base` until which the breaker is open; 0 = closed.
    open_until_ms: AtomicU64,
}

impl Breaker {
    const THRESHOLD: u32 = 5;

    fn new(redis_timeout: Duration) -> Self {
        Self {
            base: Instant::now(),
            cooldown: (redis_timeout * 3).clamp(Duration::from_millis(500), Duration::from_secs(5)),
            failures: AtomicU32::new(0),
            open_until_ms: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64
    }

    fn is_open(&self) -> bool {
        let until = self.open_until_ms.load(Ordering::Relaxed);
        until != 0 && self.now_ms() < until
    }

    fn success(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
            self.open_until_ms.store(0, Ordering::Relaxed);
        }
    }

    fn failure(&self) {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= Self::THRESHOLD {
            let until = self.now_ms() + self.cooldown.as_millis() as u64;
            self.open_until_ms.store(until.max(1), Ordering::Relaxed);
            tracing::warn!(failures, cooldown = ?self.cooldown, "redis circuit breaker open");
        }
    }
}

/// Why a purchase was refused, for the aggregated metrics.
#[derive(Clone, Copy, Debug)]
enum Rejection {
    SoldOut,
    SoldOutCached,
    AlreadyPurchased,
    NotStarted,
    Ended,
    NotFound,
    QuantityExceedsLimit,
    Unavailable,
}

impl Rejection {
    const ALL: [Rejection; 8] = [
        Rejection::SoldOut,
        Rejection::SoldOutCached,
        Rejection::AlreadyPurchased,
        Rejection::NotStarted,
        Rejection::Ended,
        Rejection::NotFound,
        Rejection::QuantityExceedsLimit,
        Rejection::Unavailable,
    ];

    fn metric(self) -> &'static str {
        match self {
            Rejection::SoldOut => "RejectedSoldOut",
            Rejection::SoldOutCached => "RejectedSoldOutCached",
            Rejection::AlreadyPurchased => "RejectedAlreadyPurchased",
            Rejection::NotStarted => "RejectedNotStarted",
            Rejection::Ended => "RejectedEnded",
            Rejection::NotFound => "RejectedNotFound",
            Rejection::QuantityExceedsLimit => "RejectedQuantityExceedsLimit",
            Rejection::Unavailable => "RejectedUnavailable",
        }
    }
}

impl From<Decision> for Rejection {
    fn from(d: Decision) -> Self {
        match d {
            // `Accepted` is never a rejection; it is listed only to keep the match exhaustive.
            Decision::SoldOut { .. } | Decision::Accepted { .. } => Rejection::SoldOut,
            Decision::AlreadyPurchased => Rejection::AlreadyPurchased,
            Decision::NotStarted => Rejection::NotStarted,
            Decision::Ended => Rejection::Ended,
            Decision::NotFound => Rejection::NotFound,
            Decision::QuantityExceedsLimit => Rejection::QuantityExceedsLimit,
        }
    }
}

/// Purchase counters, aggregated in memory and written as one EMF line at most every
/// [`Counters::FLUSH_EVERY`] (by whichever request notices), so a flood of refusals costs an
/// atomic increment each, not a log line each.
#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    compensations: AtomicU64,
    rejected: [AtomicU64; Rejection::ALL.len()],
    last_flush_ms: AtomicU64,
    base: std::sync::OnceLock<Instant>,
}

impl Counters {
    const FLUSH_EVERY: Duration = Duration::from_secs(10);

    fn accept(&self) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
        self.maybe_flush();
    }

    fn compensation(&self) {
        self.compensations.fetch_add(1, Ordering::Relaxed);
        self.maybe_flush();
    }

    fn reject(&self, why: Rejection) {
        self.rejected[why as usize].fetch_add(1, Ordering::Relaxed);
        self.maybe_flush();
    }

    fn maybe_flush(&self) {
        let now = self.base.get_or_init(Instant::now).elapsed().as_millis() as u64;
        let last = self.last_flush_ms.load(Ordering::Relaxed);
        if now < last + Self::FLUSH_EVERY.as_millis() as u64 {
            return;
        }
        // One request wins the right to flush this period.
        if self
            .last_flush_ms
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let mut counters = vec![
            ("Accepted", self.accepted.swap(0, Ordering::Relaxed) as f64),
            (
                "Compensations",
                self.compensations.swap(0, Ordering::Relaxed) as f64,
            ),
        ];
        for why in Rejection::ALL {
            counters.push((
                why.metric(),
                self.rejected[why as usize].swap(0, Ordering::Relaxed) as f64,
            ));
        }
        if counters.iter().any(|(_, n)| *n > 0.0) {
            seckill_shared::metrics::emit(FUNCTION, &counters, &[]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sold_out_memory_refuses_only_what_it_cannot_serve_and_only_while_fresh() {
        let cache = SoldOutCache::new(Duration::from_millis(50));
        cache.remember(1, 2);
        assert!(cache.refuses(1, 3));
        assert!(!cache.refuses(1, 2), "two units may still be there");
        assert!(!cache.refuses(2, 1), "other activities are unaffected");
        std::thread::sleep(Duration::from_millis(60));
        assert!(!cache.refuses(1, 3), "stale memory asks Redis again");
    }

    #[test]
    fn breaker_opens_after_a_run_of_failures_and_closes_on_success() {
        let b = Breaker::new(Duration::from_millis(100));
        for _ in 0..Breaker::THRESHOLD - 1 {
            b.failure();
        }
        assert!(!b.is_open());
        b.failure();
        assert!(b.is_open());
        b.success();
        assert!(!b.is_open());
    }

    #[test]
    fn purchase_body_ignores_user_id_and_refuses_other_fields() {
        let ok: PurchaseBody =
            serde_json::from_str(r#"{"quantity":2,"userId":"mallory"}"#).unwrap();
        assert_eq!(ok.quantity, 2);
        let default: PurchaseBody = serde_json::from_str("{}").unwrap();
        assert_eq!(default.quantity, 1);
        assert!(serde_json::from_str::<PurchaseBody>(r#"{"quantiy":2}"#).is_err());
        assert!(serde_json::from_str::<PurchaseBody>(r#"{"quantity":"2"}"#).is_err());
        assert!(serde_json::from_str::<PurchaseBody>(r#"{"quantity":1.5}"#).is_err());
        assert!(serde_json::from_str::<PurchaseBody>("[1]").is_err());
        assert!(serde_json::from_str::<PurchaseBody>(r#"{"quantity":1,"quantity":2}"#).is_err());
    }
}
