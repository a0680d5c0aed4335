//! What happens to orders once confirmed: owners cancelling (a double click too) and paying, the
//! payment-timeout release, and an admin raising, lowering and extending the sale.

use crate::world::Chaos;
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
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol::cancel;
use seckill_shared::protocol::cancel::CancelOutcome;
use seckill_shared::protocol::pay::Settled;
use std::sync::Arc;
use std::time::Duration;

/// Owners clicking on their confirmed orders: cancel twice at once (a double click), cancel
/// once, pay; and now and then the payment-timeout release with a timeout of a few seconds.
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
            0..45 => c.cancel(&order, true).await,
            45..55 => c.cancel(&order, false).await,
            _ => c.pay(&order).await,
        }
    }
    Ok(())
}

impl Chaos {
    async fn cancel(&self, order: &Order, double_click: bool) {
        // As the entry's cancel route runs it.
        let (pool, redis) = self.patient.login(Function::Entry);
        let (pool, redis) = (&pool, &redis);
        let outcomes = if double_click {
            let (a, b) = tokio::join!(
                cancel::cancel_order(pool, redis, order, Utc::now()),
                cancel::cancel_order(pool, redis, order, Utc::now())
            );
            vec![a, b]
        } else {
            vec![cancel::cancel_order(pool, redis, order, Utc::now()).await]
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

    async fn pay(&self, order: &Order) {
        let paid = testkit::pay(&self.patient, order.id, self.patient.config.payment_timeout).await;
        let refused = !matches!(
            paid,
            Ok(Ok(Settled::Decided {
                outcome: Outcome::Paid,
                ..
            }))
        );
        self.count(|r| {
            r.pays += 1;
            r.pays_refused += u64::from(refused);
        });
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
