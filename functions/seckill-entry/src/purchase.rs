//! `POST /activities/{id}/orders`: one purchase. `lua/purchase.lua` decides it in Redis
//! ([`seckill_shared::protocol::purchase`]), the order message goes to SQS, and the caller
//! gets 202 at once; the order consumer writes the order. A failed send, or a script whose
//! answer came too late, is given back through the database's arbiter before the 503, so a
//! 503 means nothing happened. docs/invariants.md, "Entry: a purchase" and "What a 503 means".

use crate::{db_guards, EntryState};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use seckill_shared::domain::activity;
use seckill_shared::domain::order::{reason, OrderStatus};
use seckill_shared::domain::purchase::{Attempt, MessageKind, OrderMessage};
use seckill_shared::domain::settings::MAX_PER_ORDER_LIMIT;
use seckill_shared::http::auth::Identity;
use seckill_shared::http::error::ErrorBody;
use seckill_shared::http::extract::{ActivityId, JsonBody};
use seckill_shared::infra::pause;
use seckill_shared::infra::sqs::QueueError;
use seckill_shared::protocol::draw::{self, Trigger};
use seckill_shared::protocol::giveback::{self, Claim, GiveBackError};
use seckill_shared::protocol::purchase::{self, Outcome};
use seckill_shared::store::conn::StoreError;
use seckill_shared::store::draw as pool;
use seckill_shared::store::draw::{Drawn, Left};
use seckill_shared::store::keys::Home;
use seckill_shared::store::ledger::{self, Compensation};
use seckill_shared::store::purchase::Reservation;
use seckill_shared::{ApiError, Refusal};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tracing::Span;
use uuid::Uuid;

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
        (status = 409, description = "Outside the window (`not_started`, `ended`), `sold_out`, or `already_purchased` (also a second entry in a draw, and a draw's loser), or `draw_running` with `Retry-After: 1` (a draw sale's draw is being run and not done; nothing was reserved)", body = ErrorBody),
        (status = 429, description = "More attempts this second than the sale's per-user rate, or (a sale Redis does not hold, answered from the database) more requests that reach the database than the per-user rate (`rate_limited`); `Retry-After` says when to retry", body = ErrorBody),
        (status = 503, description = "Redis, the queue or the database is out of reach, or the sale is being loaded: nothing was reserved, retry", body = ErrorBody),
        (status = 500, description = "Unexpected; logged", body = ErrorBody),
    )
)]
// The span is debug-level: at info, the default, a refusal (the bulk of a sale's traffic) pays
// for no span, and the events that are logged carry the activity and request ids themselves.
#[tracing::instrument(level = "debug", skip_all, fields(activity_id, request_id, outcome))]
pub(crate) async fn purchase(
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
    let mut attempt = Attempt {
        request_id,
        activity_id,
        user_id: identity.user_id,
        quantity,
        buckets: state.inner.bucket_counts.get(activity_id).unwrap_or(1),
    };
    let mut outcome = match decide(&state, &mut attempt).await {
        Ok(outcome) => outcome,
        Err(unanswered) => return unanswered.answer(),
    };
    if outcome == Outcome::DrawDue {
        // This request's share of the draw ran out of time: the rest runs in the background.
        if let Drawn::Running { .. } | Drawn::Restoring { .. } =
            run_draw(&state, activity_id).await?
        {
            return Err(ApiError::DrawRunning);
        }
        outcome = match decide(&state, &mut attempt).await {
            Ok(outcome) => outcome,
            Err(unanswered) => return unanswered.answer(),
        };
    }
    let reservation = match outcome {
        Outcome::Reserved(reservation) => reservation,
        Outcome::Queued { rank } => return enter(&state, attempt, rank).await,
        // The draw is being run in steps and is not done yet (this call's share of it ran
        // out of time), or the sale was reloaded in between. Nothing was reserved.
        Outcome::DrawDue => return Err(ApiError::DrawRunning),
        Outcome::Refused(refusal) => return Err(refuse(&state, &attempt, refusal).await),
    };
    span.record("outcome", "accepted");
    if reservation.stock_left == 0 && reservation.buckets == 1 {
        // The next request would be refused by Redis anyway: answer it from memory. (In a
        // bucketed sale an empty home bucket says nothing of the others.)
        state.inner.sold_out.remember(activity_id, 0);
    }
    attempt.buckets = reservation.buckets;
    let message = OrderMessage {
        attempt,
        reserved_at_ms: reservation.now_ms,
        load_epoch: Some(reservation.epoch),
        kind: MessageKind::Order,
    };
    send(&state, &message, reservation.stock_left).await
}

