//! `seckill-entry`: the HTTP function every click of a sale reaches.
//!
//! A purchase is decided by one Lua script on Redis (`lua/purchase.lua`): window open, quantity
//! within the limit, stock left, user not yet holding an order. An accepted purchase leaves a
//! pending reservation in the activity's ledger and is sent to SQS as an [`OrderMessage`]; the
//! caller gets 202 at once and the order consumer writes the order. If the send fails the
//! reservation is given back through the database's arbiter (`seckill_shared::giveback`): the
//! request is claimed as `failed` first, so a consumer that got the message anyway can no
//! longer commit it, and the caller gets 503: nothing was sold, retrying is safe. If the
//! consumer committed first, the caller gets the 202 it earned.
//!
//! A 503 means nothing happened, also when Redis stalls: the script carries the caller's
//! deadline on the Redis clock ([`ClockSkew`] estimates the offset) and refuses to act after
//! it, and a script whose answer arrived too late is claimed through the arbiter before the
//! 503 and given back at once (or, if Redis is still stalled, by a background retry while the
//! container runs, and by reconcile's next run at the latest).
//!
//! In front of Redis sit two cheap guards, both per container: a sold-out cache (once Redis
//! said `sold_out`, the same answer comes from memory for `sold_out_cache_ttl`, so a sold-out
//! flood does not reach Redis) and a small circuit breaker (after a run of Redis failures,
//! answer 503 at once for a moment instead of waiting out a timeout per request).
//!
//! The public view (`GET /activities/{id}`, [`view`]) is read from Redis behind a short
//! per-container cache, never from the database while the sale is loaded; `GET /health` is a
//! liveness answer with no I/O and `GET /health/deep` asks every dependency ([`health`]).
//!
//! The same [`router`] runs in Lambda (`lambda_http::run`) and in the local dev server; [`api`]
//! is its routes with their OpenAPI description, from each handler's `#[utoipa::path]`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use seckill_shared::activity::{self, MAX_PER_ORDER_LIMIT};
use seckill_shared::auth::Identity;
use seckill_shared::buckets::Entered;
use seckill_shared::cache::{CacheError, Redis};
use seckill_shared::error::ErrorBody;
use seckill_shared::giveback::{self, Claim, GiveBackError};
use seckill_shared::http::{with_fallbacks, ActivityId, JsonBody, OrderId};
use seckill_shared::keys::Bucket;
use seckill_shared::lifecycle::{self, CancelOutcome};
use seckill_shared::order::{self, reason, OrderStatus};
use seckill_shared::queue::{self, OrderMessage, OrderQueue};
use seckill_shared::sale::{self, Compensation, EntryKind, Reservation};
use seckill_shared::{buckets, draw, ApiError, Config, Deps, Refusal};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tracing::Span;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

pub mod health;
pub mod view;

pub use health::{DeepHealth, Health};
pub use view::PublicActivity;

/// The name this function reports its metrics under.
pub const FUNCTION: &str = "seckill-entry";

/// Everything a request needs, built once per container. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct EntryState {
    inner: Arc<Inner>,
}

/// The [`Deps`] (read through `Deref`: `s.config`, `s.redis`, `s.pool`) and what only the entry
/// has: the queue and the per-container caches.
struct Inner {
    deps: Deps,
    queue: OrderQueue,
    sold_out: SoldOutCache,
    bucket_counts: BucketCounts,
    unloaded: UnloadedCache,
    view: view::ViewCache,
    breaker: Breaker,
    skew: ClockSkew,
    counters: Counters,
}

impl std::ops::Deref for Inner {
    type Target = Deps;

    fn deref(&self) -> &Deps {
        &self.deps
    }
}

impl EntryState {
    pub fn new(deps: Deps, queue: OrderQueue) -> Self {
        let config = &deps.config;
        Self {
            inner: Arc::new(Inner {
                sold_out: SoldOutCache::new(config.sold_out_cache_ttl),
                bucket_counts: BucketCounts::default(),
                unloaded: UnloadedCache::default(),
                view: view::ViewCache::new(config.public_view_cache_ttl),
                skew: ClockSkew::default(),
                breaker: Breaker::new(config.redis_timeout),
                deps,
                queue,
                counters: Counters::default(),
            }),
        }
    }

    /// Builds the clients a cold start needs: Redis (connected, bounded), a lazy pool (the hot
    /// path never touches the database) and the SQS client from the AWS environment.
    pub async fn connect(config: Config) -> anyhow::Result<Self> {
        let deps = Deps::connect(config).await?;
        let client = queue::sqs_client().await;
        let config = &deps.config;
        let queue = OrderQueue::new(client, config.order_queue_url.clone(), config.sqs_timeout);
        Ok(Self::new(deps, queue))
    }

    pub fn config(&self) -> &Config {
        &self.inner.deps.config
    }

    pub fn redis(&self) -> &Redis {
        &self.inner.deps.redis
    }

    pub fn pool(&self) -> &PgPool {
        &self.inner.deps.pool
    }
}

