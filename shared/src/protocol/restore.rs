//! A buyer's field in `users` that Redis lost (a failover that dropped the last writes) while
//! the sale stayed loaded, restored from the database's live orders: marked in the ledger
//! (`lua/mark_lost.lua`), the database read after the mark, then the field written only
//! while the mark stands (`lua/restore_user.lua`). A purchase or a cancel of the user replaces
//! the mark before it changes anything, and a load from scratch empties the ledger, so the
//! field is written only for an order still live when it is written. Reconcile restores every
//! sale's lost fields; a cancel restores its own order's before it announces itself.
//! docs/invariants.md, "Lost fields".

use crate::domain::order;
use crate::infra::pause;
use crate::store::conn::{Redis, StoreError};
use crate::store::keys::Bucket;
use crate::store::repair::{self, RestoreCode, TakeOver};
use std::collections::HashMap;
use uuid::Uuid;

/// Why a restore stopped: the database or Redis was out of reach. Marks it left are replaced
/// by the user's next step or dropped by reconcile once stale.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Who restores: names the pause points between the steps and whether the restore takes
/// over another check's mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restorer {
    /// Reconcile's walk of every live order: leaves a user another check has marked to the
    /// next run.
    Reconcile,
    /// A cancel of an order whose field is missing: it needs the field now, so it takes over
    /// an orphan check's or another restore's mark.
    Cancel,
}

impl Restorer {
    fn take_over(self) -> TakeOver {
        match self {
            Restorer::Reconcile => TakeOver::Wait,
            Restorer::Cancel => TakeOver::Take,
        }
    }

    /// Pause points: after the mark, and after the database's read.
    fn points(self) -> (&'static str, &'static str) {
        match self {
            Restorer::Reconcile => (
                "reconcile.fields.before_db_check",
                "reconcile.fields.before_restore",
            ),
            Restorer::Cancel => (
                "cancel.restore.before_db_check",
                "cancel.restore.before_restore",
            ),
        }
    }
}

/// Restores the fields of `holders` (users of `bucket`, each with the request id of the live
/// order the database listed) whose field does not name that order. Returns how many fields
/// it wrote.
#[tracing::instrument(skip_all, fields(activity_id = bucket.activity_id, bucket = bucket.index))]
pub async fn restore_fields(
    pool: &sqlx::PgPool,
    redis: &Redis,
    bucket: Bucket,
    holders: &[(String, Uuid)],
    by: Restorer,
    now_ms: i64,
) -> Result<usize, RestoreError> {
    let token = Uuid::new_v4().simple().to_string();
    let marked = repair::mark_lost(redis, bucket, &token, now_ms, by.take_over(), holders).await?;
    if marked.is_empty() {
        return Ok(0);
    }
    let (before_db_check, before_restore) = by.points();
    pause::point(before_db_check, bucket.activity_id).await;
    // Read after the mark: a cancel that commits from now on has replaced the mark first.
    let users: Vec<String> = marked.iter().map(|m| m.user.clone()).collect();
    let live: HashMap<String, Uuid> = order::live_holders_among(pool, bucket.activity_id, &users)
        .await?
        .into_iter()
        .collect();
    pause::point(before_restore, bucket.activity_id).await;
    let mut restored = 0;
    for m in &marked {
        let request_id = live.get(&m.user).copied();
        if repair::restore_user(redis, bucket, m, &token, request_id).await?
            == RestoreCode::Restored
        {
            tracing::warn!(
                user = m.user.as_str(),
                request_id = ?request_id,
                held = ?m.held,
                repair = "field_restored",
                "a live order's field in users restored"
            );
            restored += 1;
        }
    }
    Ok(restored)
}
