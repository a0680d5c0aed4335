//! Paying a confirmed order, in two steps: its owner starts a payment at the provider for
//! exactly the order's amount ([`start`]), and the provider's signed event marks the order paid
//! ([`settle`]), once per event id. No call of a buyer marks anything paid.
//!
//! When the buyer paid decides, not when the event arrives: an order is cancelled (by its
//! owner, or by the payment timeout's release) only after its payment was closed at the
//! provider ([`cancel_unpaid`]): cancelled there, so that it can never succeed; when the
//! provider says it succeeded, the order is left for its event to pay, its unit never back on
//! sale. The database refuses the cancel of an order whose payment is still open, and opens a
//! payment only for a confirmed order, under the order's row lock. So the event's one
//! transaction pays any order still `confirmed`, however late it arrives; a payment that finds
//! its order cancelled anyway (a provider that could not cancel it) is recorded `refund_due`:
//! money back, refunded by reconcile, never a unit back on sale.

use crate::domain::order::{self, Order};
use crate::domain::payment::{self, EventRow, Outcome, Payment};
use crate::domain::status::{OrderStatus, PaymentStatus};
use crate::infra::pause;
use crate::infra::payments::{
    Closed, Event, PaymentRequest, Provider, ProviderError, StartedPayment, DISPUTE_PREFIX,
    PROVIDER_TIMEOUT, REFUNDED, SUCCEEDED,
};
use crate::protocol::cancel::{self, CancelError, CancelOutcome, Canceller};
use crate::store::conn::Redis;
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use sqlx::PgPool;
use std::time::Duration;

/// When an order's payment timeout passes: no payment starts after it, and reconcile
/// releases the order (its payment closed at the provider first).
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
    if let Some(p) = existing
        .as_ref()
        .filter(|p| p.status == PaymentStatus::Cancelled)
    {
        return Ok(Started::NotPayable(format!(
            "order {}'s payment {} was cancelled: the order is being cancelled",
            order.id, p.provider_payment_id
        )));
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
    // A payment started before is read back at the provider (what the client completes it
    // with); none yet: the order's price times its quantity, started once per order and stack
    // (the provider's idempotency key).
    if let Some(p) = existing.as_ref().filter(|p| p.provider == provider.name()) {
        let started = provider.resume(&p.provider_payment_id).await?;
        return Ok(Started::Pending {
            payment: p.clone(),
            started,
        });
    }
    let (Some(unit_price_minor), Some(currency)) = (order.unit_price_minor, order.currency.clone())
    else {
        return Ok(Started::NotPayable(format!(
            "order {} has no price",
            order.id
        )));
    };
    if unit_price_minor <= 0 {
        return Ok(Started::NotPayable(format!(
            "sale {} has no price",
            order.activity_id
        )));
    }
    let request = PaymentRequest {
        order_id: order.id,
        amount_minor: unit_price_minor * order.quantity,
        currency,
    };
    let mut started = provider.start(&request).await?;
    let opened = payment::open(
        pool,
        order.id,
        provider.name(),
        &started.provider_payment_id,
        request.amount_minor,
        &request.currency,
    )
    .await?;
    let Some(payment) = opened else {
        // Cancelled or released since it was read: the payment just made at the provider is
        // nobody's (its client secret was never handed out); closed there, as far as it goes.
        // One provider timeout in all, the read-back of a refused cancel included: the pay
        // route's budget has room for one call here, not two.
        if existing.is_none() {
            let cancel = provider.cancel(&started.provider_payment_id);
            match tokio::time::timeout(PROVIDER_TIMEOUT, cancel).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(order_id = order.id, error = %e,
                    "payment of an order cancelled meanwhile not cancelled at the provider"),
                Err(_) => tracing::warn!(
                    order_id = order.id,
                    "payment of an order cancelled meanwhile: its cancel timed out"
                ),
            }
        }
        return Ok(Started::NotPayable(format!(
            "order {} was cancelled meanwhile",
            order.id
        )));
    };
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settled {
    /// Decided now.
    Decided { outcome: Outcome, order_id: i64 },
    /// Decided before (a redelivery): nothing changed now.
    Replayed { outcome: Outcome, order_id: i64 },
    /// Not an event that changes anything (another kind): acknowledged, nothing changed.
    Ignored,
    /// Not this stack's payment, or not the payment it names (another order, amount or
    /// currency): nothing changed, recorded for the operator (`mismatch`, when the payment is
    /// ours) and acknowledged, so that the provider does not retry it for days.
    Mismatched(Mismatch),
}

/// Why an event changed nothing though it was signed.
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

/// The event kinds the webhook acts on: a payment that succeeded, a refund made at the
/// provider, and a dispute's life (`charge.dispute.created`, `…closed`, …).
fn acted_on(kind: &str) -> bool {
    kind == SUCCEEDED || kind == REFUNDED || kind.starts_with(DISPUTE_PREFIX)
}