/// The schemas a handler names by reference rather than by type.
#[derive(utoipa::OpenApi)]
#[openapi(components(schemas(PurchaseBody)))]
struct Schemas;

/// The function's HTTP API (paths as API Gateway routes them). Unknown routes answer 404 and
/// wrong methods 405, both as error JSON.
pub fn router(state: EntryState) -> Router {
    let (routes, _) = api().split_for_parts();
    with_fallbacks(routes).with_state(state)
}

/// The routes of [`router`] with their OpenAPI description (`docs/openapi.json`).
pub fn api() -> OpenApiRouter<EntryState> {
    OpenApiRouter::with_openapi(<Schemas as utoipa::OpenApi>::openapi())
        .routes(routes!(purchase))
        .routes(routes!(my_order))
        .routes(routes!(view::public_activity))
        .routes(routes!(pay))
        .routes(routes!(cancel))
        .routes(routes!(health::health))
        .routes(routes!(health::deep_health))
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

/// The OpenAPI schema of [`PurchaseBody`], written out because its `Deserialize` is.
impl utoipa::PartialSchema for PurchaseBody {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{
            AdditionalProperties, KnownFormat, ObjectBuilder, SchemaFormat, SchemaType, Type,
        };
        let quantity = ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(1))
            .maximum(Some(MAX_PER_ORDER_LIMIT as isize))
            .default(Some(1.into()))
            .description(Some(
                "Units to buy, at most the activity's per-order limit (400 \
                 `quantity_exceeds_limit` above it).",
            ));
        let user_id = ObjectBuilder::new()
            .schema_type(SchemaType::AnyValue)
            .description(Some(
                "Accepted and ignored: the buyer is the token's `sub`, never the body.",
            ));
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .property("quantity", quantity)
            .property("userId", user_id)
            .additional_properties(Some(
                AdditionalProperties::<utoipa::openapi::schema::Schema>::FreeForm(false),
            ))
            .into()
    }
}

impl utoipa::ToSchema for PurchaseBody {}

/// 202 body of an accepted purchase.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Accepted {
    /// Follow it with `GET /activities/{activityId}/orders/me`.
    request_id: Uuid,
    /// `pending`: reserved in Redis, the order is being written. `queued`: a draw sale's
    /// window is open and the purchase is in its pool; the draw at the window's end decides,
    /// and `GET …/orders/me` tells (`pending` for a winner, then `confirmed`; `not_drawn`).
    #[schema(example = "pending")]
    status: &'static str,
}

#[utoipa::path(
    post,
    path = "/activities/{activityId}/orders",
    tag = "purchase",
    operation_id = "purchase",
    summary = "Buy: one Redis script decides at once, the order is written behind the queue",
    params(ActivityId),
    // A ref, not the type: the body is optional (empty means `{"quantity": 1}`), and naming
    // `Option<PurchaseBody>` would document a JSON `null` as accepted, which it is not.
    request_body(content = ref("#/components/schemas/PurchaseBody"), description = "Optional: an empty body means `{\"quantity\": 1}`."),
    security(("bearer" = [])),
    responses(
        (status = 202, description = "Reserved (`pending`; the order consumer writes the order), or in a draw sale's pool (`queued`)", body = Accepted),
        (status = 400, description = "Bad body or id (`bad_request`), or more than the per-order limit (`quantity_exceeds_limit`)", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such published activity", body = ErrorBody),
        (status = 409, description = "Outside the window (`not_started`, `ended`), `sold_out`, or `already_purchased` (also a second entry in a draw, and a draw's loser)", body = ErrorBody),
        (status = 429, description = "More attempts this second than the sale's per-user rate (`rate_limited`); `Retry-After` says when to retry", body = ErrorBody),
        (status = 503, description = "Redis, the queue or the database is out of reach, or the sale is being loaded: nothing was reserved, retry", body = ErrorBody),
        (status = 500, description = "Unexpected; logged", body = ErrorBody),
    )
)]
// The span is debug-level: at info, the default, a refusal (the bulk of a sale's traffic) pays
// for no span, and the events that are logged carry the activity and request ids themselves.
#[tracing::instrument(level = "debug", skip_all, fields(activity_id, request_id, outcome))]
async fn purchase(
    State(state): State<EntryState>,
    identity: Identity,
    ActivityId(activity_id): ActivityId,
    JsonBody(body): JsonBody<PurchaseBody>,
) -> Result<Response, ApiError> {
    let span = Span::current();
    span.record("activity_id", activity_id);
    let quantity = checked_quantity(body.quantity)?;
    answer_from_memory(&state, activity_id, quantity)?;

    let request_id = Uuid::now_v7();
    span.record("request_id", tracing::field::display(request_id));
    let attempt = OrderMessage {
        request_id,
        activity_id,
        user_id: identity.user_id,
        quantity: quantity as i32,
        reserved_at_ms: 0,
        load_epoch: None,
        buckets: state.inner.bucket_counts.get(activity_id),
    };
    let mut entered = match decide(&state, &attempt).await {
        Ok(entered) => entered,
        Err(unanswered) => return unanswered.answer(),
    };
    if let Ok(Entered::DrawDue) = entered {
        run_draw(&state, activity_id).await?;
        entered = match decide(&state, &attempt).await {
            Ok(entered) => entered,
            Err(unanswered) => return unanswered.answer(),
        };
    }
    let reservation = match entered {
        Ok(Entered::Reserved(reservation)) => reservation,
        Ok(Entered::Queued { rank }) => {
            span.record("outcome", "queued");
            state.inner.counters.queue();
            tracing::debug!(activity_id, request_id = %request_id, rank, "purchase queued for the draw");
            return Ok(answer(request_id, "queued"));
        }
        // The draw ran (this call or another) and its flag is set: a second DrawDue means
        // the sale was reloaded in between. Nothing was reserved.
        Ok(Entered::DrawDue) => {
            return Err(ApiError::Unavailable(
                "the draw is running; retry shortly".into(),
            ))
        }
        Err(refusal) => return Err(refuse(&state, activity_id, refusal).await),
    };
    span.record("outcome", "accepted");
    if reservation.stock_left == 0 && reservation.buckets == 1 {
        // The next request would be refused by Redis anyway: answer it from memory. (In a
        // bucketed sale an empty home bucket says nothing of the others.)
        state.inner.sold_out.remember(activity_id, 0);
    }
    let message = OrderMessage {
        reserved_at_ms: reservation.now_ms,
        load_epoch: Some(reservation.epoch),
        buckets: (reservation.buckets > 1).then_some(reservation.buckets),
        ..attempt
    };
    send(&state, &message, reservation.stock_left).await
}

