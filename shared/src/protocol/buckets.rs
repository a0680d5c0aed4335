//! A purchase across the buckets of a sale: when the buyer's home bucket is short,
//! [`borrow_and_buy`] takes what is missing from the other buckets (`lua/borrow.lua`) and asks
//! the home bucket again with the borrowed units as credits. The container's [`Hints`] skip
//! donors it saw empty a moment ago; a buyer is told `sold_out` only after a sale-wide check
//! (every bucket's stock and stock sequence, read twice) found every bucket empty, within the
//! last [`Hints::SOLD_OUT_FRESH`]. A transfer left half done is finished by [`finish_by_id`].
//! docs/invariants.md, "Bucketed sales".

use crate::domain::purchase::Attempt;
use crate::domain::refusal::Refusal;
use crate::infra::pause;
use crate::store::conn::{Redis, StoreError};
use crate::store::keys::{self, Bucket};
use crate::store::ledger;
use crate::store::purchase::{self, Answer, Code, Credit, Credited};
use crate::store::scripts::unknown_answer;
use crate::store::view;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// What one container saw of a bucketed sale's buckets a moment ago: the donors a borrow found
/// empty (skipped by the next short buyers for [`Hints::EMPTY_FRESH`]), and the sales a
/// sale-wide check found empty in every bucket (a short buyer is told `sold_out` on it for
/// [`Hints::SOLD_OUT_FRESH`] without asking a donor). A hint only saves calls: a buyer is never
/// told `sold_out` on hints alone, only on a sale-wide check. Cheap to clone (one per
/// container, shared by its requests); [`Hints::none`] keeps nothing.
#[derive(Clone, Debug, Default)]
pub struct Hints(Option<Arc<HintsInner>>);

#[derive(Debug, Default)]
struct HintsInner {
    /// (sale, bucket index) → when a borrow found it empty.
    empty: RwLock<HashMap<(i64, u32), Instant>>,
    /// sale → when a sale-wide check found every bucket empty.
    sold_out: RwLock<HashMap<i64, Instant>>,
}

impl Hints {
    /// How long a donor a borrow found empty is skipped.
    pub const EMPTY_FRESH: Duration = Duration::from_millis(1000);
    /// How long a sale-wide check that found every bucket empty answers short buyers.
    pub const SOLD_OUT_FRESH: Duration = Duration::from_millis(250);
    /// Entries kept before the stale ones are dropped.
    const KEPT: usize = 4096;

    /// A container's hints.
    pub fn new() -> Self {
        Self(Some(Arc::default()))
    }

    /// No hints: every short buyer asks every donor, then checks the whole sale.
    pub fn none() -> Self {
        Self(None)
    }

    fn empty_now(&self, bucket: Bucket) -> bool {
        let Some(h) = &self.0 else { return false };
        let empty = h.empty.read().unwrap_or_else(|p| p.into_inner());
        matches!(empty.get(&(bucket.activity_id, bucket.index)), Some(at) if at.elapsed() < Self::EMPTY_FRESH)
    }

    fn saw_empty(&self, bucket: Bucket, empty: bool) {
        let Some(h) = &self.0 else { return };
        let key = (bucket.activity_id, bucket.index);
        // Forgetting what was never remembered takes no write lock: every borrow that gave
        // units, and every purchase that leaves units at home, forgets.
        if !empty
            && !h
                .empty
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(&key)
        {
            return;
        }
        let mut seen = h.empty.write().unwrap_or_else(|p| p.into_inner());
        if seen.len() > Self::KEPT {
            seen.retain(|_, at| at.elapsed() < Self::EMPTY_FRESH);
        }
        if empty {
            seen.insert(key, Instant::now());
        } else {
            seen.remove(&key);
        }
    }

    fn sold_out_now(&self, activity_id: i64) -> bool {
        let Some(h) = &self.0 else { return false };
        let sold_out = h.sold_out.read().unwrap_or_else(|p| p.into_inner());
        matches!(sold_out.get(&activity_id), Some(at) if at.elapsed() < Self::SOLD_OUT_FRESH)
    }