/// Decides a verified provider `event` at `now`, exactly once per event id, in one
/// transaction under the payment's row lock (an event whose metadata names another `stack` is
/// ignored); the payment it names must match (order, amount, currency: a refund's or a
/// dispute's amount may be part of it). A success pays the order
/// while it is `confirmed` (however late: it stays confirmed until its payment is closed at
/// the provider), else the payment is owed back (`refund_due`). A refund at the provider marks
/// the payment `refunded`, a dispute flags it: neither brings a unit back.
pub async fn settle(
    pool: &PgPool,
    provider: &str,
    stack: &str,
    event: &Event,
    now: DateTime<Utc>,
) -> Result<Settled, sqlx::Error> {
    if !acted_on(&event.kind) {
        return Ok(Settled::Ignored);
    }
    // Another stack's payment on the same provider account: not ours to act on or count.
    if event
        .data
        .object
        .metadata
        .get("stack")
        .is_some_and(|s| s != stack)
    {
        return Ok(Settled::Ignored);
    }
    if let Some((outcome, order_id)) = payment::event_outcome(pool, &event.id).await? {
        return Ok(Settled::Replayed { outcome, order_id });
    }
    let object = &event.data.object;
    let payment_id = object.payment_id();
    let mut tx = pool.begin().await?;
    let Some(payment) = payment::by_provider_id_for_update(&mut tx, provider, payment_id).await?
    else {
        tracing::warn!(event_id = %event.id, kind = %event.kind,
            "a signed event of a payment this stack did not start: acknowledged, ignored");
        return Ok(Settled::Mismatched(Mismatch::UnknownPayment(
            payment_id.to_string(),
        )));
    };
    let mismatch = if let Some(event_order) = object.order_id().filter(|id| *id != payment.order_id)
    {
        Some(Mismatch::OtherOrder {
            event: event_order,
            payment: payment_id.to_string(),
            order: payment.order_id,
        })
    } else if (event.kind == SUCCEEDED && object.amount != payment.amount_minor)
        || object.amount > payment.amount_minor
        || !object.currency.eq_ignore_ascii_case(&payment.currency)
    {
        Some(Mismatch::Amount {
            event_amount: object.amount,
            event_currency: object.currency.clone(),
            amount: payment.amount_minor,
            currency: payment.currency.clone(),
        })
    } else {
        None
    };
    let order = order::get_for_payment(&mut tx, payment.order_id)
        .await?
        .ok_or(sqlx::Error::RowNotFound)?;
    pause::point("pay.settle_locked", order.activity_id).await;
    let outcome = match (&mismatch, event.kind.as_str()) {
        (Some(_), _) => Outcome::Mismatch,
        (None, SUCCEEDED) => match order.status {
            OrderStatus::Paid => Outcome::AlreadyPaid,
            // A payment recorded cancelled pays nothing (the provider said it could not
            // succeed).
            OrderStatus::Confirmed if payment.status == PaymentStatus::RequiresPayment => {
                let marked = order::mark_paid(&mut tx, order.id, provider, payment_id, now).await?;
                if !marked {
                    return Err(sqlx::Error::RowNotFound);
                }
                payment::mark_succeeded(&mut tx, order.id, now).await?;
                Outcome::Paid
            }
            _ => {
                payment::mark_refund_due(&mut tx, order.id, now).await?;
                Outcome::RefundDue
            }
        },
        (None, REFUNDED) => {
            let refund_id = object.refund_id();
            if object.amount_refunded.unwrap_or(0) >= payment.amount_minor {
                payment::mark_refunded(&mut tx, order.id, refund_id, now).await?;
            }
            Outcome::Refunded
        }
        (None, _) => {
            payment::mark_disputed(&mut tx, order.id, now).await?;
            Outcome::Disputed
        }
    };
    let recorded = payment::insert_event(
        &mut tx,
        &EventRow {
            event_id: &event.id,
            provider,
            kind: &event.kind,
            provider_payment_id: payment_id,
            order_id: order.id,
            amount_minor: object.amount,
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
        return Ok(Settled::Replayed { outcome, order_id });
    }
    tx.commit().await?;
    let (order_id, event_id) = (order.id, &event.id);
    match outcome {
        Outcome::RefundDue => tracing::warn!(order_id, status = %order.status, %event_id,
            "payment for an order that can no longer be paid: refund due"),
        Outcome::Disputed => tracing::warn!(order_id, %event_id, kind = %event.kind,
            "payment disputed at the provider"),
        Outcome::Mismatch => tracing::warn!(order_id, %event_id,
            mismatch = %mismatch.as_ref().map(ToString::to_string).unwrap_or_default(),
            "an event that does not match its payment: recorded, nothing changed"),
        _ => tracing::info!(
            order_id,
            outcome = outcome.as_str(),
            "payment event settled"
        ),
    }
    Ok(match mismatch {
        Some(m) => Settled::Mismatched(m),
        None => Settled::Decided { outcome, order_id },
    })
}

/// What [`close`] found of an order's payment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closing {
    /// No payment open: none was started, or it is cancelled at the provider and recorded so
    /// (`asked`: by this call, which spent its time on the provider). The order may be
    /// cancelled.
    Closed { asked: bool },
    /// The order is paid (its event came).
    Paid,
    /// The provider says the buyer paid; its signed event, the one thing that marks an order
    /// paid, is on its way (the provider retries it for days). The unit stays sold: the order
    /// is not cancelled, and the event pays it whenever it arrives.
    PaidAwaitingEvent,
    /// Not closed: the payment is neither cancelled nor succeeded at the provider yet, or the
    /// provider is out of reach (or none is configured). Nothing changed; ask again later.
    Open,
}

