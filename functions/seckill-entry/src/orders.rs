//! What a buyer does with their purchase after the click: `GET …/orders/me` (where it is, and
//! for a draw's entrant the draw's outcome), and cancel a confirmed order: its units and the
//! user's quota come back exactly once, whichever cancel or payment commits first.

use crate::{db_guards, EntryState};
use axum::extract::State;
use axum::Json;
use seckill_shared::domain::order::{self, Order};
use seckill_shared::domain::status::{BuyerStatus, FailureReason, OrderStatus};
use seckill_shared::http::auth::Identity;
use seckill_shared::http::error::ErrorBody;
use seckill_shared::http::extract::{ActivityId, OrderId};
use seckill_shared::infra::pause;
use seckill_shared::protocol::cancel::{CancelOutcome, Canceller};
use seckill_shared::protocol::pay;
use seckill_shared::store::buckets;
use seckill_shared::store::draw::{self as pool, DrawState};
use seckill_shared::store::keys::Bucket;
use seckill_shared::store::ledger;
use seckill_shared::store::values::EntryKind;
use seckill_shared::ApiError;
use serde::Serialize;
use sqlx::PgPool;
use std::time::Instant;
use uuid::Uuid;

/// `GET /activities/{id}/orders/me`: where the caller's purchase is.
#[derive(Debug, Default, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MyOrder {
    /// `none`, `queued` (in a draw sale's pool, before its draw), `pending` (reserved, the
    /// order is being written), `confirmed`, `paid`, `cancelled`, `failed` (with a `reason`),
    /// `not_drawn` (in a draw sale's pool, and the draw passed over the entry: final), or
    /// `entered_late` (answered `queued`, but back in the pool only once the draw had begun,
    /// after Redis lost the sale: the draw could not look at it; final).
    #[schema(example = "confirmed")]
    pub status: BuyerStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order_id: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantity: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<FailureReason>,
}

impl MyOrder {
    /// Nothing of the caller's in this sale.
    fn none() -> Self {
        Self {
            status: BuyerStatus::None,
            ..Self::default()
        }
    }
}

#[utoipa::path(
    get,
    path = "/activities/{activityId}/orders/me",
    tag = "purchase",
    operation_id = "myOrder",
    summary = "Where the caller's purchase of this activity is",
    params(ActivityId),
    responses(
        (status = 200, description = "The caller's reservation or latest order, or `none` (a `none` may be this container's answer of up to a second ago: an order another container accepted can show up to a second after it is committed; one accepted by the same container shows at once)", body = MyOrder),
        (status = 400, description = "Bad id (`bad_request`)", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 429, description = "More requests that reach the database than the per-user rate (`rate_limited`); `Retry-After` says when to retry", body = ErrorBody),
        (status = 503, description = "Redis or the database is out of reach", body = ErrorBody),
        (status = 500, description = "Unexpected; logged", body = ErrorBody),
    )
)]
pub(crate) async fn my_order(
    State(state): State<EntryState>,
    identity: Identity,
    ActivityId(activity_id): ActivityId,
) -> Result<Json<MyOrder>, ApiError> {
    let s = &state.inner;
    // Before any read: a "no order" the database gives is kept only if no purchase of this
    // container ran for the pair since.
    let read_from = Instant::now();
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
    // other), since it may have made the caller a winner. The second read is final: a done
    // draw never draws again, and a pool entry it left queued stays so.
    let mut drawn = false;
    for _ in 0..2 {
        let entry = ledger::entry(&s.redis, home, &identity.user_id).await?;
        if let Some(e) = entry.filter(|e| e.kind == EntryKind::Reservation) {
            return Ok(Json(MyOrder {
                status: BuyerStatus::Pending,
                request_id: e.request_id(),
                quantity: Some(e.quantity),
                ..MyOrder::default()
            }));
        }
        if count > 1 {
            break;
        }
        // A draw sale's entrant: `queued` until the drawer has done the draw, `not_drawn`
        // after it if the draw passed them over. A pure read of Redis: asking runs no step.
        let Some(entry) = pool::pool_entry(&s.redis, activity_id, &identity.user_id).await? else {
            break;
        };
        // Too late for the draw: final, whatever the draw's state.
        if entry.late {
            return Ok(Json(MyOrder {
                status: BuyerStatus::EnteredLate,
                request_id: Some(entry.request_id),
                quantity: Some(entry.quantity),
                ..MyOrder::default()
            }));
        }
        // Won between the ledger read above and this one: the reservation is there now.
        if entry.won {
            if drawn {
                break;
            }
            drawn = true;
            continue;
        }
        // Between the read of a queued entry and the draw's state: the drawer may finish the
        // draw meanwhile, making this entrant a winner.
        pause::point("entry.my_order.after_pool_read", activity_id).await;
        let status = if drawn {
            BuyerStatus::NotDrawn
        } else {
            match pool::state(&s.redis, activity_id).await? {
                DrawState::Undecided => BuyerStatus::Queued,
                // Done: the entry read above may be from before the step that made it a
                // winner; read it again, and that read is final.
                DrawState::Done => {
                    drawn = true;
                    continue;
                }
                // Reloaded as a first-come sale meanwhile: the entry is history.
                DrawState::NotDraw | DrawState::NotLoaded => break,
            }
        };
        return Ok(Json(MyOrder {
            status,
            request_id: Some(entry.request_id),
            quantity: Some(entry.quantity),
            ..MyOrder::default()
        }));
    }
    let user_id = &identity.user_id;
    if s.no_order.knows_none(user_id, activity_id).await {
        return Ok(Json(MyOrder::none()));
    }
    db_guards::admit(&state, user_id).await?;
    let Some(o) = order::latest_for_user(&s.pool, activity_id, user_id).await? else {
        // Between the database's "none" and keeping it: a purchase may run meanwhile.
        pause::point("entry.my_order.before_remember_none", activity_id).await;
        s.no_order
            .remember_none(user_id, activity_id, read_from)
            .await;
        return Ok(Json(MyOrder::none()));
    };
    Ok(Json(MyOrder {
        reason: o.failure_reason.filter(|_| o.status == OrderStatus::Failed),
        status: o.status.into(),
        request_id: Some(o.request_id),
        order_id: Some(o.id),
        quantity: Some(o.quantity),
    }))
}

