//! A purchase, across the buckets of a sale: [`enter`] runs `lua/purchase.lua` in the buyer's
//! home bucket, and when a bucketed sale's home bucket is short, borrows from the others
//! (`lua/borrow.lua`) and asks again with the borrowed units as credits. A buyer is told
//! `sold_out` only after every other bucket was asked and gave nothing. docs/invariants.md,
//! "Entry: a purchase" and "Bucketed sales".

use crate::domain::purchase::Attempt;
use crate::domain::refusal::Refusal;
use crate::infra::pause;
use crate::store::buckets::loaded_count;
use crate::store::conn::{Redis, StoreError};
use crate::store::keys::{self, Bucket, Home};
use crate::store::ledger;
use crate::store::purchase::Code;
use crate::store::purchase::{self, Answer, Credit, Credited, Reservation};
use crate::store::scripts::unknown_answer;
use uuid::Uuid;

/// What a purchase attempt came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Units reserved: the order message is the caller's to send.
    Reserved(Reservation),
    /// A draw sale's window is open: the user is in its pool with this arrival rank.
    Queued { rank: i64 },
    /// A draw sale's window has closed and its draw has not run (see
    /// [`crate::protocol::draw`]): the caller runs it, sends its winners, and asks again.
    DrawDue,
    /// Nothing was reserved.
    Refused(Refusal),
}

/// Decides `attempt` in Redis, with the caller's `deadline_ms` on the Redis clock (see
/// [`purchase::run`]). `attempt.buckets` is the sale's bucket count as the caller last saw it
/// (1 when it does not know): the home bucket answers with the right count when it is not,
/// the purchase asks the right home bucket once more, and `attempt.buckets` is left at the
/// count Redis holds (also when the call fails after that answer), for the caller to remember
/// and to find the home bucket of a give-back.
pub async fn enter(
    redis: &Redis,
    attempt: &mut Attempt,
    deadline_ms: i64,
) -> Result<Outcome, StoreError> {
    attempt.buckets = attempt.buckets.max(1);
    for _ in 0..2 {
        let home = attempt.home();
        return match purchase::run(redis, home, attempt, deadline_ms, &[])
            .await?
            .0
        {
            Answer::Accepted(r) => Ok(Outcome::Reserved(r)),
            Answer::Queued { rank } => Ok(Outcome::Queued { rank }),
            Answer::DrawDue => Ok(Outcome::DrawDue),
            // A bucket of a layout Redis no longer holds (the count changed before the start):
            // bucket 0, which every layout shares, says the count.
            Answer::Refused(Refusal::NotFound) if home.index != 0 => {
                match loaded_count(redis, attempt.activity_id).await? {
                    Some(n) if n != attempt.buckets => {
                        attempt.buckets = n;
                        continue;
                    }
                    _ => Ok(Outcome::Refused(Refusal::NotFound)),
                }
            }
            Answer::Refused(r) => Ok(Outcome::Refused(r)),
            Answer::Layout(n) => {
                attempt.buckets = n;
                continue;
            }
            Answer::Short { stock } => {
                borrow_and_buy(redis, attempt, deadline_ms, home, stock).await
            }
        };
    }
    Err(layout_changed(attempt.activity_id))
}

/// The home bucket holds `stock` units, fewer than asked: take what is missing from the other
/// buckets, starting at a random one so that short buyers spread over the donors, and buy
/// with the units taken as credits. Every donor gave nothing: `sold_out`.
async fn borrow_and_buy(
    redis: &Redis,
    attempt: &Attempt,
    deadline_ms: i64,
    home: Bucket,
    stock: i64,
) -> Result<Outcome, StoreError> {
    let mut need = attempt.quantity - stock;
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
        match purchase::borrow(redis, donor, home, id, need).await {
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
        return Ok(Outcome::Refused(Refusal::SoldOut { stock_left: stock }));
    }
    // Between the two steps of the transfers: the units are in the donors' ledgers. The
    // failure stands for a crash here: nothing of this call finishes them, reconcile does.
    pause::point("purchase.after_borrow", attempt.activity_id).await;
    if pause::fail("purchase.after_borrow", attempt.activity_id) {
        return Err(StoreError::Timeout(redis.timeout));
    }
    let (answer, credited) = match purchase::run(redis, home, attempt, deadline_ms, &credits).await
    {
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
    match answer {
        Answer::Accepted(r) => Ok(Outcome::Reserved(r)),
        Answer::Refused(r) => Ok(Outcome::Refused(r)),
        // All the other buckets together held fewer units than asked; they are here now.
        Answer::Short { stock } => Ok(Outcome::Refused(Refusal::SoldOut { stock_left: stock })),
        Answer::Layout(_) => Err(layout_changed(attempt.activity_id)),
        // Only a sale with one bucket is a draw sale.
        Answer::Queued { .. } => Err(unknown_answer("purchase.lua", Code::Queued as i64)),
        Answer::DrawDue => Err(unknown_answer("purchase.lua", Code::DrawDue as i64)),
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
) -> Result<Option<(Credited, i64)>, StoreError> {
    let field = keys::transfer_field(id);
    let Some(entry) = ledger::entry(redis, donor, &field).await? else {
        return Ok(None);
    };
    let Some((_, epoch)) = entry.transfer else {
        return Ok(None);
    };
    let credited = purchase::credit(redis, home, id, entry.quantity, epoch).await?;
    match credited {
        Credited::Now | Credited::Before => {
            ledger::settle(redis, donor, &field, &id.to_string()).await?;
        }
        // A load from scratch is under way: it empties every bucket's ledger.
        Credited::NotLoaded | Credited::OtherEpoch => {}
    }
    Ok(Some((credited, entry.quantity)))
}

/// Drops a credited transfer's entry from its donor's ledger. A failure is retried in the
/// background ([`finish_later`]), and reconcile finishes what is left after its grace period
/// (crediting again is a no-op: the home bucket takes an id once).
async fn finish_transfer(redis: &Redis, c: &Credit) -> Result<bool, StoreError> {
    let field = keys::transfer_field(c.id);
    ledger::settle(redis, c.donor, &field, &c.id.to_string()).await
}

fn layout_changed(activity_id: i64) -> StoreError {
    StoreError::Redis(redis::RedisError::from((
        redis::ErrorKind::Client,
        "bucket count changed during a purchase",
        format!("activity {activity_id}"),
    )))
}
