//! The batch fast path's driver: one hot activity row serialises every order transaction on
//! it, so a batch's messages are grouped by sale and each group is written in one statement
//! (its own transaction) by [`consume::commit_group`], which commits only what the one-by-one
//! path would. What it does not commit goes one by one.

use crate::{Consumer, Item};
use seckill_shared::domain::purchase::OrderMessage;
use seckill_shared::protocol::consume;
use std::collections::BTreeMap;

impl Consumer {
    /// Per sale, one statement for the whole group. Returns the messages it committed and
    /// the rest, which the one-by-one path decides.
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
        let messages: Vec<&OrderMessage> = group.iter().map(|i| &i.message).collect();
        let committed = consume::commit_group(&self.pool, &self.redis, &messages).await;
        let (done, rest): (Vec<_>, Vec<_>) = group
            .into_iter()
            .enumerate()
            .partition(|(i, _)| committed.contains(i));
        let items = |v: Vec<(usize, Item)>| v.into_iter().map(|(_, item)| item).collect();
        (items(done), items(rest))
    }
}
