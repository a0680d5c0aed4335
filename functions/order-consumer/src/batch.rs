//! The batch fast path: one hot activity row serialises every order transaction on it, so a
//! batch's messages of one activity are written in one transaction (a multi-row insert from
//! `unnest` and one aggregated conditional stock update). It commits only what the
//! per-message path would: when the aggregate cannot apply (not enough stock for all, a
//! one-per-user conflict, any error) it rolls back and the messages go one by one.

use crate::{Consumer, Item};
use seckill_shared::domain::activity;
use seckill_shared::domain::order;
use seckill_shared::domain::purchase::OrderMessage;
use seckill_shared::infra::db;
use seckill_shared::store::conn::StoreError;
use seckill_shared::store::keys::Home;
use seckill_shared::store::values::LedgerEntry;
use std::collections::{BTreeMap, HashSet};
use uuid::Uuid;

impl Consumer {
    /// The batch fast path: per activity, one transaction with one multi-row insert and one
    /// aggregated conditional stock update, instead of one transaction (and one turn on the
    /// hot activity row) per order. Returns the messages it committed and the rest, which
    /// the per-message path handles.
    ///
    /// It only commits what the per-message path would have committed: messages whose
    /// reservation is in the ledger and with no row yet (the insert skips request ids someone
    /// claimed meanwhile), one per user, when the database has stock for all of them and no
    /// one-per-user conflict. Anything else (a unique
    /// violation, not enough stock for the whole group, an error) rolls the whole group back
    /// and leaves it to the per-message path, which decides each message on its own.
    pub(crate) async fn write_batches(&self, items: Vec<Item>) -> (Vec<Item>, Vec<Item>) {
        let mut groups: BTreeMap<i64, Vec<Item>> = BTreeMap::new();
        for item in items {
            groups
                .entry(item.message.attempt.activity_id)
                .or_default()
                .push(item);
        }
        let outcomes =
            futures::future::join_all(groups.into_values().map(|g| self.write_group(g))).await;
        let mut committed = Vec::new();
        let mut rest = Vec::new();
        for (c, r) in outcomes {
            committed.extend(c);
            rest.extend(r);
        }
        (committed, rest)
    }

    async fn write_group(&self, group: Vec<Item>) -> (Vec<Item>, Vec<Item>) {
        if group.len() < 2 {
            return (Vec::new(), group);
        }
        let activity_id = group[0].message.attempt.activity_id;
        // One message per user: a second request of the same user, or the same message twice,
        // is left to the per-message path.
        let mut users = HashSet::new();
        let (candidates, mut rest): (Vec<Item>, Vec<Item>) = group
            .into_iter()
            .partition(|item| users.insert(item.message.attempt.user_id.clone()));

        // The reservation must be in the ledger, exactly as in the per-message path: one
        // HMGET per home bucket (one for a sale with one bucket).
        let entries = match self.ledger_entries(&candidates).await {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(activity_id, error = %e, "batch path skipped: ledger unreadable");
                rest.extend(candidates);
                return (Vec::new(), rest);
            }
        };
        let mut held = Vec::with_capacity(candidates.len());
        for (item, entry) in candidates.into_iter().zip(entries) {
            let request = entry
                .and_then(|v| LedgerEntry::parse(&item.message.attempt.user_id, &v))
                .and_then(|e| e.request_id());
            if request == Some(item.message.attempt.request_id) {
                held.push(item);
            } else {
                rest.push(item);
            }
        }
        if held.len() < 2 {
            rest.extend(held);
            return (Vec::new(), rest);
        }

        // A stable lock order (by user) between concurrent batches of the same activity.
        held.sort_by(|a, b| a.message.attempt.user_id.cmp(&b.message.attempt.user_id));
        let messages: Vec<&OrderMessage> = held.iter().map(|i| &i.message).collect();
        let inserted = match self.write_group_tx(activity_id, &messages).await {
            Ok(Some(inserted)) => inserted,
            Ok(None) => {
                tracing::debug!(activity_id, size = held.len(), "batch path fell back");
                rest.extend(held);
                return (Vec::new(), rest);
            }
            Err(e) => {
                tracing::debug!(activity_id, error = %e, "batch path failed; falling back");
                rest.extend(held);
                return (Vec::new(), rest);
            }
        };
        // Rows that already existed were not inserted: the per-message path finds them and
        // applies what they say.
        let (committed, existing): (Vec<Item>, Vec<Item>) = held
            .into_iter()
            .partition(|i| inserted.contains(&i.message.attempt.request_id));
        rest.extend(existing);
        futures::future::join_all(committed.iter().map(|i| self.settle(&i.message))).await;
        (committed, rest)
    }

    /// Each item's ledger entry in its home bucket, in the items' order.
    async fn ledger_entries(&self, items: &[Item]) -> Result<Vec<Option<String>>, StoreError> {
        let mut by_home: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (i, item) in items.iter().enumerate() {
            by_home
                .entry(item.message.home().index)
                .or_default()
                .push(i);
        }
        let mut entries = vec![None; items.len()];
        for at in by_home.into_values() {
            let home = items[at[0]].message.home();
            let mut hmget = redis::cmd("HMGET");
            hmget.arg(self.redis.bucket_keys(home).ledger);
            for &i in &at {
                hmget.arg(&items[i].message.attempt.user_id);
            }
            let found: Vec<Option<String>> = self.redis.cmd(&hmget).await?;
            for (i, entry) in at.into_iter().zip(found) {
                entries[i] = entry;
            }
        }
        Ok(entries)
    }

    /// The batch transaction. `Ok(None)`: rolled back, the group goes one by one.
    async fn write_group_tx(
        &self,
        activity_id: i64,
        messages: &[&OrderMessage],
    ) -> Result<Option<HashSet<Uuid>>, sqlx::Error> {
        // One epoch per transaction; a group that spans a reload goes one by one.
        let epoch = messages[0].load_epoch;
        if messages.iter().any(|m| m.load_epoch != epoch) {
            return Ok(None);
        }
        let request_ids: Vec<Uuid> = messages.iter().map(|m| m.attempt.request_id).collect();
        let users: Vec<String> = messages.iter().map(|m| m.attempt.user_id.clone()).collect();
        let quantities: Vec<i64> = messages.iter().map(|m| m.attempt.quantity).collect();
        let mut tx = self.pool.begin().await?;
        let inserted =
            order::insert_confirmed_batch(&mut tx, activity_id, &request_ids, &users, &quantities)
                .await;
        let inserted = match inserted {
            Ok(rows) => rows,
            Err(e)
                if db::is_unique_violation(&e, "orders_one_per_user")
                    || db::is_foreign_key_violation(&e) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        if inserted.is_empty() {
            tx.rollback().await?;
            return Ok(Some(HashSet::new()));
        }
        let units: i64 = inserted.iter().map(|(_, q)| *q).sum();
        let left = activity::take_stock(&mut tx, activity_id, units, epoch).await?;
        if left.is_none() {
            tx.rollback().await?;
            return Ok(None);
        }
        tx.commit().await?;
        Ok(Some(inserted.into_iter().map(|(r, _)| r).collect()))
    }
}