/// Closes `order`'s payment at the provider before the order may be cancelled: a payment still
/// open is cancelled there and recorded `cancelled`. One the provider says succeeded is left
/// to its event (nothing is marked paid here: only the provider's signed event does that).
pub async fn close(
    pool: &PgPool,
    provider: Option<&dyn Provider>,
    order: &Order,
    now: DateTime<Utc>,
) -> Result<Closing, sqlx::Error> {
    let Some(p) = payment::of_order(pool, order.id).await? else {
        return Ok(Closing::Closed { asked: false });
    };
    match p.status {
        PaymentStatus::Cancelled => return Ok(Closing::Closed { asked: false }),
        PaymentStatus::Succeeded => return Ok(Closing::Paid),
        PaymentStatus::RequiresPayment => {}
    }
    let Some(provider) = provider.filter(|pr| pr.name() == p.provider) else {
        tracing::error!(order_id = order.id, provider = %p.provider,
            "an open payment and no client of its provider: the order waits");
        return Ok(Closing::Open);
    };
    pause::point("pay.before_provider_cancel", order.activity_id).await;
    // One provider timeout in all, the read-back of a refused cancel included: the owner's
    // cancel route has room for one call, and the release tries again next lap.
    let cancel = provider.cancel(&p.provider_payment_id);
    let closed = match tokio::time::timeout(PROVIDER_TIMEOUT, cancel).await {
        Ok(Ok(closed)) => closed,
        Ok(Err(e)) => {
            tracing::warn!(order_id = order.id, error = %e,
                "payment not closed at the provider; the order waits");
            return Ok(Closing::Open);
        }
        Err(_) => {
            tracing::warn!(
                order_id = order.id,
                "payment not closed at the provider in time; the order waits"
            );
            return Ok(Closing::Open);
        }
    };
    pause::point("pay.after_provider_cancel", order.activity_id).await;
    match closed {
        Closed::Cancelled => {
            payment::mark_cancelled(pool, order.id, now).await?;
            tracing::info!(order_id = order.id, "payment cancelled at the provider");
            Ok(Closing::Closed { asked: true })
        }
        Closed::Succeeded { amount_minor } => {
            tracing::warn!(
                order_id = order.id,
                amount_minor,
                "paid at the provider, its event not here yet: the order waits for it"
            );
            Ok(Closing::PaidAwaitingEvent)
        }
        Closed::Pending => Ok(Closing::Open),
    }
}

/// Cancels `order` as `by` does ([`cancel::cancel_as`]), its payment closed at the provider
/// first ([`close`]): an order paid already is `NotCancellable(paid)`; one whose payment the
/// provider says succeeded (its event on the way) or could not close yet stays as it is
/// (`Busy`), its unit sold. An owner
/// whose payment this call closed at the provider waits for no other attempt at the order
/// ([`Canceller::OwnerAfterProvider`]): the route's time went to the provider.
pub async fn cancel_unpaid(
    pool: &PgPool,
    redis: &Redis,
    provider: Option<&dyn Provider>,
    order: &Order,
    now: DateTime<Utc>,
    by: Canceller,
) -> Result<CancelOutcome, CancelError> {
    let mut by = by;
    if order.status == OrderStatus::Confirmed {
        match close(pool, provider, order, now).await? {
            // Its time went to the provider: no wait for another attempt on top.
            Closing::Closed { asked: true } if by == Canceller::Owner => {
                by = Canceller::OwnerAfterProvider;
            }
            Closing::Closed { .. } => {}
            Closing::Paid => return Ok(CancelOutcome::NotCancellable(OrderStatus::Paid)),
            Closing::PaidAwaitingEvent | Closing::Open => return Ok(CancelOutcome::Busy),
        }
    }
    cancel::cancel_as(pool, redis, order, now, by).await
}
