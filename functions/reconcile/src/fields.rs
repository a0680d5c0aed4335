//! The orphan check the other way round ([`crate::orphans`]): live orders whose holder's field in
//! `users` Redis lost (a failover that dropped the last writes while the sale stayed loaded),
//! restored from the database. The live orders are walked a page at a time in user order;
//! each page's holders whose field does not name their order are marked, the database read
//! again, and the field written only while the mark stands ([`restore::restore_fields`]).
//! docs/invariants.md, "Lost fields".

use crate::{ActivityReport, Reconcile, Walk};
use anyhow::Context as _;
use chrono::{DateTime, Utc};
use seckill_shared::domain::activity::{self, Activity};
use seckill_shared::domain::order;
use seckill_shared::infra::pause;
use seckill_shared::protocol::restore::{self, Restorer};
use seckill_shared::store::keys::Bucket;
use uuid::Uuid;

/// Live orders read (and their holders checked in Redis) per page.
const HOLDER_PAGE: i64 = 1000;

/// The walk's name in `reconcile_cursors`: the last holder checked (kept in bucket 0's row).
const WALK: &str = "holders";

impl Reconcile {
    /// Lost fields: restores the field of every holder of a live order of `a` whose
    /// field in her home bucket's `users` is missing or names another request. Returns how
    /// many fields it wrote. Every bucket must be loaded (the caller checked).
    ///
    /// The walk goes on from where the last run stopped (`reconcile_cursors`) until
    /// the sale's share is spent, a page at least, and starts over once it reached the last holder.
    pub(crate) async fn restore_lost_fields(
        &self,
        a: &Activity,
        now: DateTime<Utc>,
        mut walk: Walk,
        r: &mut ActivityReport,
    ) -> anyhow::Result<usize> {
        let count = a.bucket_count();
        // No user id is empty (the sentinel is), so "" sorts before every one.
        let mut after = activity::reconcile_cursor(&self.pool, a.id, WALK, 0)
            .await
            .context("failed to read where the lost fields' walk stopped")?
            .unwrap_or_default();
        let mut restored = 0;
        loop {
            if walk.stop(r) {
                break;
            }
            let page = order::live_holders_after(&self.pool, a.id, &after, HOLDER_PAGE)
                .await
                .context("failed to read the live orders")?;
            let Some((last, _)) = page.last() else {
                after.clear();
                break;
            };
            after = last.clone();
            pause::point("reconcile.fields.before_mark", a.id).await;
            for bucket in Bucket::all(a.id, count) {
                let mine: Vec<(String, Uuid)> = page
                    .iter()
                    .filter(|(user, _)| Bucket::home(a.id, count, user) == bucket)
                    .cloned()
                    .collect();
                if mine.is_empty() {
                    continue;
                }
                let by = Restorer::Reconcile;
                let now_ms = now.timestamp_millis();
                restored +=
                    restore::restore_fields(&self.pool, &self.redis, bucket, &mine, by, now_ms)
                        .await
                        .context("failed to restore lost fields")?;
            }
            if (page.len() as i64) < HOLDER_PAGE {
                after.clear();
                break;
            }
        }
        activity::save_reconcile_cursor(&self.pool, a.id, WALK, 0, &after)
            .await
            .context("failed to record where the lost fields' walk stopped")?;
        Ok(restored)
    }
}