/// Sends a draw entry Redis put in the pool to the order queue, so that the database keeps it
/// (a pool Redis loses is rebuilt from what it keeps): 202 `queued` once it is on the queue.
/// A failed send claims the request as a 503 (`failed`, `unavailable`: the draw's callers
/// take such entries out of the pool, should this call's leave not get through) and takes the
/// entry out of the pool before its 503; with the database out of reach too the entry stays,
/// in Redis only, and answers 202 `queued` (it takes part in the draw unless Redis loses the
/// sale).
async fn enter(state: &EntryState, attempt: Attempt, rank: i64) -> Result<Response, ApiError> {
    let s = &state.inner;
    let (activity_id, request_id) = (attempt.activity_id, attempt.request_id);
    let message = OrderMessage {
        attempt,
        reserved_at_ms: chrono::Utc::now().timestamp_millis(),
        load_epoch: None,
        kind: MessageKind::Entry,
    };
    let sent = if pause::fail("entry.enter.send", activity_id) {
        Err(QueueError::Timeout(s.queue.timeout))
    } else {
        s.queue.send(&message, activity_id).await
    };
    if let Err(send_error) = sent {
        let a = &message.attempt;
        match giveback::claim(&s.pool, a, reason::UNAVAILABLE).await {
            Ok(_) => {
                if let Err(e) = pool::leave(&s.redis, activity_id, &a.user_id, request_id).await {
                    // The claim stands: the draw's callers take the entry out before the draw.
                    tracing::warn!(activity_id, %request_id, error = %e, "draw entry of a failed send not yet out of the pool");
                }
                Span::current().record("outcome", "compensated");
                s.counters.compensation();
                tracing::warn!(activity_id, %request_id, error = %send_error, "draw entry not sent; taken back");
                return Err(ApiError::unavailable("order queue", send_error));
            }
            Err(e) => {
                tracing::error!(activity_id, %request_id, error = %send_error, claim_error = %e,
                    "draw entry not sent and the database is out of reach; it stays in the pool");
            }
        }
    }
    Span::current().record("outcome", "queued");
    s.counters.queue();
    tracing::debug!(activity_id, request_id = %request_id, rank, "purchase queued for the draw");
    Ok(answer(request_id, "queued"))
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
    let a = &message.attempt;
    if let Err(send_error) = s.queue.send(message, a.activity_id).await {
        pause::point("entry.after_send_error", a.activity_id).await;
        return after_send_error(state, message, send_error).await;
    }
    s.counters.accept();
    tracing::info!(
        activity_id = a.activity_id,
        request_id = %a.request_id,
        quantity = a.quantity,
        stock_left,
        "purchase accepted"
    );
    Ok(answer(a.request_id, "pending"))
}

/// The 202 of a purchase the database has or will have (`pending`), or of an entry in a
/// draw's pool (`queued`).
fn answer(request_id: Uuid, status: &'static str) -> Response {
    let body = Accepted { request_id, status };
    (StatusCode::ACCEPTED, Json(body)).into_response()
}

/// A draw sale whose window has closed: its draw's steps for as long as a request may wait,
/// then its winners' sends (one round; the rest, of the steps and the sends, in the
/// background), before this purchase asks again. A draw that cannot run is a 503, with
/// nothing reserved.
async fn run_draw(state: &EntryState, activity_id: i64) -> Result<Drawn, ApiError> {
    let s = &state.inner;
    let run = draw::run(&s.redis, &s.pool, &s.queue, activity_id, Trigger::Purchase).await?;
    Ok(run.drawn)
}

