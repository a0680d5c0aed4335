//! Step 3: users in a bucket's `users` with neither a ledger entry nor a live order are
//! removed, each marked in the ledger before the database is read and dropped only while the
//! mark is still there (`lua/mark_users.lua`, `lua/drop_user.lua`). docs/invariants.md,
//! "Reconcile", step 3.

use crate::Reconcile;
use anyhow::Context as _;
use chrono::{DateTime, Utc};
use seckill_shared::domain::order;
use seckill_shared::infra::pause;
use seckill_shared::store::conn::{Redis, StoreError};
use seckill_shared::store::keys::{Bucket, SENTINEL};
use seckill_shared::store::repair;
use std::collections::HashSet;
use uuid::Uuid;

/// Users checked against the database per query.
const USER_CHUNK: usize = 1000;

impl Reconcile {
    /// Step 3: removes users in a bucket's `users` with neither a ledger entry nor a live
    /// order.
    ///
    /// `users` is scanned first and the ledger read after it; each candidate then gets a mark
    /// in the ledger (`lua/mark_users.lua`) *before* the database is read, and is removed only
    /// if the mark is still there (`lua/drop_user.lua`). Anything the user does meanwhile (a
    /// cancel, which begins by overwriting the mark, and so any re-purchase after it) removes
    /// the mark, and the user is kept.
    pub(crate) async fn drop_orphan_users(
        &self,
        bucket: Bucket,
        now: DateTime<Utc>,
    ) -> anyhow::Result<usize> {
        let id = bucket.activity_id;
        let users = scan_users(&self.redis, bucket)
            .await
            .context("failed to scan the users")?;
        if users.is_empty() {
            return Ok(0);
        }
        let keys = self.redis.bucket_keys(bucket);
        let ledger: Vec<String> = self
            .redis
            .cmd(redis::cmd("HKEYS").arg(&keys.ledger))
            .await
            .context("failed to read the ledger")?;
        let ledger: HashSet<String> = ledger.into_iter().collect();
        let candidates: Vec<String> = users.into_iter().filter(|u| !ledger.contains(u)).collect();

        let token = Uuid::new_v4().simple().to_string();
        let mut dropped = 0;
        for chunk in candidates.chunks(USER_CHUNK) {
            let marked =
                repair::mark_users(&self.redis, bucket, &token, now.timestamp_millis(), chunk)
                    .await
                    .context("failed to mark the orphan candidates")?;
            pause::point("reconcile.orphans.before_db_check", id).await;
            let active: HashSet<String> = order::live_holders_among(&self.pool, id, &marked)
                .await
                .context("failed to look up the orders of users in `users`")?
                .into_iter()
                .map(|(user, _)| user)
                .collect();
            pause::point("reconcile.orphans.before_drop", id).await;
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
        }
        Ok(dropped)
    }
}

/// Every user of a bucket's `users` hash, by `HSCAN` (never one huge `HKEYS` reply), without
/// the sentinel field.
async fn scan_users(redis: &Redis, bucket: Bucket) -> Result<Vec<String>, StoreError> {
    let keys = redis.bucket_keys(bucket);
    let mut cursor = "0".to_string();
    let mut users = Vec::new();
    loop {
        let (next, batch): (String, Vec<String>) = redis
            .cmd(
                redis::cmd("HSCAN")
                    .arg(&keys.users)
                    .arg(&cursor)
                    .arg("COUNT")
                    .arg(1000),
            )
            .await?;
        // Field, value, field, value... (`NOVALUES` needs Redis 7.4).
        let fields = batch.into_iter().step_by(2);
        users.extend(fields.filter(|u| u != SENTINEL));
        if next == "0" {
            break;
        }
        cursor = next;
    }
    // HSCAN may return a field more than once.
    users.sort_unstable();
    users.dedup();
    Ok(users)
}
