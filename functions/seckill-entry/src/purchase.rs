//! `POST /activities/{id}/orders`: one purchase. The protocol decides it
//! ([`seckill_shared::protocol::purchase`]: the script in Redis, the order message's send, and
//! what a 503 means); this handler answers its verdict (202 or 503) at once, counts it, and
//! keeps the container's memories in front of Redis. The order consumer writes the order.
//! docs/invariants.md, "Entry: a purchase" and "What a 503 means".

use crate::{db_guards, EntryState};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use seckill_shared::domain::activity;
use seckill_shared::domain::purchase::{Attempt, MessageKind, OrderMessage};
use seckill_shared::domain::settings::MAX_PER_ORDER_LIMIT;
use seckill_shared::domain::status::{ActivityState, BuyerStatus};
use seckill_shared::http::auth::Identity;
use seckill_shared::http::error::ErrorBody;
use seckill_shared::http::extract::{ActivityId, JsonBody};
use seckill_shared::infra::pause;
use seckill_shared::protocol::purchase::{self, AfterSend, EntrySent, Outcome, Sent, Unanswered};
use seckill_shared::store::conn::StoreError;
use seckill_shared::store::purchase::Reservation;
use seckill_shared::{ApiError, Refusal};
use serde::{Deserialize, Serialize};
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
    status: BuyerStatus,
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
    let outcome = match decide(&state, &mut attempt).await {
        Ok(outcome) => outcome,
        Err(unanswered) => return unanswered.answer(),
    };
    let reservation = match outcome {
        Outcome::Reserved(reservation) => reservation,
        Outcome::Queued { rank } => return enter(&state, attempt, rank).await,
        // A draw sale whose window has closed and whose draw is not done: the drawer
        // (reconcile) runs it; nothing was reserved, and this request runs no step of it.
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

/// A draw entry Redis put in the pool: its message on the queue, then 202 `queued`; a failed
/// send takes it back, 503 ([`purchase::send_entry`]).
async fn enter(state: &EntryState, attempt: Attempt, rank: i64) -> Result<Response, ApiError> {
    let s = &state.inner;
    let (activity_id, request_id) = (attempt.activity_id, attempt.request_id);
    if let EntrySent::TakenBack(error) =
        purchase::send_entry(&s.queues.entries, &s.pool, &s.redis, attempt).await
    {
        Span::current().record("outcome", "compensated");
        s.counters.compensation();
        return Err(ApiError::unavailable("order queue", error));
    }
    Span::current().record("outcome", "queued");
    s.counters.queue();
    tracing::debug!(activity_id, request_id = %request_id, rank, "purchase queued for the draw");
    Ok(answer(request_id, BuyerStatus::Queued))
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

/// Sends the accepted purchase's order message ([`purchase::send_order`]): 202 once it is on
/// the queue; a failed send answers as the arbiter decided it.
async fn send(
    state: &EntryState,
    message: &OrderMessage,
    stock_left: i64,
) -> Result<Response, ApiError> {
    let s = &state.inner;
    let a = &message.attempt;
    let (error, then) =
        match purchase::send_order(&s.queues.orders, &s.pool, &s.redis, message).await {
            Sent::Queued => {
                s.counters.accept();
                tracing::info!(
                    activity_id = a.activity_id,
                    request_id = %a.request_id,
                    quantity = a.quantity,
                    stock_left,
                    "purchase accepted"
                );
                return Ok(answer(a.request_id, BuyerStatus::Pending));
            }
            Sent::Failed { error, then } => (error, then),
        };
    let span = Span::current();
    match then {
        AfterSend::Ordered => s.counters.accept(),
        AfterSend::Undecided => {
            span.record("outcome", "undecided");
            s.counters.accept();
        }
        AfterSend::GivenBack | AfterSend::Claimed => {
            span.record("outcome", "compensated");
            if then == AfterSend::GivenBack {
                s.sold_out.forget(a.activity_id);
            }
            s.counters.compensation();
        }
    }
    if then.pending() {
        return Ok(answer(a.request_id, BuyerStatus::Pending));
    }
    Err(ApiError::unavailable("order queue", error))
}

/// The 202 of a purchase the database has or will have (`pending`), or of an entry in a
/// draw's pool (`queued`).
fn answer(request_id: Uuid, status: BuyerStatus) -> Response {
    let body = Accepted { request_id, status };
    (StatusCode::ACCEPTED, Json(body)).into_response()
}

/// Runs the purchase with the caller's deadline. A Redis error or timeout is a 503, and since
/// the script may have run (its answer lost or late), the reservation is claimed for a
/// give-back before the 503 goes out. `attempt.buckets` is left at the count Redis holds.
async fn decide(state: &EntryState, attempt: &mut Attempt) -> Result<Outcome, NoAnswer> {
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
            let state = state.clone();
            let activity_id = attempt.activity_id;
            let units_back = move || state.inner.sold_out.forget(activity_id);
            let bound = s.config.redis_timeout / 2;
            match purchase::unanswered(&s.pool, &s.redis, attempt.clone(), bound, units_back).await
            {
                Unanswered::Ordered => Err(NoAnswer::Ordered(attempt.request_id)),
                Unanswered::Unavailable => Err(NoAnswer::Unavailable(e.into())),
            }
        }
    }
}

/// A purchase whose script did not answer in time, as the handler answers it.
enum NoAnswer {
    /// Claimed and given back: 503, nothing happened.
    Unavailable(ApiError),
    /// The request is an order already, or a drawn winner whose order follows: 202.
    Ordered(Uuid),
}

impl NoAnswer {
    fn answer(self) -> Result<Response, ApiError> {
        match self {
            NoAnswer::Unavailable(e) => Err(e),
            NoAnswer::Ordered(request_id) => Ok(answer(request_id, BuyerStatus::Pending)),
        }
    }
}

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
                    .filter(|a| a.state == ActivityState::Published)
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
