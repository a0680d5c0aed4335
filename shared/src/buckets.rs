//! Bucketed sales: a purchase that finds the stock wherever it is, and the reads that add the
//! buckets up.
//!
//! A sale with `buckets` = N > 1 keeps its stock in N buckets, each a whole sale of its own
//! under its own hash tag (see [`crate::keys::Bucket`]). A user's purchase runs in their home
//! bucket, which alone holds their field in `users` and their ledger entries, so one order
//! per user stays one script on one slot. When the home bucket is short, the buyer borrows
//! from the others (`lua/borrow.lua`: units leave a donor and wait in its ledger) and asks the
//! home bucket again with the borrowed units as credits (`lua/purchase.lua` adds them, once
//! per transfer id, then decides). A buyer is told `sold_out` only after every other bucket
//! was asked and gave nothing. docs/invariants.md, "Bucketed sales", has the protocol.

use crate::cache::{CacheError, Redis};
use crate::keys::{self, Bucket};
use crate::refusal::Refusal;
use crate::sale::{self, Credit, Decision, Reservation, Snapshot};
use crate::scripts;
use uuid::Uuid;

/// One purchase attempt.
#[derive(Clone, Copy, Debug)]
pub struct Purchase<'a> {
    pub activity_id: i64,
    pub user_id: &'a str,
    pub quantity: i64,
    pub request_id: Uuid,
    /// On the Redis server's clock (see [`sale::purchase_script`]).
    pub deadline_ms: i64,
}

/// What a purchase attempt came to, short of a refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entered {
    /// Units reserved: the order message is the caller's to send.
    Reserved(Reservation),
    /// A draw sale's window is open: the user is in its pool with this arrival rank.
    Queued { rank: i64 },
    /// A draw sale's window has closed and its draw has not run (see [`crate::draw`]): the
    /// caller runs it, sends its winners, and asks again.
    DrawDue,
}

/// Buys for one user in a first-come sale (see [`enter`], which also answers a draw sale's
/// pool); a draw sale's answers are an error here.
pub async fn purchase(
    redis: &Redis,
    buy: &Purchase<'_>,
    count: &mut u32,
) -> Result<Result<Reservation, Refusal>, CacheError> {
    match enter(redis, buy, count).await? {
        Ok(Entered::Reserved(r)) => Ok(Ok(r)),
        Ok(Entered::Queued { .. }) => Err(scripts::unknown_answer("purchase.lua", 10)),
        Ok(Entered::DrawDue) => Err(scripts::unknown_answer("purchase.lua", 11)),
        Err(refusal) => Ok(Err(refusal)),
    }
}

/// Buys for one user. `count` is the sale's bucket count as the caller last saw it (1 when
/// it does not know): the home bucket answers with the right count when it is not, the
/// purchase asks the right home bucket once more, and `count` is left at the count Redis
/// holds (also when the call fails after that answer), for the caller to remember and to
/// find the home bucket of a give-back.
pub async fn enter(
    redis: &Redis,
    buy: &Purchase<'_>,
    count: &mut u32,
) -> Result<Result<Entered, Refusal>, CacheError> {
    *count = (*count).max(1);
    for _ in 0..2 {
        let home = Bucket::home(buy.activity_id, *count, buy.user_id);
        return match run(redis, buy, home, &[]).await?.0 {
            Decision::Accepted(r) => Ok(Ok(Entered::Reserved(r))),
            Decision::Queued { rank } => Ok(Ok(Entered::Queued { rank })),
            Decision::DrawDue => Ok(Ok(Entered::DrawDue)),
            // A bucket of a layout Redis no longer holds (the count changed before the start):
            // bucket 0, which every layout shares, says the count.
            Decision::Refused(Refusal::NotFound) if home.index != 0 => {
                match loaded_count(redis, buy.activity_id).await? {
                    Some(n) if n != *count => {
                        *count = n;
                        continue;
                    }
                    _ => Ok(Err(Refusal::NotFound)),
                }
            }
            Decision::Refused(r) => Ok(Err(r)),
            Decision::Layout(n) => {
                *count = n;
                continue;
            }
            Decision::Short { stock } => Ok(borrow_and_buy(redis, buy, home, stock)
                .await?
                .map(Entered::Reserved)),
        };
    }
    Err(layout_changed(buy.activity_id))
}

