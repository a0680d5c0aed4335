//! The watcher: samples of what holds at every moment (the kit's invariant checker's promises that
//! do not wait for quiescence).

use crate::world::Chaos;
use rand::RngExt;
use seckill_shared::store::view;
use std::sync::Arc;
use testkit::invariants::{self};

/// Samples throughout: Redis stock never negative, the database never oversold.
pub async fn watcher(c: Arc<Chaos>) -> anyhow::Result<()> {
    let mut rng = c.rng(700);
    while c.nap(rng.random_range(30..100)).await {
        for &id in &c.activities {
            c.sample(id).await?;
        }
    }
    Ok(())
}

impl Chaos {
    async fn sample(&self, id: i64) -> anyhow::Result<()> {
        // Read as the operator (the admin function's logins), as a run is watched from outside.
        let (pool, redis) = self.patient.observer();
        // The raw value: the snapshot reports a negative stock as missing.
        for bucket in self.buckets_of(id) {
            match view::stock(redis, bucket).await {
                Ok(stock) => {
                    if let Some(v) = invariants::stock_never_negative(bucket, stock) {
                        self.broke(id, v);
                    }
                }
                Err(_) => self.count(|r| r.watcher_errors += 1),
            }
        }
        // One snapshot: the total and the orders are read at the same moment.
        let db = invariants::Database::read(pool, id).await?;
        if let Some(v) = db.never_oversold() {
            self.broke(id, v);
        }
        self.count(|r| r.watcher_samples += 1);
        Ok(())
    }
}