/// The quantity of a purchase body, within the range any activity's limit can take.
fn checked_quantity(quantity: i64) -> Result<i64, ApiError> {
    if (1..=MAX_PER_ORDER_LIMIT).contains(&quantity) {
        return Ok(quantity);
    }
    Err(ApiError::BadRequest(format!(
        "quantity must be an integer between 1 and {MAX_PER_ORDER_LIMIT}, got {quantity}"
    )))
}

/// The answers a container gives without asking Redis: sold out (Redis said so a moment ago)
/// and unavailable (the circuit breaker is open).
fn answer_from_memory(state: &EntryState, activity_id: i64, quantity: i64) -> Result<(), ApiError> {
    let s = &state.inner;
    if s.sold_out.refuses(activity_id, quantity) {
        // A sold-out flood is the common case here: keep it to a counter, not a log line.
        s.counters.sold_out_cached();
        return Err(Refusal::SoldOut { stock_left: 0 }.into());
    }
    if s.breaker.is_open() {
        s.counters.unavailable();
        return Err(ApiError::Unavailable(
            "redis is unavailable; retry shortly".into(),
        ));
    }
    Ok(())
}

/// Sends the accepted purchase's order message: 202 once it is on the queue, and the
/// give-back protocol when the send failed.
async fn send(
    state: &EntryState,
    message: &OrderMessage,
    stock_left: i64,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    if let Err(send_error) = s.queue.send(message).await {
        seckill_shared::pause::point("entry.after_send_error", message.activity_id).await;
        return after_send_error(state, message, send_error).await;
    }
    s.counters.accept();
    tracing::info!(
        activity_id = message.activity_id,
        request_id = %message.request_id,
        quantity = message.quantity,
        stock_left,
        "purchase accepted"
    );
    Ok(answer(message.request_id, "pending"))
}

/// The 202 of a purchase the database has or will have (`pending`), or of an entry in a
/// draw's pool (`queued`).
fn answer(request_id: Uuid, status: &'static str) -> Response {
    let body = Accepted { request_id, status };
    (StatusCode::ACCEPTED, Json(body)).into_response()
}

/// Runs the draw of a draw sale whose window has closed, and sends its winners' order
/// messages before answering: the caller, the first after the window, waits for both. A send
/// that fails leaves its winners in the outbox (reconcile and the next drainer send them);
/// a draw that cannot run is a 503, with nothing reserved.
async fn run_draw(state: &EntryState, activity_id: i64) -> Result<(), ApiError> {
    let s = &state.inner;
    if let Err(e) = draw::leave_unanswered(&s.redis, &s.pool, activity_id).await {
        tracing::warn!(activity_id, error = %e, "entries answered 503 not taken out of the pool");
    }
    let drawn = draw::draw(&s.redis, activity_id, draw::seed()).await?;
    if let draw::Drawn::Now {
        winners,
        units,
        entrants,
    } = drawn
    {
        tracing::info!(activity_id, winners, units, entrants, "draw ran");
    }
    // A crash between the draw and the sends: the outbox keeps the winners.
    if seckill_shared::pause::fail("entry.draw.before_send", activity_id) {
        return Ok(());
    }
    drain(state, activity_id).await;
    Ok(())
}

