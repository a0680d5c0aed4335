//! Paying a confirmed order, in two steps: its owner starts a payment at the provider for
//! exactly the order's amount ([`start`]), and the provider's signed event marks the order paid
//! ([`settle`]), once per event id. No call of a buyer marks anything paid.
//!
//! The event's one transaction locks the order and pays it only while it is `confirmed` and
//! within the payment timeout; a cancel (its owner's, or the payment timeout's) updates the
//! same row on the same condition, so whichever commits first wins, and a payment that loses
//! is recorded `refund_due`: money back, never a unit back on sale.

use crate::domain::activity;
use crate::domain::order::{self, Order};
use crate::domain::payment::{self, EventRow, Outcome, Payment};
use crate::domain::status::{OrderStatus, PaymentStatus};
use crate::infra::pause;
use crate::infra::payments::{
    Event, PaymentRequest, Provider, ProviderError, StartedPayment, SUCCEEDED,
};
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use sqlx::PgPool;
use std::time::Duration;

/// When an order's payment timeout passes: reconcile releases it after this, and a payment
/// arriving later is owed back.
pub fn payment_deadline(order: &Order, timeout: Duration) -> DateTime<Utc> {
    order.created_at + ChronoDuration::from_std(timeout).unwrap_or(ChronoDuration::minutes(15))
}

/// What [`start`] found.
#[derive(Debug)]
pub enum Started {
    /// The order's payment, started now or before: the client completes it with what the
    /// provider answered.
    Pending {
        payment: Payment,
        started: StartedPayment,
    },
    /// Paid already.
    Paid(Payment),
    /// It cannot be paid: cancelled, failed, past its payment timeout, or a sale with no price.
    NotPayable(String),
}

/// Why a payment could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Provider(#[from] ProviderError),
}

/// Starts (or finds) the payment of `order`, which its owner asked to pay at `now`: the sale's
/// price times the quantity, one payment per order whoever asks how often.
pub async fn start(
    pool: &PgPool,
    provider: &dyn Provider,
    order: &Order,
    now: DateTime<Utc>,
    timeout: Duration,
) -> Result<Started, StartError> {
    let existing = payment::of_order(pool, order.id).await?;
    if let Some(p) = existing
        .as_ref()
        .filter(|p| p.status == PaymentStatus::Succeeded)
    {
        return Ok(Started::Paid(p.clone()));
    }
    match order.status {
        OrderStatus::Paid => {
            if let Some(p) = existing {
                return Ok(Started::Paid(p));
            }
            return Ok(Started::NotPayable(format!("order {} is paid", order.id)));
        }
        OrderStatus::Confirmed if now < payment_deadline(order, timeout) => {}
        OrderStatus::Confirmed => {
            return Ok(Started::NotPayable(format!(
                "order {} is past its payment timeout and is being released",
                order.id
            )))
        }
        _ => {
            return Ok(Started::NotPayable(format!(
                "order {} is {} and cannot be paid",
                order.id, order.status
            )))
        }
    }
    // A payment started before keeps its amount; the provider answers the same payment again
    // (one per order by its idempotency key), with what the client completes it with.
    let request = match &existing {
        Some(p) => PaymentRequest {
            order_id: order.id,
            amount_minor: p.amount_minor,
            currency: p.currency.clone(),
        },
        None => {
            let Some(activity) = activity::get(pool, order.activity_id).await? else {
                return Ok(Started::NotPayable(format!(
                    "order {} has no sale",
                    order.id
                )));
            };
            if activity.price_minor <= 0 {
                return Ok(Started::NotPayable(format!(
                    "sale {} has no price yet",
                    activity.id
                )));
            }
            PaymentRequest {
                order_id: order.id,
                amount_minor: activity.price_minor * order.quantity,
                currency: activity.currency,
            }
        }
    };
    let mut started = provider.start(&request).await?;
    let payment = payment::insert_or_get(
        pool,
        order.id,
        provider.name(),
        &started.provider_payment_id,
        request.amount_minor,
        &request.currency,
    )
    .await?;
    if payment.provider_payment_id != started.provider_payment_id {
        // A concurrent start recorded its payment first: that one is the order's.
        started = StartedPayment {
            complete_url: provider.complete_url(&payment.provider_payment_id),
            provider_payment_id: payment.provider_payment_id.clone(),
            client_secret: None,
        };
    }
    tracing::info!(order_id = order.id, amount_minor = payment.amount_minor,
        currency = %payment.currency, "payment started");
    Ok(Started::Pending { payment, started })
}