/// Runs the purchase with the caller's deadline. A Redis error or timeout is a 503, and since
/// the script may have run (its answer lost or late), the reservation is claimed for a
/// give-back before the 503 goes out. `attempt.buckets` is left at the count Redis holds.
async fn decide(state: &EntryState, attempt: &mut Attempt) -> Result<Outcome, Unanswered> {
    let s = &state.inner;
    let sent_ms = chrono::Utc::now().timestamp_millis();
    let deadline = s.skew.deadline(sent_ms, s.config.redis_timeout);
    let known = attempt.buckets;
    let decided = purchase::enter(&s.redis, &s.bucket_hints, attempt, deadline).await;
    // Ran, or may have run: this container's status reads of the pair ask the database again.
    if !matches!(decided, Ok(Outcome::Refused(_))) {
        s.no_order
            .bought(&attempt.user_id, attempt.activity_id)
            .await;
    }
    if attempt.buckets != known {
        s.bucket_counts.put(attempt.activity_id, attempt.buckets);
    }
    let decided = match decided {
        Ok(_) if pause::fail("entry.purchase.reply_lost", attempt.activity_id) => {
            Err(StoreError::Timeout(s.config.redis_timeout))
        }
        other => other,
    };
    match decided {
        Ok(outcome) => {
            s.breaker.success();
            if let Outcome::Reserved(Reservation { now_ms, .. })
            | Outcome::Refused(Refusal::Expired { now_ms }) = outcome
            {
                s.skew.observe(sent_ms, now_ms);
            }
            Ok(outcome)
        }
        Err(e) => {
            if s.breaker.failure() {
                s.counters.breaker_opened();
            }
            s.counters.unavailable();
            Span::current().record("outcome", "unavailable");
            tracing::info!(activity_id = attempt.activity_id, request_id = %attempt.request_id, error = %e,
                "purchase script unanswered; giving back whatever it did");
            if give_back_unanswered(state, attempt.clone()).await {
                return Err(Unanswered::Ordered(attempt.request_id));
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
async fn give_back_unanswered(state: &EntryState, reservation: Attempt) -> bool {
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
            return leave_without_claim(state, &reservation).await;
        }
    }
    // Between the claim and its Redis half: a draw may run meanwhile.
    pause::point("entry.unanswered.after_claim", reservation.activity_id).await;
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

/// The database took no claim: a draw entry still leaves the pool, so that no draw picks a
/// request told 503. One the draw already made a winner stays (its message is on its way, and
/// only the database could stop it): true, the caller answers 202 `pending` to follow it. The
/// leave is tried once now and then in the background. A first-come sale has no pool: nothing
/// to do, and its reservation (never sent) goes back after reconcile's grace period.
async fn leave_without_claim(state: &EntryState, r: &Attempt) -> bool {
    if r.buckets != 1 {
        return false;
    }
    let s = &state.inner;
    let now = tokio::time::timeout(
        s.config.redis_timeout / 2,
        pool::leave_entry(&s.redis, r.activity_id, &r.user_id, r.request_id),
    );
    match now.await {
        Ok(Ok(Left::Winner)) => {
            tracing::warn!(request_id = %r.request_id, "unanswered draw entry is a winner; its order follows");
            return true;
        }
        Ok(Ok(_)) => return false,
        Ok(Err(_)) | Err(_) => {}
    }
    let (state, r) = (state.clone(), r.clone());
    tokio::spawn(async move {
        let s = &state.inner;
        for _ in 0..GIVE_BACK_ATTEMPTS {
            tokio::time::sleep(GIVE_BACK_RETRY).await;
            if pool::leave_entry(&s.redis, r.activity_id, &r.user_id, r.request_id)
                .await
                .is_ok()
            {
                return;
            }
        }
        tracing::warn!(request_id = %r.request_id, "draw entry of a 503 not taken out of the pool");
    });
    false
}

/// The Redis half of [`give_back_unanswered`], after the claim.
async fn compensate_unanswered(state: &EntryState, r: &Attempt) -> Result<(), StoreError> {
    let s = &state.inner;
    // A draw sale's entry: out of the pool (or, drawn a winner, given back below).
    if r.buckets == 1 && pool::leave(&s.redis, r.activity_id, &r.user_id, r.request_id).await? {
        tracing::warn!(request_id = %r.request_id, "late draw entry taken out of the pool");
    }
    let mode = Compensation::Full;
    let units = ledger::compensate(&s.redis, r.home(), &r.user_id, r.request_id, mode).await?;
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
async fn refuse(state: &EntryState, attempt: &Attempt, refusal: Refusal) -> ApiError {
    let s = &state.inner;
    let activity_id = attempt.activity_id;
    Span::current().record("outcome", refusal.code());
    if let Refusal::SoldOut { stock_left } = refusal {
        s.sold_out.remember(activity_id, stock_left);
    }
    s.counters.refuse(refusal);
    // Refusals are the bulk of a sale's traffic: they are counted (EMF, every 10 s), and
    // logged one by one only at debug, so a flood does not pay for a log line each.
    tracing::debug!("purchase refused");
    match refusal {
        Refusal::NotFound => not_loaded(state, activity_id, &attempt.user_id).await,
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
    send_error: QueueError,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let span = Span::current();
    let a = &message.attempt;
    let (activity_id, request_id) = (a.activity_id, a.request_id);
    match giveback::give_back(&s.pool, &s.redis, a, reason::SEND_FAILED).await {
        Ok(done) if done.order().is_some() => {
            tracing::info!(activity_id, %request_id, error = %send_error, "send reported a failure but the order is in");
            s.counters.accept();
            Ok(answer(request_id, "pending"))
        }
        Ok(done) => {
            span.record("outcome", "compensated");
            s.sold_out.forget(activity_id);
            s.counters.compensation();
            tracing::warn!(activity_id, %request_id, error = %send_error, ?done, "send failed; reservation given back");
            Err(ApiError::unavailable("order queue", send_error))
        }
        Err(e @ GiveBackError::Store(_)) => {
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
            Ok(answer(request_id, "pending"))
        }
    }
}

/// A sale Redis does not hold answers as the database says its window stands: not started,
/// ended, or (running, about to be loaded by preheat or reconcile) unavailable. Only unknown
/// or draft ids are 404. The answer is cached per container, so a flood for an unloaded or
/// unknown id costs the database one read per id and cache period, and a user's purchases of
/// ids not cached count against their rate of requests that reach the database.
async fn not_loaded(state: &EntryState, activity_id: i64, user_id: &str) -> ApiError {
    let s = &state.inner;
    let cached = s.unloaded.get(activity_id);
    if cached.is_none() {
        if let Err(limited) = db_guards::admit(state, user_id).await {
            return limited;
        }
        if !s.known_max.may_exist(&s.pool, activity_id).await {
            return Refusal::NotFound.into();
        }
    }
    let window = match cached {
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

#[cfg(test)]
mod tests {
    use super::*;

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