/// Sends what the outbox of a draw sale holds: one round now (the caller is answering a
/// request), the rest in the background; whatever is left then (a failure, a container
/// frozen between invocations) the next drainer or reconcile sends.
async fn drain(state: &EntryState, activity_id: i64) {
    let s = &state.inner;
    match draw::drain(&s.redis, &s.queue, activity_id, 1).await {
        Ok(d) => {
            if d.sent > 0 {
                tracing::info!(
                    activity_id,
                    sent = d.sent,
                    left = d.left,
                    "draw winners sent"
                );
            }
            if d.left > 0 && !d.busy {
                let state = state.clone();
                tokio::spawn(async move {
                    let s = &state.inner;
                    if let Err(e) = draw::drain(&s.redis, &s.queue, activity_id, usize::MAX).await {
                        tracing::warn!(activity_id, error = %e, "draw winners not all sent; the outbox keeps them");
                    }
                });
            }
        }
        Err(e) => {
            tracing::warn!(activity_id, error = %e, "draw winners not all sent; the outbox keeps them")
        }
    }
}

/// Runs the purchase script with the caller's deadline. A Redis error or timeout is a 503,
/// and since the script may have run (its answer lost or late), the reservation is claimed
/// for a give-back before the 503 goes out.
async fn decide(
    state: &EntryState,
    reservation: &OrderMessage,
) -> Result<Result<Entered, Refusal>, Unanswered> {
    let s = &state.inner;
    let r = reservation;
    let sent_ms = chrono::Utc::now().timestamp_millis();
    let deadline = s.skew.deadline(sent_ms, s.config.redis_timeout);
    let buy = buckets::Purchase {
        activity_id: r.activity_id,
        user_id: &r.user_id,
        quantity: i64::from(r.quantity),
        request_id: r.request_id,
        deadline_ms: deadline,
    };
    let known = r.buckets.unwrap_or(1);
    let mut count = known;
    let decided = buckets::enter(&s.redis, &buy, &mut count).await;
    if count != known {
        s.bucket_counts.put(r.activity_id, count);
    }
    let decided = match decided {
        Ok(_) if seckill_shared::pause::fail("entry.purchase.reply_lost", r.activity_id) => {
            Err(CacheError::Timeout(s.config.redis_timeout))
        }
        other => other,
    };
    match decided {
        Ok(d) => {
            s.breaker.success();
            if let Ok(Entered::Reserved(Reservation { now_ms, .. }))
            | Err(Refusal::Expired { now_ms }) = d
            {
                s.skew.observe(sent_ms, now_ms);
            }
            Ok(d)
        }
        Err(e) => {
            s.breaker.failure();
            s.counters.unavailable();
            Span::current().record("outcome", "unavailable");
            tracing::info!(activity_id = r.activity_id, request_id = %r.request_id, error = %e,
                "purchase script unanswered; giving back whatever it did");
            let reservation = OrderMessage {
                buckets: (count > 1).then_some(count),
                ..reservation.clone()
            };
            if give_back_unanswered(state, reservation).await {
                return Err(Unanswered::Ordered(r.request_id));
            }
            Err(Unanswered::Unavailable(e.into()))
        }
    }
}

/// A purchase whose script did not answer in time.
enum Unanswered {
    /// Claimed and given back: 503, nothing happened.
    Unavailable(ApiError),
    /// The request is an order already (a draw entry drawn, sent and committed before its
    /// answer came): 202, as it is.
    Ordered(Uuid),
}

impl Unanswered {
    fn answer(self) -> Result<Response, ApiError> {
        match self {
            Unanswered::Unavailable(e) => Err(e),
            Unanswered::Ordered(request_id) => Ok(answer(request_id, "pending")),
        }
    }
}

/// A script whose answer never arrived may still have run: claim the request in the database
/// (a `failed` row, so nothing can ever commit it) and give back what the ledger holds for it.
/// The claim is awaited (it is what makes the coming 503 true); the Redis half, which may be
/// what is stalled, is tried once and then retried in the background for a few seconds, and
/// reconcile gives back a `failed` row's reservation on its next run whatever happens here.
/// True when the claim found the request an order already: only a draw's entry can be one
/// (drawn, sent and committed before the answer of its purchase came); nothing is given back.
async fn give_back_unanswered(state: &EntryState, reservation: OrderMessage) -> bool {
    let s = &state.inner;
    match giveback::claim(&s.pool, &reservation, reason::UNAVAILABLE).await {
        Ok(Claim::Won) | Ok(Claim::UnknownActivity) => {}
        Ok(Claim::Decided(row)) if row.status != OrderStatus::Failed.as_str() => {
            tracing::warn!(request_id = %reservation.request_id, status = %row.status,
                "unanswered purchase is an order already");
            return true;
        }
        Ok(Claim::Decided(row)) => {
            tracing::error!(status = %row.status, "fresh request id already decided");
            return false;
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not claim the unanswered purchase; reconcile gives it back after its grace period");
            return false;
        }
    }
    // Between the claim and its Redis half: a draw may run meanwhile.
    seckill_shared::pause::point("entry.unanswered.after_claim", reservation.activity_id).await;
    // One attempt now, bounded by half the timeout: a lost answer from a healthy Redis is
    // undone before the 503 goes out. A stalled Redis gets the rest in the background.
    let first = tokio::time::timeout(
        s.config.redis_timeout / 2,
        compensate_unanswered(state, &reservation),
    );
    if matches!(first.await, Ok(Ok(()))) {
        return false;
    }
    let state = state.clone();
    tokio::spawn(async move {
        for attempt in 1..=GIVE_BACK_ATTEMPTS {
            tokio::time::sleep(GIVE_BACK_RETRY).await;
            match compensate_unanswered(&state, &reservation).await {
                Ok(()) => return,
                Err(e) if attempt == GIVE_BACK_ATTEMPTS => {
                    tracing::warn!(request_id = %reservation.request_id, error = %e, "give-back left to reconcile");
                }
                Err(_) => {}
            }
        }
    });
    false
}