/// What [`settle`] did with an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    /// Decided now.
    Decided { outcome: Outcome, order_id: i64 },
    /// Decided before (a redelivery): nothing changed now.
    Replayed { outcome: Outcome, order_id: i64 },
    /// Not an event that pays (another kind): acknowledged, nothing changed.
    Ignored,
}

/// Why an event was refused; nothing changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    #[error("no payment {0} was started here")]
    UnknownPayment(String),
    #[error("the event names order {event} but payment {payment} is order {order}'s")]
    OtherOrder {
        event: i64,
        payment: String,
        order: i64,
    },
    #[error("the event pays {event_amount} {event_currency}; the payment is {amount} {currency}")]
    Amount {
        event_amount: i64,
        event_currency: String,
        amount: i64,
        currency: String,
    },
}

/// Decides a verified provider `event` at `now`, exactly once per event id, in one
/// transaction: the payment it names must match (order, amount, currency), and the order is
/// paid only while `confirmed` and within its payment `timeout`, else the payment is
/// recorded `refund_due`.
pub async fn settle(
    pool: &PgPool,
    provider: &str,
    event: &Event,
    now: DateTime<Utc>,
    timeout: Duration,
) -> Result<Result<Settled, Mismatch>, sqlx::Error> {
    if event.kind != SUCCEEDED {
        return Ok(Ok(Settled::Ignored));
    }
    if let Some((outcome, order_id)) = payment::event_outcome(pool, &event.id).await? {
        return Ok(Ok(Settled::Replayed { outcome, order_id }));
    }
    let paid = &event.data.object;
    let mut tx = pool.begin().await?;
    let Some(payment) = payment::by_provider_id_for_update(&mut tx, provider, &paid.id).await?
    else {
        return Ok(Err(Mismatch::UnknownPayment(paid.id.clone())));
    };
    if let Some(event_order) = paid.order_id().filter(|id| *id != payment.order_id) {
        return Ok(Err(Mismatch::OtherOrder {
            event: event_order,
            payment: paid.id.clone(),
            order: payment.order_id,
        }));
    }
    if paid.amount != payment.amount_minor || !paid.currency.eq_ignore_ascii_case(&payment.currency)
    {
        return Ok(Err(Mismatch::Amount {
            event_amount: paid.amount,
            event_currency: paid.currency.clone(),
            amount: payment.amount_minor,
            currency: payment.currency,
        }));
    }
    let order = order::get_for_payment(&mut tx, payment.order_id)
        .await?
        .ok_or(sqlx::Error::RowNotFound)?;
    pause::point("pay.settle_locked", order.activity_id).await;
    let outcome = match order.status {
        OrderStatus::Paid => Outcome::AlreadyPaid,
        OrderStatus::Confirmed if now < payment_deadline(&order, timeout) => {
            let marked = order::mark_paid(&mut tx, order.id, provider, &paid.id, now).await?;
            if !marked {
                return Err(sqlx::Error::RowNotFound);
            }
            payment::mark_succeeded(&mut tx, order.id, now).await?;
            Outcome::Paid
        }
        _ => Outcome::RefundDue,
    };
    let recorded = payment::insert_event(
        &mut tx,
        &EventRow {
            event_id: &event.id,
            provider,
            kind: &event.kind,
            provider_payment_id: &paid.id,
            order_id: order.id,
            amount_minor: paid.amount,
            currency: &payment.currency,
            outcome,
        },
    )
    .await?;
    if !recorded {
        // A concurrent delivery of this event committed first: its decision stands.
        tx.rollback().await?;
        let (outcome, order_id) = payment::event_outcome(pool, &event.id)
            .await?
            .ok_or(sqlx::Error::RowNotFound)?;
        return Ok(Ok(Settled::Replayed { outcome, order_id }));
    }
    tx.commit().await?;
    match outcome {
        Outcome::RefundDue => tracing::warn!(order_id = order.id, status = %order.status,
            event_id = %event.id, "payment for an order that can no longer be paid: refund due"),
        _ => tracing::info!(
            order_id = order.id,
            outcome = outcome.as_str(),
            "payment settled"
        ),
    }
    Ok(Ok(Settled::Decided {
        outcome,
        order_id: order.id,
    }))
}
