//! What happens to orders once confirmed: owners cancelling (a double click too) and paying
//! through the Stripe provider at localstripe (the fake of Stripe's API), paying while
//! cancelling, giving a payment up half way; the provider's event, late or twice; the
//! payment-timeout release; and an admin raising, lowering and extending the sale.

use crate::world::{lock, Chaos};
use anyhow::Context as _;
use chrono::{Duration as ChronoDuration, Utc};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::RngExt;
use reconcile::ReconcileReport;
use seckill_shared::domain::activity;
use seckill_shared::domain::order;
use seckill_shared::domain::order::Order;
use seckill_shared::domain::payment::Outcome;
use seckill_shared::domain::settings::ActivityPatch;
use seckill_shared::infra::payments::Event;
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol::cancel::{CancelOutcome, Canceller};
use seckill_shared::protocol::pay::{self, Settled, Started};
use std::sync::Arc;
use std::time::Duration;
use testkit::localstripe;

/// Owners clicking on their confirmed orders: cancel twice at once (a double click), cancel
/// once, pay, pay and cancel at once; and now and then the payment-timeout release with a
/// timeout of a few seconds.
pub async fn order_clicks(c: Arc<Chaos>) -> anyhow::Result<()> {
    let mut rng = c.rng(400);
    while c.nap(rng.random_range(50..250)).await {
        let roll = rng.random_range(0..100);
        if roll >= 80 {
            c.release_unpaid(&mut rng).await;
            continue;
        }
        let id = c.pick_activity(&mut rng);
        // The buyer's view of her orders: as the entry reads them.
        let (entry, _) = c.patient.login(Function::Entry);
        let confirmed: Vec<i64> = sqlx::query_scalar(
            "select id from orders where activity_id = $1 and status = 'confirmed' order by id",
        )
        .bind(id)
        .fetch_all(&entry)
        .await?;
        let Some(&order_id) = confirmed.choose(&mut rng) else {
            continue;
        };
        let Some(order) = order::get(&entry, order_id).await? else {
            continue;
        };
        match roll {
            0..25 => c.cancel(&order, true).await,
            25..35 => c.cancel(&order, false).await,
            35..55 => {
                c.count(|r| *r.payments.entry("paid while cancelling").or_default() += 1);
                let pay = c.pay(&order, &mut rng);
                let cancel = c.cancel(&order, false);
                tokio::join!(pay, cancel);
            }
            _ => c.pay(&order, &mut rng).await,
        }
    }
    Ok(())
}

impl Chaos {
    async fn cancel(&self, order: &Order, double_click: bool) {
        // As the entry's cancel route runs it: the payment closed at the provider first.
        let (pool, redis) = self.patient.login(Function::Entry);
        let (pool, redis) = (&pool, &redis);
        let provider = Some(self.stripe.as_ref());
        let click =
            || pay::cancel_unpaid(pool, redis, provider, order, Utc::now(), Canceller::Owner);
        let outcomes = if double_click {
            let (a, b) = tokio::join!(click(), click());
            vec![a, b]
        } else {
            vec![click().await]
        };
        let cancelled = outcomes
            .iter()
            .filter(|o| matches!(o, Ok(CancelOutcome::Cancelled { .. })))
            .count();
        if cancelled > 1 {
            self.violate(
                "cancel_exactly_once",
                Some(order.activity_id),
                format!(
                    "order {} was cancelled by both clicks of a double click",
                    order.id
                ),
            );
        }
        self.count(|r| {
            r.cancel_clicks += outcomes.len() as u64;
            for o in &outcomes {
                let label = match o {
                    Ok(CancelOutcome::Cancelled { .. }) => "cancelled",
                    Ok(CancelOutcome::AlreadyCancelled) => "already cancelled",
                    Ok(CancelOutcome::NotCancellable(_)) => "not cancellable",
                    Ok(CancelOutcome::Busy) => "busy",
                    Err(_) => "error",
                };
                *r.cancels.entry(label).or_default() += 1;
            }
        });
    }