/// The Redis half of [`give_back_unanswered`], after the claim.
async fn compensate_unanswered(state: &EntryState, r: &OrderMessage) -> Result<(), CacheError> {
    let s = &state.inner;
    // A draw sale's entry: out of the pool (or, drawn a winner, given back below).
    if r.buckets.unwrap_or(1) == 1
        && draw::leave(&s.redis, r.activity_id, &r.user_id, r.request_id).await?
    {
        tracing::warn!(request_id = %r.request_id, "late draw entry taken out of the pool");
    }
    let mode = Compensation::Full;
    let units = sale::compensate(&s.redis, r.home(), &r.user_id, r.request_id, mode).await?;
    if units.is_some() {
        s.sold_out.forget(r.activity_id);
        tracing::warn!(request_id = %r.request_id, ?units, "late purchase script given back");
    }
    Ok(())
}

/// How often, and how far apart, the entry retries giving back an unanswered script's units.
const GIVE_BACK_ATTEMPTS: u32 = 10;
const GIVE_BACK_RETRY: Duration = Duration::from_millis(500);

/// The answer to a refused purchase: counted, cached when sold out, logged only at debug.
async fn refuse(state: &EntryState, activity_id: i64, refusal: Refusal) -> ApiError {
    let s = &state.inner;
    Span::current().record("outcome", refusal.code());
    if let Refusal::SoldOut { stock_left } = refusal {
        s.sold_out.remember(activity_id, stock_left);
    }
    s.counters.refuse(refusal);
    // Refusals are the bulk of a sale's traffic: they are counted (EMF, every 10 s), and
    // logged one by one only at debug, so a flood does not pay for a log line each.
    tracing::debug!("purchase refused");
    match refusal {
        Refusal::NotFound => not_loaded(state, activity_id).await,
        other => other.into(),
    }
}

/// The send failed or timed out; the message may be on the queue all the same. The request
/// is given back through the arbiter: if this call claims it, nothing can commit it any
/// more and the caller gets 503; if the consumer committed first, the caller gets 202; if the
/// database cannot be reached, the outcome is not this call's to tell and the caller gets 202
/// with the request id to follow (the consumer commits it, or reconcile gives it back).
async fn after_send_error(
    state: &EntryState,
    message: &OrderMessage,
    send_error: queue::QueueError,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let span = Span::current();
    let (activity_id, request_id) = (message.activity_id, message.request_id);
    match giveback::give_back(&s.pool, &s.redis, message, reason::SEND_FAILED).await {
        Ok(done) if done.order().is_some() => {
            tracing::info!(activity_id, %request_id, error = %send_error, "send reported a failure but the order is in");
            s.counters.accept();
            Ok(answer(message.request_id, "pending"))
        }
        Ok(done) => {
            span.record("outcome", "compensated");
            s.sold_out.forget(message.activity_id);
            s.counters.compensation();
            tracing::warn!(activity_id, %request_id, error = %send_error, ?done, "send failed; reservation given back");
            Err(ApiError::unavailable("order queue", send_error))
        }
        Err(e @ GiveBackError::Cache(_)) => {
            // Claimed, the Redis half pending: the `failed` row makes the 503 true, and
            // reconcile applies it on its next run.
            span.record("outcome", "compensated");
            s.counters.compensation();
            tracing::warn!(activity_id, %request_id, error = %send_error, compensation_error = %e, "send failed; units go back with reconcile's next run");
            Err(ApiError::unavailable("order queue", send_error))
        }
        Err(e) => {
            span.record("outcome", "undecided");
            tracing::error!(activity_id, %request_id, error = %send_error, claim_error = %e,
                "send failed and the database is out of reach; the request stays pending");
            s.counters.accept();
            Ok(answer(message.request_id, "pending"))
        }
    }
}

/// A sale Redis does not hold answers as the database says its window stands: not started,
/// ended, or (running, about to be loaded by preheat or reconcile) unavailable. Only unknown
/// or draft ids are 404. The answer is cached per container, so a flood for an unloaded or
/// unknown id costs the database one read per id and cache period.
async fn not_loaded(state: &EntryState, activity_id: i64) -> ApiError {
    let s = &state.inner;
    let window = match s.unloaded.get(activity_id) {
        Some(window) => window,
        None => match activity::get(&s.pool, activity_id).await {
            Ok(row) => {
                let window = row
                    .filter(|a| a.state == "published")
                    .map(|a| (a.start_at, a.end_at));
                s.unloaded.put(activity_id, window);
                window
            }
            Err(e) => return ApiError::unavailable("database", e),
        },
    };
    let Some((start_at, end_at)) = window else {
        return Refusal::NotFound.into();
    };
    let now = chrono::Utc::now();
    if now < start_at {
        Refusal::NotStarted.into()
    } else if now >= end_at {
        Refusal::Ended.into()
    } else {
        ApiError::Unavailable("the sale is being loaded; retry shortly".into())
    }
}

