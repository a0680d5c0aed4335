//! Paying a confirmed order: one conditional update `confirmed` → `paid`, so whichever of a
//! pay and a cancel commits first wins (both require `confirmed`). docs/invariants.md, "Pay".

use crate::domain::order::{self, Order, OrderStatus};
use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// What [`pay_order`] found.
#[derive(Clone, Debug)]
pub enum Paid {
    /// This call paid it.
    Now(Order),
    /// It was paid already: paying twice answers the paid order.
    Before(Order),
    /// Cancelled or failed (after the payment timeout reconcile has cancelled it, so a late
    /// pay is refused).
    NotPayable(Order),
    /// No such order, or someone else's.
    NotFound,
}

/// Pays a `confirmed` order of `user_id` at `now`.
#[tracing::instrument(skip_all, fields(order_id = order_id))]
pub async fn pay_order(
    pool: &PgPool,
    order_id: i64,
    user_id: &str,
    now: DateTime<Utc>,
) -> Result<Paid, sqlx::Error> {
    if let Some(order) = order::mark_paid(pool, order_id, user_id, now).await? {
        tracing::info!(outcome = "paid", "order paid");
        return Ok(Paid::Now(order));
    }
    Ok(match order::get(pool, order_id).await? {
        Some(order) if order.user_id == user_id => match OrderStatus::parse(&order.status) {
            Some(OrderStatus::Paid) => Paid::Before(order),
            _ => Paid::NotPayable(order),
        },
        _ => Paid::NotFound,
    })
}