    /// The owner pays as the storefront does with Stripe: the pay route starts the payment
    /// (the PaymentIntent), the buyer confirms it at the provider (or gives up half way, for
    /// the release to close), and the provider's event comes, now or up to 1.5 s late, now
    /// and then twice at once.
    async fn pay(&self, order: &Order, rng: &mut StdRng) {
        let (abandon, delay, twice) = (
            rng.random_bool(0.15),
            Duration::from_millis(rng.random_range(0..1500)),
            rng.random_bool(0.2),
        );
        let (pool, _) = self.patient.login(Function::Entry);
        let timeout = self.patient.config.payment_timeout;
        let started = pay::start(&pool, self.stripe.as_ref(), order, Utc::now(), timeout).await;
        let payment = match started {
            Ok(Started::Pending { payment, .. }) => payment,
            Ok(Started::Paid(_)) | Ok(Started::NotPayable(_)) | Err(_) => {
                self.count(|r| {
                    r.pays += 1;
                    r.pays_refused += 1;
                });
                return;
            }
        };
        let pi = payment.provider_payment_id.clone();
        lock(&self.payments).push((order.id, pi.clone()));
        let what = if abandon {
            "abandoned"
        } else if localstripe::buyer_pays(&pi).await.is_err() {
            "refused at the provider"
        } else {
            tokio::time::sleep(delay).await;
            // A redelivery is the same event, id and all.
            let event_id = format!("evt_{}", uuid::Uuid::new_v4().simple());
            let outcomes = if twice {
                let (a, b) = tokio::join!(
                    self.event(&pool, &pi, &event_id),
                    self.event(&pool, &pi, &event_id)
                );
                vec![a, b]
            } else {
                vec![self.event(&pool, &pi, &event_id).await]
            };
            let paid = outcomes.iter().any(|o| {
                matches!(
                    o,
                    Some(Settled::Decided {
                        outcome: Outcome::Paid,
                        ..
                    })
                )
            });
            if paid {
                "paid by its event"
            } else {
                "paid at the provider, not the order"
            }
        };
        self.count(|r| {
            r.pays += 1;
            r.pays_refused += u64::from(what != "paid by its event");
            *r.payments.entry(what).or_default() += 1;
        });
    }

    /// The provider's `payment_intent.succeeded` event about `pi`, as Stripe sends it (the
    /// intent read from localstripe as its object), settled as the entry's webhook does; tried
    /// again as the provider redelivers after an error.
    async fn event(&self, pool: &sqlx::PgPool, pi: &str, event_id: &str) -> Option<Settled> {
        let stack = &self.patient.config.payments.stack;
        for _ in 0..3 {
            let Ok(intent) = localstripe::intent(pi).await else {
                continue;
            };
            let body = localstripe::succeeded_event_of(event_id, &intent);
            let event: Event = serde_json::from_str(&body).expect("an event");
            if let Ok(settled) = pay::settle(pool, "stripe", stack, &event, Utc::now()).await {
                return Some(settled);
            }
        }
        None
    }

    /// Reconcile's payment-timeout release alone (not a reconcile run), with a timeout of 1-4 s.
    async fn release_unpaid(&self, rng: &mut StdRng) {
        let timeout = Duration::from_millis(rng.random_range(1000..=4000));
        let job = self
            .patient
            .reconcile_with(|c| c.config.payment_timeout = timeout);
        let mut report = ReconcileReport::default();
        job.release_unpaid(Utc::now(), &mut report).await;
        self.count(|r| {
            r.release_runs += 1;
            r.released += report.released_unpaid as u64;
            r.release_deferred += report.release_deferred as u64;
            r.release_errors += report.errors.len() as u64;
        });
    }
}
/// An admin raising, lowering (maybe below what is sold: refused) and extending the sale.
pub async fn admin_changes(c: Arc<Chaos>) -> anyhow::Result<()> {
    let state = c.patient.admin_state();
    let mut rng = c.rng(500);
    while c.nap(rng.random_range(300..1000)).await {
        let id = c.pick_activity(&mut rng);
        let current = activity::get(c.patient.observer().0, id)
            .await?
            .with_context(|| format!("sale {id} is gone from the database"))?;
        let total = current.total_stock;
        let (what, patch) = match rng.random_range(0..100) {
            0..40 => (
                "raise",
                ActivityPatch {
                    total_stock: Some(total + rng.random_range(1..=8)),
                    ..Default::default()
                },
            ),
            40..75 => (
                "lower",
                ActivityPatch {
                    total_stock: Some((total - rng.random_range(1..=8)).max(1)),
                    ..Default::default()
                },
            ),
            _ => (
                "extend",
                ActivityPatch {
                    end_at: Some(
                        current.end_at + ChronoDuration::minutes(rng.random_range(1..=30)),
                    ),
                    ..Default::default()
                },
            ),
        };
        let outcome = match admin::update_activity(&state, id, &patch).await {
            Ok(_) => "ok",
            Err(e) => e.code(),
        };
        c.count(|r| *r.admin.entry(format!("{what} {outcome}")).or_default() += 1);
    }
    Ok(())
}