/// `GET /activities/{id}/orders/me`: where the caller's purchase is.
#[derive(Debug, Default, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MyOrder {
    /// `none`, `queued` (in a draw sale's pool, before its draw), `pending` (reserved, the
    /// order is being written), `confirmed`, `paid`, `cancelled`, `failed` (with a `reason`),
    /// or `not_drawn` (in a draw sale's pool, and the draw passed over the entry: final).
    #[schema(example = "confirmed")]
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

#[utoipa::path(
    get,
    path = "/activities/{activityId}/orders/me",
    tag = "purchase",
    operation_id = "myOrder",
    summary = "Where the caller's purchase of this activity is",
    params(ActivityId),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The caller's reservation or latest order, or `none`", body = MyOrder),
        (status = 400, description = "Bad id (`bad_request`)", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 503, description = "Redis or the database is out of reach", body = ErrorBody),
        (status = 500, description = "Unexpected; logged", body = ErrorBody),
    )
)]
async fn my_order(
    State(state): State<EntryState>,
    identity: Identity,
    ActivityId(activity_id): ActivityId,
) -> Result<Json<MyOrder>, ApiError> {
    let s = &state.inner;
    // The ledger first: the consumer commits the order before it drops the entry, so a
    // reservation missing here is either in the database already or was given back.
    let count = match s.bucket_counts.get(activity_id) {
        Some(count) => count,
        None => buckets::loaded_count(&s.redis, activity_id)
            .await?
            .unwrap_or(1),
    };
    let home = Bucket::home(activity_id, count, &identity.user_id);
    // Twice at most: once more after the draw is known to have run (by this call or any
    // other), since it may have made the caller a winner. The second read is final: the
    // draw is one step, and a pool entry it left queued stays so.
    let mut drawn = false;
    for _ in 0..2 {
        let entry = sale::ledger_entry(&s.redis, home, &identity.user_id).await?;
        if let Some(e) = entry.filter(|e| e.kind == EntryKind::Reservation) {
            return Ok(Json(MyOrder {
                status: "pending".into(),
                request_id: e.request_id(),
                quantity: Some(e.quantity),
                ..MyOrder::default()
            }));
        }
        if count > 1 {
            break;
        }
        // A draw sale's entrant: `queued` until the draw, `not_drawn` after it if the draw
        // passed them over. Asking runs a draw that is due and sends what its outbox holds.
        let Some(pool) = draw::pool_entry(&s.redis, activity_id, &identity.user_id).await? else {
            break;
        };
        if pool.won {
            break;
        }
        // Between the read of a queued entry and the draw: another caller may draw meanwhile.
        seckill_shared::pause::point("entry.my_order.after_pool_read", activity_id).await;
        let status = if drawn {
            "not_drawn"
        } else {
            match draw::draw(&s.redis, activity_id, draw::seed()).await? {
                draw::Drawn::Open { .. } => "queued",
                draw::Drawn::Now { .. } | draw::Drawn::Before { .. } => {
                    if draw::unsent(&s.redis, activity_id).await? > 0 {
                        drain(&state, activity_id).await;
                    }
                    drawn = true;
                    continue;
                }
                // Reloaded as a first-come sale meanwhile: the entry is history.
                draw::Drawn::NotDraw | draw::Drawn::NotLoaded => break,
            }
        };
        return Ok(Json(MyOrder {
            status: status.into(),
            request_id: Some(pool.request_id),
            quantity: Some(pool.quantity),
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

#[utoipa::path(
    post,
    path = "/orders/{orderId}/pay",
    tag = "orders",
    operation_id = "pay",
    summary = "Pay a confirmed order (paying twice answers the paid order)",
    params(OrderId),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The paid order", body = seckill_shared::order::Order),
        (status = 400, description = "Bad id (`bad_request`)", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such order, or someone else's", body = ErrorBody),
        (status = 409, description = "The order is cancelled or failed (`conflict`)", body = ErrorBody),
        (status = 503, description = "The database is out of reach", body = ErrorBody),
        (status = 500, description = "Unexpected; logged", body = ErrorBody),
    )
)]
async fn pay(
    State(state): State<EntryState>,
    identity: Identity,
    OrderId(order_id): OrderId,
) -> Result<Json<order::Order>, ApiError> {
    let order = lifecycle::pay_order(
        state.pool(),
        order_id,
        &identity.user_id,
        chrono::Utc::now(),
    )
    .await?;
    Ok(Json(order))
}

/// 200 body of a cancel: `releasedQuantity` is 0 for a repeated cancel.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Cancelled {
    order_id: i64,
    #[schema(example = "cancelled")]
    status: &'static str,
    released_quantity: i64,
}

#[utoipa::path(
    post,
    path = "/orders/{orderId}/cancel",
    tag = "orders",
    operation_id = "cancel",
    summary = "Cancel a confirmed order: stock and the user's quota come back, exactly once",
    params(OrderId),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Cancelled (`releasedQuantity` 0 when it already was)", body = Cancelled),
        (status = 400, description = "Bad id (`bad_request`)", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such order, or someone else's", body = ErrorBody),
        (status = 409, description = "Paid or failed (`conflict`), or another cancel of it is running (`busy`)", body = ErrorBody),
        (status = 503, description = "Redis or the database is out of reach", body = ErrorBody),
        (status = 500, description = "Unexpected; logged", body = ErrorBody),
    )
)]
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