    fn saw_sold_out(&self, activity_id: i64, sold_out: bool) {
        let Some(h) = &self.0 else { return };
        if !sold_out
            && !h
                .sold_out
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(&activity_id)
        {
            return;
        }
        let mut seen = h.sold_out.write().unwrap_or_else(|p| p.into_inner());
        if seen.len() > Self::KEPT {
            seen.retain(|_, at| at.elapsed() < Self::SOLD_OUT_FRESH);
        }
        if sold_out {
            seen.insert(activity_id, Instant::now());
        } else {
            seen.remove(&activity_id);
        }
    }
}

/// The home bucket holds `stock` units, fewer than asked: take what is missing from the other
/// buckets, starting at a random one so that short buyers spread over the donors (those the
/// container saw empty a moment ago skipped), and buy with the units taken as credits. The
/// donors gave less than is missing (nothing, or part of it): a sale-wide check reads every
/// bucket, the home bucket and the skipped donors included; every bucket empty is `sold_out`
/// when nothing was taken, a donor it finds holding units is asked once more, and a home
/// bucket it finds holding units (another buyer's borrow left them there) is asked again
/// first when nothing was taken. Answers what the home bucket decided: accepted or refused
/// (too few units in all buckets together is `sold_out`; they stay in the home bucket).
pub async fn borrow_and_buy(
    redis: &Redis,
    hints: &Hints,
    attempt: &Attempt,
    deadline_ms: i64,
    home: Bucket,
    stock: i64,
) -> Result<Answer, StoreError> {
    let sold_out = |stock_left| Answer::Refused(Refusal::SoldOut { stock_left });
    if hints.sold_out_now(attempt.activity_id) {
        return Ok(sold_out(stock));
    }
    let mut need = attempt.quantity - stock;
    let mut credits = Vec::new();
    // Every transfer id asked for, answered or not: a borrow whose answer was lost may still
    // have taken units.
    let mut asked: Vec<(Bucket, Uuid)> = Vec::new();
    let start = rand::random_range(0..home.count);
    let donors: Vec<Bucket> = (0..home.count)
        .map(|step| (start + step) % home.count)
        .filter(|&index| index != home.index)
        .map(|index| home.sibling(index))
        .collect();
    let mut unasked: Vec<Bucket> = donors
        .iter()
        .copied()
        .filter(|d| !hints.empty_now(*d))
        .collect();
    for round in 0..2 {
        for donor in unasked.drain(..) {
            let id = Uuid::new_v4();
            asked.push((donor, id));
            pause::point("purchase.borrow", attempt.activity_id).await;
            match purchase::borrow(redis, donor, home, id, need).await {
                Ok(Some(credit)) => {
                    hints.saw_empty(donor, false);
                    need -= credit.units;
                    credits.push(credit);
                    if need <= 0 {
                        break;
                    }
                }
                Ok(None) => {
                    hints.saw_empty(donor, true);
                    asked.pop();
                }
                Err(e) => {
                    finish_later(redis, home, asked);
                    return Err(e);
                }
            }
        }
        if need <= 0 || round == 1 {
            break;
        }
        // Still short after every donor the hints did not skip: the whole sale, read, before
        // anyone is told `sold_out`. Units given back to a donor after it was asked or to one
        // the hints skipped, or left in the home bucket by another buyer's borrow, show here.
        pause::point("purchase.before_check", attempt.activity_id).await;
        let held = match holding(redis, home).await {
            Ok(held) => held,
            Err(e) => {
                finish_later(redis, home, asked);
                return Err(e);
            }
        };
        if !held.home && held.donors.is_empty() {
            if !credits.is_empty() {
                // Too few units in the sale: the home bucket, with the units in hand, says so.
                break;
            }
            hints.saw_sold_out(attempt.activity_id, true);
            return Ok(sold_out(stock));
        }
        // Units in the home bucket are bought with the credits when there are any; without,
        // the home bucket is asked again first.
        if held.home && credits.is_empty() {
            pause::point("purchase.home", attempt.activity_id).await;
            match purchase::run_again(redis, home, attempt, deadline_ms).await? {
                Answer::Short { stock: now } => need = attempt.quantity - now,
                answer => return home_answer(attempt, answer),
            }
        }
        unasked = donors
            .iter()
            .copied()
            .filter(|d| held.donors.contains(d))
            .collect();
        for d in &unasked {
            hints.saw_empty(*d, false);
        }
    }
    if credits.is_empty() {
        return Ok(sold_out(attempt.quantity - need));
    }
    // Between the two steps of the transfers: the units are in the donors' ledgers. The
    // failure stands for a crash here: nothing of this call finishes them, reconcile does.
    pause::point("purchase.after_borrow", attempt.activity_id).await;
    if pause::fail("purchase.after_borrow", attempt.activity_id) {
        return Err(StoreError::Timeout(redis.timeout));
    }
    pause::point("purchase.home", attempt.activity_id).await;
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
    // Units the buyer did not take stay in the home bucket: this container's other short
    // buyers find them there again without waiting out a hint.
    let left_home = match answer {
        Answer::Accepted(r) => r.stock_left > 0,
        _ => credited,
    };
    if left_home {
        hints.saw_sold_out(attempt.activity_id, false);
        hints.saw_empty(home, false);
    }
    home_answer(attempt, answer)
}

