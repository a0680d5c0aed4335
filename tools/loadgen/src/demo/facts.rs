//! The sale's outcome read back from PostgreSQL and Redis, every bucket of it, with the
//! cluster master that serves each bucket's hash tag.

use super::report::{BucketFacts, StoreFacts};
use seckill_shared::domain::{activity, order};
use seckill_shared::store::buckets;
use seckill_shared::store::conn::Redis;
use seckill_shared::store::keys::{self, Bucket as StockBucket};
use seckill_shared::store::ledger::Snapshot;
use sqlx::PgPool;

/// Reads the sale's outcome back from PostgreSQL and Redis, every bucket of it.
pub async fn facts(pool: &PgPool, redis: &Redis, id: i64) -> anyhow::Result<StoreFacts> {
    let t = order::tally(pool, id).await?;
    let a = activity::get(pool, id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("activity {id} does not exist"))?;
    let snaps = buckets::snapshots(redis, id, a.bucket_count()).await?;
    let owners = slot_owners(redis).await;
    let all_loaded = snaps.iter().all(|(_, s)| s.stock.is_some());
    Ok(StoreFacts {
        orders: t.live,
        units_sold: t.live_units,
        failed_orders: t.failed,
        duplicate_users: t.users_with_two_live,
        db_total_stock: a.total_stock,
        db_remaining_stock: a.remaining_stock,
        redis_stock: all_loaded.then(|| snaps.iter().filter_map(|(_, s)| s.stock).sum()),
        redis_participants: snaps.iter().map(|(_, s)| s.participants).sum(),
        pending_qty: snaps.iter().map(|(_, s)| s.pending_quantity()).sum(),
        pending_count: snaps.iter().map(|(_, s)| s.pending_count()).sum(),
        transfer_qty: snaps.iter().map(|(_, s)| s.transfer_quantity()).sum(),
        redis_nodes: owners.masters(),
        buckets: snaps
            .iter()
            .map(|(b, s)| bucket_facts(*b, s, &owners))
            .collect(),
    })
}

fn bucket_facts(bucket: StockBucket, snap: &Snapshot, owners: &SlotOwners) -> BucketFacts {
    let tag = bucket.tag();
    let slot = keys::slot(&tag);
    BucketFacts {
        index: bucket.index,
        node: owners.of(slot),
        tag,
        slot,
        stock: snap.stock,
        participants: snap.participants,
    }
}

/// Which master serves each slot range of a cluster (`CLUSTER SLOTS`, answered by any node):
/// `(first slot, last slot, host:port)`. Empty on a standalone Redis, which refuses the command.
struct SlotOwners(Vec<(u32, u32, String)>);

impl SlotOwners {
    fn of(&self, slot: u32) -> Option<String> {
        self.0
            .iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
            .map(|(_, _, node)| node.clone())
    }

    /// Each master once, in address order.
    fn masters(&self) -> Vec<String> {
        let nodes: std::collections::BTreeSet<&String> = self.0.iter().map(|(_, _, n)| n).collect();
        nodes.into_iter().cloned().collect()
    }
}

async fn slot_owners(redis: &Redis) -> SlotOwners {
    use redis::Value;
    let Ok(Value::Array(ranges)) = redis.cmd::<Value>(redis::cmd("CLUSTER").arg("SLOTS")).await
    else {
        return SlotOwners(Vec::new());
    };
    // Each range: [first, last, [host, port, id, ...] of the master, then its replicas].
    let owner = |range: &Value| {
        let Value::Array(range) = range else {
            return None;
        };
        let (Some(Value::Int(lo)), Some(Value::Int(hi)), Some(Value::Array(master))) =
            (range.first(), range.get(1), range.get(2))
        else {
            return None;
        };
        let (Some(Value::BulkString(host)), Some(Value::Int(port))) =
            (master.first(), master.get(1))
        else {
            return None;
        };
        let node = format!("{}:{port}", String::from_utf8_lossy(host));
        Some((u32::try_from(*lo).ok()?, u32::try_from(*hi).ok()?, node))
    };
    SlotOwners(ranges.iter().filter_map(owner).collect())
}