/// Per-container memory of "Redis said sold out": activity -> (units Redis had left, when).
/// A request asking for more than that is refused without reaching Redis while the memory is
/// fresh. The memory is short because stock comes back (cancellations, compensations).
/// Every request of a flood reads it, so readers share a read lock instead of queueing on a
/// mutex.
struct SoldOutCache {
    ttl: Duration,
    seen: RwLock<HashMap<i64, (i64, Instant)>>,
}

impl SoldOutCache {
    fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            seen: RwLock::new(HashMap::new()),
        }
    }

    fn refuses(&self, activity_id: i64, quantity: i64) -> bool {
        let seen = self.seen.read().unwrap_or_else(|p| p.into_inner());
        matches!(seen.get(&activity_id), Some((left, at)) if quantity > *left && at.elapsed() < self.ttl)
    }

    fn remember(&self, activity_id: i64, stock_left: i64) {
        if self.ttl.is_zero() {
            return;
        }
        let mut seen = self.seen.write().unwrap_or_else(|p| p.into_inner());
        // Drop stale entries now and then so a long-lived container does not collect them.
        if seen.len() > 1024 {
            seen.retain(|_, (_, at)| at.elapsed() < self.ttl);
        }
        seen.insert(activity_id, (stock_left, Instant::now()));
    }

    fn forget(&self, activity_id: i64) {
        self.seen
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&activity_id);
    }
}

/// Per-container memory of each bucketed sale's bucket count (a sale not in it has one
/// bucket, or has not been bought here yet). The count is fixed once a sale starts; before,
/// a purchase that asks with a stale count is told the right one by Redis.
#[derive(Default)]
struct BucketCounts {
    seen: RwLock<HashMap<i64, u32>>,
}

impl BucketCounts {
    fn get(&self, activity_id: i64) -> Option<u32> {
        let seen = self.seen.read().unwrap_or_else(|p| p.into_inner());
        seen.get(&activity_id).copied()
    }

    fn put(&self, activity_id: i64, count: u32) {
        let mut seen = self.seen.write().unwrap_or_else(|p| p.into_inner());
        if seen.len() > 1024 {
            seen.clear();
        }
        if count > 1 {
            seen.insert(activity_id, count);
        } else {
            seen.remove(&activity_id);
        }
    }
}

/// Per-container memory of the window of sales Redis does not hold (`None`: no such published
/// sale), kept for [`UnloadedCache::TTL`].
#[derive(Default)]
struct UnloadedCache {
    seen: Mutex<HashMap<i64, (Window, Instant)>>,
}

type Window = Option<(chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>)>;

impl UnloadedCache {
    const TTL: Duration = Duration::from_secs(1);

    fn get(&self, activity_id: i64) -> Option<Window> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        match seen.get(&activity_id) {
            Some((window, at)) if at.elapsed() < Self::TTL => Some(*window),
            _ => None,
        }
    }

    fn put(&self, activity_id: i64, window: Window) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() > 1024 {
            seen.retain(|_, (_, at)| at.elapsed() < Self::TTL);
        }
        seen.insert(activity_id, (window, Instant::now()));
    }
}

/// The offset of the Redis server's clock from this container's, estimated from the
/// purchase script's answers: each answer carries the server's `TIME` when the script ran,
/// which is at least (send time + offset), so the smallest `serverNow - sentAt` seen is the
/// offset plus the fastest one-way trip. The estimate is the minimum over the current and
/// the previous [`ClockSkew::WINDOW`], so it follows a clock that drifts.
struct ClockSkew {
    base: Instant,
    window_start_ms: AtomicU64,
    current_min: AtomicI64,
    previous_min: AtomicI64,
}

impl Default for ClockSkew {
    fn default() -> Self {
        Self {
            base: Instant::now(),
            window_start_ms: AtomicU64::new(0),
            current_min: AtomicI64::new(i64::MAX),
            previous_min: AtomicI64::new(i64::MAX),
        }
    }
}

impl ClockSkew {
    const WINDOW: Duration = Duration::from_secs(10);

    fn offset_ms(&self) -> i64 {
        let best = self
            .current_min
            .load(Ordering::Relaxed)
            .min(self.previous_min.load(Ordering::Relaxed));
        // No answer yet: trust the clocks (NTP-synchronised in AWS).
        if best == i64::MAX {
            0
        } else {
            best
        }
    }