/// 200 body of a cancel: `releasedQuantity` is 0 for a repeated cancel.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Cancelled {
    order_id: i64,
    #[schema(example = "cancelled")]
    status: OrderStatus,
    released_quantity: i64,
}

#[utoipa::path(
    post,
    path = "/orders/{orderId}/cancel",
    tag = "orders",
    operation_id = "cancel",
    summary = "Cancel a confirmed order: stock and the user's quota come back, exactly once",
    params(OrderId),
    responses(
        (status = 200, description = "Cancelled (`releasedQuantity` 0 when it already was)", body = Cancelled),
        (status = 400, description = "Bad id (`bad_request`)", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such order, or someone else's", body = ErrorBody),
        (status = 409, description = "Paid or failed (`conflict`), or another cancel of it is running (`busy`)", body = ErrorBody),
        (status = 429, description = "More requests that reach the database than the per-user rate (`rate_limited`); `Retry-After` says when to retry", body = ErrorBody),
        (status = 503, description = "Redis or the database is out of reach", body = ErrorBody),
        (status = 500, description = "Unexpected; logged", body = ErrorBody),
    )
)]
pub(crate) async fn cancel(
    State(state): State<EntryState>,
    identity: Identity,
    OrderId(order_id): OrderId,
) -> Result<Json<Cancelled>, ApiError> {
    let s = &state.inner;
    db_guards::admit(&state, &identity.user_id).await?;
    let order = owned_order(&s.pool, order_id, &identity.user_id).await?;
    let provider = s.payments.as_deref();
    let now = chrono::Utc::now();
    let outcome =
        pay::cancel_unpaid(&s.pool, &s.redis, provider, &order, now, Canceller::Owner).await?;
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
        status: OrderStatus::Cancelled,
        released_quantity,
    }))
}

/// The order if it exists and belongs to `user_id`; otherwise 404, the same answer for both so
/// order ids of other users cannot be probed.
async fn owned_order(pool: &PgPool, order_id: i64, user_id: &str) -> Result<Order, ApiError> {
    match order::get(pool, order_id).await? {
        Some(order) if order.user_id == user_id => Ok(order),
        _ => Err(not_found(order_id)),
    }
}

fn not_found(order_id: i64) -> ApiError {
    ApiError::NotFound(format!("order {order_id} not found"))
}
