//! The orphan check: users in a bucket's `users` with neither a ledger entry nor a live order are
//! removed, each marked in the ledger before the database is read and dropped only while the
//! mark is still there (`lua/mark_users.lua`, `lua/drop_user.lua`). docs/invariants.md,
//! "Reconcile", the orphan check.

use crate::{ActivityReport, Reconcile, Walk};
use anyhow::Context as _;
use chrono::{DateTime, Utc};
use seckill_shared::domain::{activity, order};
use seckill_shared::infra::pause;
use seckill_shared::store::conn::{Redis, StoreError};
use seckill_shared::store::keys::{Bucket, SENTINEL};
use seckill_shared::store::repair;
use std::collections::HashSet;
use uuid::Uuid;

/// Users checked against the database per query.
const USER_CHUNK: usize = 1000;

/// The orphan check's walk in `reconcile_cursors`: a bucket's `users` by `HSCAN` cursor.
const WALK: &str = "users";

impl Reconcile {
    /// The orphan check: removes users in a bucket's `users` with neither a ledger entry nor a live
    /// order.
    ///
    /// `users` is walked by `HSCAN`, a chunk at a time, from where the last run stopped
    /// (`reconcile_cursors`) until the sale's share is spent. Each chunk's users without a ledger entry get a
    /// mark in the ledger (`lua/mark_users.lua`) *before* the database is read, and are removed
    /// only if the mark is still there (`lua/drop_user.lua`). Anything the user does meanwhile
    /// (a cancel, which begins by overwriting the mark, and so any re-purchase after it)
    /// removes the mark, and the user is kept.
    pub(crate) async fn drop_orphan_users(
        &self,
        bucket: Bucket,
        now: DateTime<Utc>,
        mut walk: Walk,
        r: &mut ActivityReport,
    ) -> anyhow::Result<usize> {
        let id = bucket.activity_id;
        let at = i32::try_from(bucket.index).context("bucket index")?;
        let mut cursor = activity::reconcile_cursor(&self.pool, id, WALK, at)
            .await
            .context("failed to read where the orphan check stopped")?
            .unwrap_or_else(|| "0".into());
        let mut dropped = 0;
        loop {
            if walk.stop(r) {
                break;
            }
            let (next, users) = scan_users(&self.redis, bucket, &cursor)
                .await
                .context("failed to scan the users")?;
            dropped += self.check_users(bucket, now, &users).await?;
            cursor = next;
            activity::save_reconcile_cursor(&self.pool, id, WALK, at, &cursor)
                .await
                .context("failed to record where the orphan check stopped")?;
            if cursor == "0" {
                break;
            }
        }
        Ok(dropped)
    }

    /// One chunk of the orphan check: marks those of `users` with no ledger entry (the script
    /// skips the others), reads their live orders, and drops each whose mark still stands and
    /// who holds none.
    async fn check_users(
        &self,
        bucket: Bucket,
        now: DateTime<Utc>,
        users: &[String],
    ) -> anyhow::Result<usize> {
        let id = bucket.activity_id;
        if users.is_empty() {
            return Ok(0);
        }
        let token = Uuid::new_v4().simple().to_string();
        let marked = repair::mark_users(&self.redis, bucket, &token, now.timestamp_millis(), users)
            .await
            .context("failed to mark the orphan candidates")?;
        if marked.is_empty() {
            return Ok(0);
        }
        pause::point("reconcile.orphans.before_db_check", id).await;
        let active: HashSet<String> = order::live_holders_among(&self.pool, id, &marked)
            .await
            .context("failed to look up the orders of users in `users`")?
            .into_iter()
            .map(|(user, _)| user)
            .collect();
        pause::point("reconcile.orphans.before_drop", id).await;
        let mut dropped = 0;
        for user in &marked {
            let orphan = !active.contains(user);
            if repair::drop_user(&self.redis, bucket, user, &token, orphan).await? {
                tracing::warn!(
                    user = user.as_str(),
                    repair = "user_dropped",
                    "user with nothing behind them removed from users"
                );
                dropped += 1;
            }
        }
        Ok(dropped)
    }
}

/// One `HSCAN` step of a bucket's `users` from `cursor` (about [`USER_CHUNK`] fields), without
/// the sentinel field: the next cursor ("0" at the end) and the users.
async fn scan_users(
    redis: &Redis,
    bucket: Bucket,
    cursor: &str,
) -> Result<(String, Vec<String>), StoreError> {
    let keys = redis.bucket_keys(bucket);
    let (next, batch): (String, Vec<String>) = redis
        .cmd(
            redis::cmd("HSCAN")
                .arg(&keys.users)
                .arg(cursor)
                .arg("COUNT")
                .arg(USER_CHUNK),
        )
        .await?;
    // Field, value, field, value... (`NOVALUES` needs Redis 7.4).
    let mut users: Vec<String> = batch
        .into_iter()
        .step_by(2)
        .filter(|u| u != SENTINEL)
        .collect();
    // HSCAN may return a field more than once.
    users.sort_unstable();
    users.dedup();
    Ok((next, users))
}
