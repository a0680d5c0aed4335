//! The reads that add a bucketed sale's buckets up, and a bucket's unload. A sale with
//! `buckets` = N > 1 keeps its stock in N buckets, each a whole sale of its own under its own
//! hash tag ([`super::keys::Bucket`]); docs/invariants.md, "Bucketed sales".

use super::conn::{Redis, StoreError};
use super::keys::Bucket;
use super::ledger::{self, Snapshot};
use super::scripts::{self, codes};
use super::view;

/// The bucket count Redis holds for the sale (bucket 0's meta), `None` when it is not loaded.
pub async fn loaded_count(redis: &Redis, activity_id: i64) -> Result<Option<u32>, StoreError> {
    count_in(redis, Bucket::from(activity_id)).await
}

/// Whether every bucket of a sale with `count` buckets is loaded, with that count.
pub async fn all_loaded(redis: &Redis, activity_id: i64, count: u32) -> Result<bool, StoreError> {
    for b in Bucket::all(activity_id, count) {
        if count_in(redis, b).await? != Some(count) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The bucket count one bucket's meta names (absent: 1), `None` when it is not loaded.
async fn count_in(redis: &Redis, bucket: Bucket) -> Result<Option<u32>, StoreError> {
    let k = redis.bucket_keys(bucket);
    let mut hmget = redis::cmd("HMGET");
    hmget.arg(&k.meta).arg("version").arg("buckets");
    let (version, count): (Option<i64>, Option<u32>) = redis.cmd(&hmget).await?;
    Ok(version.map(|_| count.unwrap_or(1)))
}

/// Each bucket's [`ledger::head`] (one bounded call each), bucket 0 first.
pub async fn heads(
    redis: &Redis,
    activity_id: i64,
    count: u32,
) -> Result<Vec<(Bucket, Snapshot)>, StoreError> {
    let mut all = Vec::new();
    for b in Bucket::all(activity_id, count) {
        all.push((b, ledger::head(redis, b).await?));
    }
    Ok(all)
}

/// Each bucket's snapshot, every ledger entry read, bucket 0 first.
pub async fn snapshots(
    redis: &Redis,
    activity_id: i64,
    count: u32,
) -> Result<Vec<(Bucket, Snapshot)>, StoreError> {
    let mut all = heads(redis, activity_id, count).await?;
    for (b, snap) in &mut all {
        ledger::fill(redis, *b, snap).await?;
    }
    Ok(all)
}

/// Units left over all buckets, `None` when a bucket is not loaded.
pub async fn stock(redis: &Redis, activity_id: i64, count: u32) -> Result<Option<i64>, StoreError> {
    let mut sum = 0;
    for b in Bucket::all(activity_id, count) {
        match view::stock(redis, b).await? {
            Some(s) => sum += s,
            None => return Ok(None),
        }
    }
    Ok(Some(sum))
}

/// Each bucket's stock, bucket 0 first (`None` for a bucket that is not loaded).
pub async fn stocks(
    redis: &Redis,
    activity_id: i64,
    count: u32,
) -> Result<Vec<Option<i64>>, StoreError> {
    let mut all = Vec::new();
    for b in Bucket::all(activity_id, count) {
        all.push(view::stock(redis, b).await?);
    }
    Ok(all)
}

/// `total` units split over `count` buckets: the first `total % count` get one more.
pub fn split(total: i64, count: u32) -> Vec<i64> {
    let n = i64::from(count.max(1));
    (0..n)
        .map(|i| total / n + i64::from(i < total % n))
        .collect()
}

codes! {
    /// `lua/unload.lua`'s reply codes.
    pub enum UnloadCode of "unload.lua" {
        NotOwner = 0,
        Unloaded = 1,
    }
}

/// `lua/unload.lua`: removes one bucket's meta for the lock `owner`. False: not the owner.
pub async fn unload(redis: &Redis, at: Bucket, owner: &str) -> Result<bool, StoreError> {
    let k = redis.bucket_keys(at);
    let mut inv = scripts::UNLOAD.prepare_invoke();
    inv.key(&k.meta).key(&k.lock).arg(owner);
    Ok(UnloadCode::read(redis.script(&inv).await?)? == UnloadCode::Unloaded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_covers_the_total_and_differs_by_at_most_one() {
        for (total, count) in [(0, 3), (1, 3), (10, 3), (200, 8), (7, 1)] {
            let parts = split(total, count);
            assert_eq!(parts.len(), count as usize);
            assert_eq!(parts.iter().sum::<i64>(), total);
            let (lo, hi) = (parts.iter().min().unwrap(), parts.iter().max().unwrap());
            assert!(hi - lo <= 1, "{parts:?}");
        }
    }
}
