//! A purchase, the entry's part of it: [`enter`] decides it in Redis (`lua/purchase.lua` in
//! the buyer's home bucket; a bucketed sale's short home bucket borrows,
//! [`crate::protocol::buckets`]), [`send_order`] puts the reservation on the order queue, and
//! the rules of what a 503 means: a script whose answer did not come in time is claimed in the
//! database and given back ([`unanswered`]), a failed send is decided by the arbiter
//! ([`send_order`]), a draw entry whose send failed leaves the pool ([`send_entry`]). Each
//! answers a verdict the entry maps to 202 or 503. docs/invariants.md, "Entry: a purchase",
//! "What a 503 means" and "Draw admission".

use crate::domain::purchase::{Attempt, MessageKind, OrderMessage};
use crate::domain::refusal::Refusal;
use crate::domain::status::{FailureReason, OrderStatus};
use crate::infra::pause;
use crate::infra::sqs::{OrderQueue, QueueError};
use crate::protocol::buckets::{self, Hints};
use crate::protocol::giveback::{self, Claim, GiveBackError};
use crate::store::buckets::loaded_count;
use crate::store::conn::{Redis, StoreError};
use crate::store::draw::{self as pool, Left};
use crate::store::keys::Home;
use crate::store::ledger::{self, Compensation};
use crate::store::purchase::{self, Answer, Reservation};
use sqlx::PgPool;
use std::time::Duration;

/// What a purchase attempt came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Units reserved: the order message is the caller's to send.
    Reserved(Reservation),
    /// A draw sale's window is open: the user is in its pool with this arrival rank.
    Queued { rank: i64 },
    /// A draw sale's window has closed and its draw has not run (see
    /// [`crate::protocol::draw`]): the drawer runs it; the caller answers `draw_running`.
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
    hints: &Hints,
    attempt: &mut Attempt,
    deadline_ms: i64,
) -> Result<Outcome, StoreError> {
    attempt.buckets = attempt.buckets.max(1);
    for _ in 0..2 {
        let home = attempt.home();
        pause::point("purchase.home", attempt.activity_id).await;
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
                match buckets::borrow_and_buy(redis, hints, attempt, deadline_ms, home, stock)
                    .await?
                {
                    Answer::Accepted(r) => Ok(Outcome::Reserved(r)),
                    Answer::Refused(r) => Ok(Outcome::Refused(r)),
                    other => Err(unexpected(&other)),
                }
            }
        };
    }
    Err(buckets::layout_changed(attempt.activity_id))
}

/// An answer of `purchase.lua` the purchase path never expects at this point.
fn unexpected(answer: &Answer) -> StoreError {
    StoreError::Redis(redis::RedisError::from((
        redis::ErrorKind::Client,
        "unexpected purchase answer",
        format!("{answer:?}"),
    )))
}

/// What became of an accepted purchase's order message.
#[derive(Debug)]
pub enum Sent {
    /// On the queue: 202 `pending`.
    Queued,
    /// The send failed or timed out (the message may be stored all the same); the arbiter
    /// decided what that means.
    Failed { error: QueueError, then: AfterSend },
}

/// What the arbiter made of an order message whose send failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterSend {
    /// The consumer committed first: the request is an order, 202 `pending`.
    Ordered,
    /// Claimed and given back: 503, nothing sold.
    GivenBack,
    /// Claimed; the Redis half waits for reconcile's next run (the `failed` row makes the 503
    /// true): 503.
    Claimed,
    /// The database is out of reach: the outcome is not the entry's to tell, and the request
    /// stays pending (the consumer commits it, or reconcile gives it back): 202 `pending`.
    Undecided,
}

impl AfterSend {
    /// Whether the caller is answered 202 `pending` (else 503).
    pub fn pending(self) -> bool {
        matches!(self, AfterSend::Ordered | AfterSend::Undecided)
    }
}

/// Sends the accepted purchase's order message; a send that failed is given back through the
/// arbiter: if this call claims it, nothing can commit it any more ([`AfterSend::GivenBack`],
/// [`AfterSend::Claimed`]); if the consumer committed first, it is an order; if the database
/// cannot be reached, the request stays pending.
pub async fn send_order(
    queue: &OrderQueue,
    pool: &PgPool,
    redis: &Redis,
    message: &OrderMessage,
) -> Sent {
    let a = &message.attempt;
    let Err(error) = queue.send(message, a.activity_id).await else {
        return Sent::Queued;
    };
    pause::point("entry.after_send_error", a.activity_id).await;
    let (activity_id, request_id) = (a.activity_id, a.request_id);
    let then = match giveback::give_back(pool, redis, a, FailureReason::SendFailed).await {
        Ok(done) if done.order().is_some() => {
            tracing::info!(activity_id, %request_id, %error, "send reported a failure but the order is in");
            AfterSend::Ordered
        }
        Ok(done) => {
            tracing::warn!(activity_id, %request_id, %error, ?done, "send failed; reservation given back");
            AfterSend::GivenBack
        }
        Err(e @ GiveBackError::Store(_)) => {
            tracing::warn!(activity_id, %request_id, %error, compensation_error = %e, "send failed; units go back with reconcile's next run");
            AfterSend::Claimed
        }
        Err(e) => {
            tracing::error!(activity_id, %request_id, %error, claim_error = %e,
                "send failed and the database is out of reach; the request stays pending");
            AfterSend::Undecided
        }
    };
    Sent::Failed { error, then }
}