async fn run(
    redis: &Redis,
    buy: &Purchase<'_>,
    home: Bucket,
    credits: &[Credit],
) -> Result<(Decision, bool), CacheError> {
    sale::purchase_script(
        redis,
        home,
        buy.user_id,
        buy.quantity,
        buy.request_id,
        buy.deadline_ms,
        credits,
    )
    .await
}

/// The home bucket holds `stock` units, fewer than asked: take what is missing from the other
/// buckets, starting at a random one so that short buyers spread over the donors, and buy
/// with the units taken as credits. Every donor gave nothing: `sold_out`.
async fn borrow_and_buy(
    redis: &Redis,
    buy: &Purchase<'_>,
    home: Bucket,
    stock: i64,
) -> Result<Result<Reservation, Refusal>, CacheError> {
    let mut need = buy.quantity - stock;
    let mut credits = Vec::new();
    // Every transfer id asked for, answered or not: a borrow whose answer was lost may still
    // have taken units.
    let mut asked: Vec<(Bucket, Uuid)> = Vec::new();
    let start = rand::random_range(0..home.count);
    for step in 0..home.count {
        let index = (start + step) % home.count;
        if index == home.index {
            continue;
        }
        let donor = home.sibling(index);
        let id = Uuid::new_v4();
        asked.push((donor, id));
        match sale::borrow(redis, donor, home, id, need).await {
            Ok(Some(credit)) => {
                need -= credit.units;
                credits.push(credit);
                if need <= 0 {
                    break;
                }
            }
            Ok(None) => {
                asked.pop();
            }
            Err(e) => {
                finish_later(redis, home, asked);
                return Err(e);
            }
        }
    }
    if credits.is_empty() {
        return Ok(Err(Refusal::SoldOut { stock_left: stock }));
    }
    // Between the two steps of the transfers: the units are in the donors' ledgers. The
    // failure stands for a crash here: nothing of this call finishes them, reconcile does.
    crate::pause::point("purchase.after_borrow", buy.activity_id).await;
    if crate::pause::fail("purchase.after_borrow", buy.activity_id) {
        return Err(CacheError::Timeout(redis.timeout));
    }
    let (decision, credited) = match run(redis, buy, home, &credits).await {
        Ok(answer) => answer,
        Err(e) => {
            finish_later(redis, home, asked);
            return Err(e);
        }
    };
    if credited {
        let mut unfinished = Vec::new();
        for c in &credits {
            if let Err(e) = finish_transfer(redis, c).await {
                tracing::warn!(transfer = %c.id, error = %e, "transfer entry not dropped yet");
                unfinished.push((c.donor, c.id));
            }
        }
        finish_later(redis, home, unfinished);
    }
    match decision {
        Decision::Accepted(r) => Ok(Ok(r)),
        Decision::Refused(r) => Ok(Err(r)),
        // All the other buckets together held fewer units than asked; they are here now.
        Decision::Short { stock } => Ok(Err(Refusal::SoldOut { stock_left: stock })),
        Decision::Layout(_) => Err(layout_changed(buy.activity_id)),
        // Only a sale with one bucket is a draw sale.
        Decision::Queued { .. } => Err(scripts::unknown_answer("purchase.lua", 10)),
        Decision::DrawDue => Err(scripts::unknown_answer("purchase.lua", 11)),
    }
}

/// How often, and how far apart, a purchase that failed midway retries finishing the
/// transfers it asked for.
const FINISH_ATTEMPTS: u32 = 10;
const FINISH_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

/// A purchase failed (Redis out of reach, an answer lost) after it asked donors for units:
/// whatever they gave is put into the home bucket in the background for a few seconds, so
/// the units are sellable again without waiting for reconcile's grace period (which remains
/// the bound, in Lambda, where a background task runs only while the container serves).
fn finish_later(redis: &Redis, home: Bucket, mut asked: Vec<(Bucket, Uuid)>) {
    if asked.is_empty() {
        return;
    }
    let redis = redis.clone();
    tokio::spawn(async move {
        for _ in 0..FINISH_ATTEMPTS {
            tokio::time::sleep(FINISH_RETRY).await;
            let mut left = Vec::new();
            for (donor, id) in asked {
                if finish_by_id(&redis, donor, home, id).await.is_err() {
                    left.push((donor, id));
                }
            }
            if left.is_empty() {
                return;
            }
            asked = left;
        }
        tracing::warn!(transfers = asked.len(), "transfers left to reconcile");
    });
}