/// What the home bucket decided, as the purchase's answer: accepted or refused.
fn home_answer(attempt: &Attempt, answer: Answer) -> Result<Answer, StoreError> {
    match answer {
        answer @ (Answer::Accepted(_) | Answer::Refused(_)) => Ok(answer),
        // All the other buckets together held fewer units than asked; they are here now.
        Answer::Short { stock } => Ok(Answer::Refused(Refusal::SoldOut { stock_left: stock })),
        Answer::Layout(_) => Err(layout_changed(attempt.activity_id)),
        // Only a sale with one bucket is a draw sale.
        Answer::Queued { .. } => Err(unknown_answer("purchase.lua", Code::Queued as i64)),
        Answer::DrawDue => Err(unknown_answer("purchase.lua", Code::DrawDue as i64)),
    }
}

/// What a sale-wide check found holding units: the home bucket, and the donors.
struct Held {
    home: bool,
    donors: Vec<Bucket>,
}

/// The sale-wide check of a short buyer whose donors gave nothing: every bucket's stock and
/// stock sequence, the home bucket's included, read at once (one read per bucket, side by
/// side), then again. Answers what held units in either read; nothing when every bucket read
/// empty both times with no stock sequence moved between the reads (a unit given back or
/// credited meanwhile moves it): the sale held no unit at one moment between the two reads,
/// not only each bucket at its own.
async fn holding(redis: &Redis, home: Bucket) -> Result<Held, StoreError> {
    let all: Vec<Bucket> = Bucket::all(home.activity_id, home.count).collect();
    let read = || futures::future::try_join_all(all.iter().map(|b| view::stock_and_seq(redis, *b)));
    let first = read().await?;
    let second = read().await?;
    let moved = first.iter().zip(&second).any(|(a, b)| a.1 != b.1);
    let holds: Vec<Bucket> = all
        .iter()
        .zip(first.iter().zip(&second))
        .filter(|(_, (x, y))| x.0 > 0 || y.0 > 0)
        .map(|(b, _)| *b)
        .collect();
    if holds.is_empty() && moved {
        // Units moved between the reads: not proven empty, every bucket is asked once more.
        return Ok(Held {
            home: true,
            donors: all.into_iter().filter(|b| *b != home).collect(),
        });
    }
    Ok(Held {
        home: holds.contains(&home),
        donors: holds.into_iter().filter(|b| *b != home).collect(),
    })
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

/// A purchase that met another bucket count than it was decided with: the count changes only
/// before the sale starts, so the caller retries.
pub(crate) fn layout_changed(activity_id: i64) -> StoreError {
    StoreError::Redis(redis::RedisError::from((
        redis::ErrorKind::Client,
        "bucket count changed during a purchase",
        format!("activity {activity_id}"),
    )))
}