/// What became of a draw entry's message.
#[derive(Debug)]
pub enum EntrySent {
    /// On the queue, or (the send failed and the database is out of reach) kept in Redis
    /// only: 202 `queued`.
    Queued,
    /// The send failed: claimed as a 503 and taken out of the pool. 503.
    TakenBack(QueueError),
}

/// Sends a draw entry Redis put in the pool to the entries' queue, so that the database keeps it
/// (a pool Redis loses is rebuilt from what it keeps). A failed send claims the request as a
/// 503 (`failed`, `unavailable`: the draw's callers take such entries out of the pool, should
/// this call's leave not get through) and takes the entry out of the pool; with the database
/// out of reach too the entry stays, in Redis only (it takes part in the draw unless Redis
/// loses the sale).
pub async fn send_entry(
    queue: &OrderQueue,
    pool: &PgPool,
    redis: &Redis,
    attempt: Attempt,
) -> EntrySent {
    let (activity_id, request_id) = (attempt.activity_id, attempt.request_id);
    let message = OrderMessage {
        attempt,
        reserved_at_ms: chrono::Utc::now().timestamp_millis(),
        load_epoch: None,
        kind: MessageKind::Entry,
    };
    let sent = if pause::fail("entry.enter.send", activity_id) {
        Err(QueueError::Timeout(queue.timeout))
    } else {
        // A crowd's entries share `SendMessageBatch` calls; each waits for its own answer.
        queue.send_coalesced(&message, activity_id).await
    };
    let Err(error) = sent else {
        return EntrySent::Queued;
    };
    let a = &message.attempt;
    match giveback::claim(pool, a, FailureReason::Unavailable).await {
        Ok(_) => {
            match pool::leave(redis, activity_id, &a.user_id, request_id).await {
                Ok(true) => put_back_other(pool, redis, a).await,
                Ok(false) => {}
                // The claim stands: the drawer takes the entry out before the draw.
                Err(e) => {
                    tracing::warn!(activity_id, %request_id, error = %e, "draw entry of a failed send not yet out of the pool");
                }
            }
            tracing::warn!(activity_id, %request_id, %error, "draw entry not sent; taken back");
            EntrySent::TakenBack(error)
        }
        Err(e) => {
            tracing::error!(activity_id, %request_id, %error, claim_error = %e,
                "draw entry not sent and the database is out of reach; it stays in the pool");
            EntrySent::Queued
        }
    }
}

/// A draw entry `a` answered 503 left the pool: the user's other live kept entry, if any,
/// goes back in its place (`protocol::draw::put_back_other_entry`). A failure is only logged:
/// the claim stands, and the drawer's clean-up of the 503 claims, before its next draw step,
/// puts the entry back.
async fn put_back_other(db: &PgPool, redis: &Redis, a: &Attempt) {
    let (id, user, left) = (a.activity_id, &a.user_id, a.request_id);
    let put_back = if pause::fail("entry.put_back", id) {
        Err(StoreError::Timeout(redis.timeout).into())
    } else {
        crate::protocol::draw::put_back_other_entry(redis, db, id, user, left, false).await
    };
    match put_back {
        Ok(true) => tracing::info!(activity_id = id, %left, "the user's kept entry stands again"),
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(activity_id = id, %left, error = %e, "the user's kept entry not put back")
        }
    }
}

/// A purchase whose script did not answer in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unanswered {
    /// Claimed and given back, or (the database out of reach) taken out of the draw's pool:
    /// 503, nothing happened.
    Unavailable,
    /// The request is an order already (a draw entry drawn, sent and committed before its
    /// answer came), or a drawn winner whose order follows: 202 `pending`.
    Ordered,
}

/// How often, and how far apart, the entry retries giving back an unanswered script's units.
const GIVE_BACK_ATTEMPTS: u32 = 10;
const GIVE_BACK_RETRY: Duration = Duration::from_millis(500);