/// Finishes the transfer `id` from `donor` into `home` if the donor's ledger holds it: the
/// home bucket is credited (it takes an id once) and the entry dropped. `None`: nothing
/// there (the borrow took nothing, or the transfer is finished). A transfer is never given
/// back to its donor: its buyer may still credit it, and the units would count twice.
pub async fn finish_by_id(
    redis: &Redis,
    donor: Bucket,
    home: Bucket,
    id: Uuid,
) -> Result<Option<(sale::Credited, i64)>, CacheError> {
    let field = keys::transfer_field(id);
    let Some(entry) = sale::ledger_entry(redis, donor, &field).await? else {
        return Ok(None);
    };
    let Some((_, epoch)) = entry.transfer else {
        return Ok(None);
    };
    let credited = sale::credit(redis, home, id, entry.quantity, epoch).await?;
    match credited {
        sale::Credited::Now | sale::Credited::Before => {
            sale::settle(redis, donor, &field, &id.to_string()).await?;
        }
        // A load from scratch is under way: it empties every bucket's ledger.
        sale::Credited::NotLoaded | sale::Credited::OtherEpoch => {}
    }
    Ok(Some((credited, entry.quantity)))
}

/// Drops a credited transfer's entry from its donor's ledger. A failure is retried in the
/// background ([`finish_later`]), and reconcile finishes what is left after its grace period
/// (crediting again is a no-op: the home bucket takes an id once).
async fn finish_transfer(redis: &Redis, c: &Credit) -> Result<bool, CacheError> {
    let field = keys::transfer_field(c.id);
    sale::settle(redis, c.donor, &field, &c.id.to_string()).await
}

fn layout_changed(activity_id: i64) -> CacheError {
    CacheError::Redis(redis::RedisError::from((
        redis::ErrorKind::Client,
        "bucket count changed during a purchase",
        format!("activity {activity_id}"),
    )))
}

/// The bucket count Redis holds for the sale (bucket 0's meta), `None` when it is not loaded.
pub async fn loaded_count(redis: &Redis, activity_id: i64) -> Result<Option<u32>, CacheError> {
    count_in(redis, Bucket::from(activity_id)).await
}

/// Whether every bucket of a sale with `count` buckets is loaded, with that count.
pub async fn all_loaded(redis: &Redis, activity_id: i64, count: u32) -> Result<bool, CacheError> {
    for b in Bucket::all(activity_id, count) {
        if count_in(redis, b).await? != Some(count) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The bucket count one bucket's meta names (absent: 1), `None` when it is not loaded.
async fn count_in(redis: &Redis, bucket: Bucket) -> Result<Option<u32>, CacheError> {
    let k = redis.bucket_keys(bucket);
    let mut hmget = redis::cmd("HMGET");
    hmget.arg(&k.meta).arg("version").arg("buckets");
    let (version, count): (Option<i64>, Option<u32>) = redis.cmd(&hmget).await?;
    Ok(version.map(|_| count.unwrap_or(1)))
}

/// Each bucket's snapshot, bucket 0 first.
pub async fn snapshots(
    redis: &Redis,
    activity_id: i64,
    count: u32,
) -> Result<Vec<(Bucket, Snapshot)>, CacheError> {
    let mut all = Vec::new();
    for b in Bucket::all(activity_id, count) {
        all.push((b, sale::snapshot(redis, b).await?));
    }
    Ok(all)
}

/// Units left over all buckets, `None` when a bucket is not loaded.
pub async fn stock(redis: &Redis, activity_id: i64, count: u32) -> Result<Option<i64>, CacheError> {
    let mut sum = 0;
    for b in Bucket::all(activity_id, count) {
        match sale::stock(redis, b).await? {
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
) -> Result<Vec<Option<i64>>, CacheError> {
    let mut all = Vec::new();
    for b in Bucket::all(activity_id, count) {
        all.push(sale::stock(redis, b).await?);
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
