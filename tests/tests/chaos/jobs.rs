//! The scheduled jobs while the actors run: preheat, and with reconcile on reconcile.

use crate::world::Chaos;
use chrono::Utc;
use rand::RngExt;
use reconcile::ReconcileReport;
use std::sync::Arc;

pub async fn preheats(c: Arc<Chaos>) -> anyhow::Result<()> {
    let job = c.patient.preheat();
    let mut rng = c.rng(600);
    while c.nap(rng.random_range(400..1500)).await {
        let outcome = job.run(Utc::now()).await;
        c.count(|r| {
            r.preheats += 1;
            match &outcome {
                Ok(p) => {
                    r.preheat_loaded += p.loaded as u64;
                    r.preheat_errors += p.errors.len() as u64;
                }
                Err(_) => r.preheat_errors += 1,
            }
        });
    }
    Ok(())
}

pub async fn reconciles(c: Arc<Chaos>) -> anyhow::Result<()> {
    let job = c.patient.reconcile();
    let mut rng = c.rng(900);
    while c.nap(rng.random_range(500..1500)).await {
        let outcome = job.run(Utc::now()).await;
        c.count_reconcile(&outcome);
    }
    Ok(())
}

impl Chaos {
    pub fn count_reconcile(&self, outcome: &anyhow::Result<ReconcileReport>) {
        self.count(|r| {
            r.reconciles += 1;
            match outcome {
                Ok(rep) => {
                    r.reconcile_repairs +=
                        rep.activities.iter().map(|a| a.repairs as u64).sum::<u64>();
                    r.reconcile_errors += rep.errors.len() as u64;
                }
                Err(_) => r.reconcile_errors += 1,
            }
        });
    }
}