/// A script whose answer never arrived may still have run: claim the request in the database
/// (a `failed` row, so nothing can ever commit it) and give back what the ledger holds for it.
/// The claim is awaited (it is what makes the coming 503 true); the Redis half, which may be
/// what is stalled, is tried once (bounded by `bound`) and then retried in the background for a
/// few seconds, and reconcile gives back a `failed` row's reservation on its next run whatever
/// happens here. `units_back` runs each time units went back to Redis (the caller's sold-out
/// memory of the sale is stale then). [`Unanswered::Ordered`] when the claim found the request
/// an order already: only a draw's entry can be one; nothing is given back.
pub async fn unanswered<F>(
    pool: &PgPool,
    redis: &Redis,
    attempt: Attempt,
    bound: Duration,
    units_back: F,
) -> Unanswered
where
    F: Fn() + Clone + Send + Sync + 'static,
{
    match giveback::claim(pool, &attempt, FailureReason::Unavailable).await {
        Ok(Claim::Won) | Ok(Claim::UnknownActivity) => {}
        Ok(Claim::Decided(row)) if row.status != OrderStatus::Failed => {
            tracing::warn!(request_id = %attempt.request_id, status = %row.status,
                "unanswered purchase is an order already");
            return Unanswered::Ordered;
        }
        Ok(Claim::Decided(row)) => {
            tracing::error!(status = %row.status, "fresh request id already decided");
            return Unanswered::Unavailable;
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not claim the unanswered purchase; reconcile gives it back after its grace period");
            return leave_without_claim(redis, &attempt, bound).await;
        }
    }
    // Between the claim and its Redis half: a draw may run meanwhile.
    pause::point("entry.unanswered.after_claim", attempt.activity_id).await;
    // One attempt now, bounded: a lost answer from a healthy Redis is undone before the 503
    // goes out. A stalled Redis gets the rest in the background.
    let first = tokio::time::timeout(
        bound,
        give_back_unanswered(pool, redis, &attempt, &units_back),
    );
    if matches!(first.await, Ok(Ok(()))) {
        return Unanswered::Unavailable;
    }
    let (pool, redis) = (pool.clone(), redis.clone());
    tokio::spawn(async move {
        for n in 1..=GIVE_BACK_ATTEMPTS {
            tokio::time::sleep(GIVE_BACK_RETRY).await;
            match give_back_unanswered(&pool, &redis, &attempt, &units_back).await {
                Ok(()) => return,
                Err(e) if n == GIVE_BACK_ATTEMPTS => {
                    tracing::warn!(request_id = %attempt.request_id, error = %e, "give-back left to reconcile");
                }
                Err(_) => {}
            }
        }
    });
    Unanswered::Unavailable
}

/// The database took no claim: a draw entry still leaves the pool, so that no draw picks a
/// request told 503. One the draw already made a winner stays (its message is on its way, and
/// only the database could stop it): [`Unanswered::Ordered`], the caller answers 202 `pending`
/// to follow it. The leave is tried once now and then in the background. A first-come sale
/// has no pool: nothing to do, and its reservation (never sent) goes back after reconcile's
/// grace period.
async fn leave_without_claim(redis: &Redis, r: &Attempt, bound: Duration) -> Unanswered {
    if r.buckets != 1 {
        return Unanswered::Unavailable;
    }
    let now = tokio::time::timeout(
        bound,
        pool::leave_entry(redis, r.activity_id, &r.user_id, r.request_id),
    );
    match now.await {
        Ok(Ok(Left::Winner)) => {
            tracing::warn!(request_id = %r.request_id, "unanswered draw entry is a winner; its order follows");
            return Unanswered::Ordered;
        }
        Ok(Ok(_)) => return Unanswered::Unavailable,
        Ok(Err(_)) | Err(_) => {}
    }
    let (redis, r) = (redis.clone(), r.clone());
    tokio::spawn(async move {
        for _ in 0..GIVE_BACK_ATTEMPTS {
            tokio::time::sleep(GIVE_BACK_RETRY).await;
            if pool::leave_entry(&redis, r.activity_id, &r.user_id, r.request_id)
                .await
                .is_ok()
            {
                return;
            }
        }
        tracing::warn!(request_id = %r.request_id, "draw entry of a 503 not taken out of the pool");
    });
    Unanswered::Unavailable
}

/// The Redis half of [`unanswered`], after the claim.
async fn give_back_unanswered(
    db: &PgPool,
    redis: &Redis,
    r: &Attempt,
    units_back: &impl Fn(),
) -> Result<(), StoreError> {
    // A draw sale's entry: out of the pool (or, drawn a winner, given back below).
    if r.buckets == 1 && pool::leave(redis, r.activity_id, &r.user_id, r.request_id).await? {
        tracing::warn!(request_id = %r.request_id, "late draw entry taken out of the pool");
        put_back_other(db, redis, r).await;
    }
    let mode = Compensation::Full;
    let units = ledger::compensate(redis, r.home(), &r.user_id, r.request_id, mode).await?;
    if units.is_some() {
        units_back();
        tracing::warn!(request_id = %r.request_id, ?units, "late purchase script given back");
    }
    Ok(())
}