    /// The deadline on the Redis clock for a script sent at `sent_ms` (this clock) by a caller
    /// that waits `timeout`: half of it, so that an answer sent just before the deadline still
    /// has the other half to arrive.
    fn deadline(&self, sent_ms: i64, timeout: Duration) -> i64 {
        sent_ms + self.offset_ms() + (timeout.as_millis() as i64 / 2).max(1)
    }

    fn observe(&self, sent_ms: i64, server_now_ms: i64) {
        let sample = server_now_ms - sent_ms;
        self.current_min.fetch_min(sample, Ordering::Relaxed);
        let now = self.base.elapsed().as_millis() as u64;
        let start = self.window_start_ms.load(Ordering::Relaxed);
        if now >= start + Self::WINDOW.as_millis() as u64
            && self
                .window_start_ms
                .compare_exchange(start, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let finished = self.current_min.swap(sample, Ordering::Relaxed);
            self.previous_min.store(finished, Ordering::Relaxed);
        }
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

/// Purchase counters, aggregated in memory and written as one EMF line at most every
/// [`Counters::FLUSH_EVERY`] (by whichever request notices), so a flood of refusals costs an
/// atomic increment each, not a log line each.
#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    queued: AtomicU64,
    compensations: AtomicU64,
    /// Per [`Refusal::index`].
    refused: [AtomicU64; Refusal::CODES.len()],
    sold_out_cached: AtomicU64,
    unavailable: AtomicU64,
    last_flush_ms: AtomicU64,
    base: std::sync::OnceLock<Instant>,
}

impl Counters {
    const FLUSH_EVERY: Duration = Duration::from_secs(10);

    fn accept(&self) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
        self.maybe_flush();
    }

    /// An entry in a draw sale's pool.
    fn queue(&self) {
        self.queued.fetch_add(1, Ordering::Relaxed);
        self.maybe_flush();
    }

    fn compensation(&self) {
        self.compensations.fetch_add(1, Ordering::Relaxed);
        self.maybe_flush();
    }

    fn refuse(&self, refusal: Refusal) {
        self.refused[refusal.index()].fetch_add(1, Ordering::Relaxed);
        self.maybe_flush();
    }

    /// A sold-out answer from the container's memory, not from Redis.
    fn sold_out_cached(&self) {
        self.sold_out_cached.fetch_add(1, Ordering::Relaxed);
        self.maybe_flush();
    }

    /// A 503 for Redis: the breaker is open or the script's answer did not come in time.
    fn unavailable(&self) {
        self.unavailable.fetch_add(1, Ordering::Relaxed);
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
        let taken = |n: &AtomicU64| n.swap(0, Ordering::Relaxed) as f64;
        let mut counters = vec![
            ("Accepted".to_string(), taken(&self.accepted)),
            ("Queued".to_string(), taken(&self.queued)),
            ("Compensations".to_string(), taken(&self.compensations)),
            (
                "RejectedSoldOutCached".to_string(),
                taken(&self.sold_out_cached),
            ),
            ("RejectedUnavailable".to_string(), taken(&self.unavailable)),
        ];
        for (code, n) in Refusal::CODES.iter().zip(&self.refused) {
            counters.push((refusal_metric(code), taken(n)));
        }
        let counters: Vec<(&str, f64)> = counters.iter().map(|(k, n)| (k.as_str(), *n)).collect();
        if counters.iter().any(|(_, n)| *n > 0.0) {
            seckill_shared::metrics::emit(FUNCTION, &counters, &[]);
        }
    }
}

/// A refusal's metric name: `Rejected` and its code in upper camel case (`sold_out` →
/// `RejectedSoldOut`).
fn refusal_metric(code: &str) -> String {
    let mut name = String::from("Rejected");
    for word in code.split('_') {
        let mut chars = word.chars();
        if let Some(first) = chars.next() {
            name.extend(first.to_uppercase());
            name.push_str(chars.as_str());
        }
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_metrics_are_named_after_their_codes() {
        let names: Vec<String> = Refusal::CODES.iter().map(|c| refusal_metric(c)).collect();
        assert_eq!(
            names,
            [
                "RejectedNotFound",
                "RejectedNotStarted",
                "RejectedEnded",
                "RejectedQuantityExceedsLimit",
                "RejectedSoldOut",
                "RejectedAlreadyPurchased",
                "RejectedExpired",
                "RejectedRateLimited",
            ]
        );
    }

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
    fn clock_skew_follows_the_fastest_answer_and_leaves_half_the_timeout() {
        let skew = ClockSkew::default();
        let timeout = Duration::from_millis(300);
        assert_eq!(
            skew.deadline(1_000, timeout),
            1_150,
            "no answer yet: clocks trusted"
        );
        // Redis runs 5 s ahead; answers took 40 ms and 2 ms to get there.
        skew.observe(1_000, 6_040);
        skew.observe(2_000, 7_002);
        assert_eq!(skew.deadline(3_000, timeout), 3_000 + 5_002 + 150);
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
