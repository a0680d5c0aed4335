//! A draw sale's draw and its sends. One actor runs a draw to its end: reconcile's run
//! ([`drive`]), the drawer: the entries answered 503 leave the pool, the draw runs if it is
//! due, its outcome is recorded in the database, and the outbox's winners are sent at least
//! once ([`drain`]: record, take, send, done), each bounded by the sale's share of the run and
//! resumed by the next. A request never runs a step: a purchase after the window answers
//! `draw_running` until the draw is done, a queued entrant's status read reads Redis alone. A
//! load from scratch rebuilds the pool from the database first ([`rebuild`]).
//! docs/invariants.md, "Draw admission".

use crate::domain::draw::{self as kept, Recorded};
use crate::domain::order;
use crate::domain::purchase::{Attempt, MessageKind, OrderMessage};
use crate::infra::pause;
use crate::infra::sqs::{OrderQueue, QueueError};
use crate::store::conn::{Redis, StoreError};
use crate::store::draw::{self, Drawn, Restore, RestoreCursor, Take, Taken};
use sqlx::PgPool;
use std::time::{Duration, Instant};
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum DrawError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    /// Redis holds a draw whose winners are not the recorded outcome's: nothing is sent.
    #[error("the draw in Redis is not the recorded one ({unrecorded} winners not in the record)")]
    Diverged { unrecorded: usize },
}

/// What one [`drive`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrawRun {
    pub drawn: Drawn,
    /// Entries answered 503 taken out of the pool before the draw.
    pub left: usize,
    /// Winners' order messages the queue confirmed.
    pub sent: usize,
    /// Winners still in the outbox after this run's sends (0 while the draw is not done):
    /// the next run sends them.
    pub unsent: i64,
    /// Redis holds a draw whose winners are not the recorded outcome's: nothing was sent, and
    /// the sale must be loaded from scratch (which puts the recorded outcome back).
    pub diverged: bool,
}

/// Reconcile's part in a draw sale, until `until` (the end of the sale's share of the run):
/// the entries answered 503 leave the pool, the draw's steps if it is due, then the
/// outbox's sends, in rounds of [`TAKE`] while time is left ([`drain_until`]). Each part does
/// its least (a step, a round) whatever the time; what is left, draw steps or unsent winners,
/// the next run goes on with. A failed send leaves its winners in the outbox for the next run
/// (it is logged, not an error); a draw that cannot run is.
pub async fn drive(
    redis: &Redis,
    db: &PgPool,
    queue: &OrderQueue,
    activity_id: i64,
    until: Instant,
) -> Result<DrawRun, DrawError> {
    let left = leave_unanswered(redis, db, activity_id).await?;
    let drawn = draw::draw(
        redis,
        activity_id,
        until.saturating_duration_since(Instant::now()),
    )
    .await?;
    if let Drawn::Now {
        winners,
        units,
        entrants,
    } = drawn
    {
        tracing::warn!(
            activity_id,
            winners,
            units,
            entrants,
            repair = "drawn",
            "draw ran"
        );
    }
    let mut report = DrawRun {
        drawn,
        left,
        sent: 0,
        unsent: 0,
        diverged: false,
    };
    if !drawn.is_done() {
        return Ok(report);
    }
    report.unsent = draw::unsent(redis, activity_id).await?;
    if report.unsent == 0 {
        return Ok(report);
    }
    match drain_until(redis, db, queue, activity_id, usize::MAX, Some(until)).await {
        Ok(d) => {
            report.sent = d.sent;
            if d.sent > 0 {
                tracing::info!(
                    activity_id,
                    sent = d.sent,
                    left = d.left,
                    "draw winners sent"
                );
            }
        }
        Err(DrawError::Diverged { .. }) => report.diverged = true,
        Err(e) => {
            tracing::warn!(activity_id, error = %e, "draw winners not all sent; the outbox keeps them")
        }
    }
    report.unsent = draw::unsent(redis, activity_id).await?;
    Ok(report)
}

/// What one [`drain`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drained {
    /// Order messages the queue confirmed.
    pub sent: usize,
    /// Outbox entries left (their sends failed, came in meanwhile, or the drainer's time or
    /// rounds ran out).
    pub left: i64,
    /// Another drainer held the lease: this one sent nothing.
    pub busy: bool,
}

/// Winners taken from the outbox per round.
pub const TAKE: usize = 100;
/// How long a drainer holds the outbox: long enough for one round of sends.
const LEASE: Duration = Duration::from_secs(10);

/// Sends the order messages of the winners in sale `activity_id`'s outbox, at least once, in
/// up to `rounds` rounds of [`TAKE`], and drops those the queue confirmed: [`drain_until`]
/// with no time limit.
pub async fn drain(
    redis: &Redis,
    db: &PgPool,
    queue: &OrderQueue,
    activity_id: i64,
    rounds: usize,
) -> Result<Drained, DrawError> {
    drain_until(redis, db, queue, activity_id, rounds, None).await
}

/// Sends the order messages of the winners in sale `activity_id`'s outbox, at least once, in
/// up to `rounds` rounds of [`TAKE`] (`SendMessageBatch` calls of 10), no call started after
/// `until` but the first one, and drops those the queue confirmed; what was taken and not
/// sent stays in the outbox. Before the first send of a draw its outcome
/// goes into the database ([`record`]). A send that fails leaves its winners in the outbox
/// for the next drainer (the error says so); no unit is given back for it, nor for a winner
/// left for the next run.
pub async fn drain_until(
    redis: &Redis,
    db: &PgPool,
    queue: &OrderQueue,
    activity_id: i64,
    rounds: usize,
    until: Option<Instant>,
) -> Result<Drained, DrawError> {
    let token = Uuid::new_v4().to_string();
    let mut report = Drained::default();
    let mut recorded = None;
    let mut round = 1;
    while round <= rounds.max(1) {
        let (now_ms, taken) =
            match draw::take(redis, activity_id, &token, LEASE, TAKE, recorded).await? {
                Take::Busy => {
                    report.busy = true;
                    return Ok(report);
                }
                // Recorded under an epoch Redis no longer holds: a load from scratch since
                // put the recorded outcome back itself, or holds another draw.
                Take::Unrecorded if recorded.is_some() => return Ok(report),
                Take::Unrecorded => {
                    let Some(epoch) = record(redis, db, activity_id).await? else {
                        return Ok(report);
                    };
                    recorded = Some(epoch);
                    continue;
                }
                Take::Leased { now_ms, taken } => (now_ms, taken),
            };
        let messages = messages(activity_id, now_ms, &taken);
        // Between the restamp and the sends: reconcile must not give these back.
        pause::point("draw.drain.after_take", activity_id).await;
        let mut sent = Vec::new();
        let mut failure = None;
        if pause::fail("draw.drain.after_take", activity_id) {
            failure = Some(QueueError::Timeout(queue.timeout));
        } else {
            for (i, chunk) in messages.chunks(10).enumerate() {
                // Out of time: the rest of the batch stays in the outbox for the next drainer
                // (the first send whatever the time, so every drainer moves the outbox on).
                if (round > 1 || i > 0) && until.is_some_and(|until| Instant::now() >= until) {
                    break;
                }
                match queue.send_batch(chunk, activity_id).await {
                    Ok(ok) => sent.extend(ok.into_iter().map(|i| chunk[i].attempt.request_id)),
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
            }
        }
        let last = messages.is_empty()
            || failure.is_some()
            || sent.len() < messages.len()
            || round == rounds.max(1)
            || until.is_some_and(|until| Instant::now() >= until);
        report.left = draw::done(redis, activity_id, &token, last, &sent).await?;
        report.sent += sent.len();
        if let Some(e) = failure {
            return Err(e.into());
        }
        if last {
            break;
        }
        round += 1;
    }
    Ok(report)
}

/// Records the outcome of sale `activity_id`'s draw in the database (its cutoff and every
/// winner, read from Redis), so that no other draw can ever replace it: a load from scratch
/// marks the sale drawn and puts back the winners without an order. Answers the load epoch
/// the recorded draw ran under; `None`: the draw is not done in Redis (or the sale is not
/// loaded), or the sale was loaded from scratch since it was read: nothing recorded. A record
/// that finds another outcome is an error: nothing of this draw may be sent.
pub async fn record(
    redis: &Redis,
    db: &PgPool,
    activity_id: i64,
) -> Result<Option<i64>, DrawError> {
    let Some(result) = draw::result(redis, activity_id).await? else {
        return Ok(None);
    };
    // Between the read of the draw and its record: Redis may lose the sale, a load may run.
    pause::point("draw.record.before_commit", activity_id).await;
    let recorded = kept::record(
        db,
        activity_id,
        result.epoch,
        &result.cutoff,
        &result.winners,
    )
    .await?;
    match recorded {
        Recorded::New => tracing::warn!(
            activity_id,
            winners = result.winners.len(),
            cutoff = %result.cutoff,
            "draw outcome recorded"
        ),
        Recorded::Same => {}
        Recorded::Stale => {
            tracing::warn!(
                activity_id,
                epoch = result.epoch,
                "the draw read is gone with a load from scratch; not recorded"
            );
            return Ok(None);
        }
        Recorded::Diverged { unrecorded } => {
            tracing::error!(
                activity_id,
                unrecorded,
                "the draw in Redis is not the recorded one; nothing is sent"
            );
            return Err(DrawError::Diverged { unrecorded });
        }
    }
    // Committed, not yet marked in Redis: a loss here loads the sale drawn, from the record.
    pause::point("draw.record.after_commit", activity_id).await;
    Ok(Some(result.epoch))
}

/// Entries one database read of the rebuild takes.
pub const REBUILD_CHUNK: usize = 1000;
/// Entries one `lua/pool_restore.lua` call puts back: each costs two SHA-1s of its ticket and
/// up to five writes, about 20-30 µs of server time, so a call stays within about 1.5 ms
/// (`make bench`'s draw section, `rebuild` rows).
pub const RESTORE_CALL: usize = 50;

/// What one [`rebuild`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rebuilt {
    /// Recorded winners without an order put back with their reservations.
    pub winners: i64,
    /// Entries put back into the pool.
    pub entries: i64,
    /// The rebuild is whole (else it goes on at the next load's run).
    pub done: bool,
}

/// After a load from scratch of a draw sale (the meta's cursor `restoreAt`, set by
/// `lua/preheat.lua`): puts back what the database keeps of its pool, in reads of
/// [`REBUILD_CHUNK`] from the cursor and script calls of [`RESTORE_CALL`] (each moves the
/// cursor), under the epoch of that load: first the recorded
/// winners without an order (their units were left out of the loaded stock), then every live
/// entry; the last chunk drops the cursor and, with a recorded outcome, marks the draw done.
/// The draw waits for it. Stops at `deadline` (the next run goes on from the cursor); a sale
/// with no rebuild due costs one read.
pub async fn rebuild(
    redis: &Redis,
    db: &PgPool,
    activity_id: i64,
    deadline: Instant,
) -> Result<Rebuilt, DrawError> {
    let mut report = Rebuilt::default();
    let Some((mut at, epoch)) = draw::restore_at(redis, activity_id).await? else {
        report.done = true;
        return Ok(report);
    };
    let cutoff = kept::outcome(db, activity_id).await?;
    if at == 0 && cutoff.is_some() {
        let winners = kept::winners_without_order(db, activity_id).await?;
        for chunk in winners.chunks(RESTORE_CALL) {
            let put = draw::restore(
                redis,
                activity_id,
                Some(epoch),
                Restore::Winners,
                RestoreCursor::None,
                chunk,
            )
            .await?;
            let Some(put) = put else { return Ok(report) };
            report.winners += put;
        }
    }
    loop {
        if Instant::now() >= deadline {
            return Ok(report);
        }
        let rows = kept::entries_after(db, activity_id, at, REBUILD_CHUNK as i64).await?;
        let last = rows.len() < REBUILD_CHUNK;
        // No row left: one call with none, to mark the rebuild whole.
        let parts: Vec<&[kept::EntryRow]> = if rows.is_empty() {
            vec![&[]]
        } else {
            rows.chunks(RESTORE_CALL).collect()
        };
        let calls = parts.len();
        for (i, part) in parts.into_iter().enumerate() {
            at = part.last().map_or(at, |r| r.id);
            let cursor = if last && i + 1 == calls {
                RestoreCursor::Done {
                    cutoff: cutoff.as_deref(),
                }
            } else {
                RestoreCursor::At(at)
            };
            let entries: Vec<_> = part
                .iter()
                .filter(|r| r.live)
                .map(|r| r.entry.clone())
                .collect();
            let put = draw::restore(
                redis,
                activity_id,
                Some(epoch),
                Restore::Entries,
                cursor,
                &entries,
            )
            .await?;
            let Some(put) = put else { return Ok(report) };
            report.entries += put;
        }
        if last {
            report.done = true;
            return Ok(report);
        }
        // Between two chunks: entries arrive, the consumer restores its own, Redis may lose
        // the sale again; or the loader stops here (out of its time, or it died).
        pause::point("draw.rebuild.between_chunks", activity_id).await;
        if pause::fail("draw.rebuild.between_chunks", activity_id) {
            return Ok(report);
        }
    }
}

/// The order messages of a take's winners, reserved at `now_ms` (the restamp).
fn messages(activity_id: i64, now_ms: i64, taken: &[Taken]) -> Vec<OrderMessage> {
    taken
        .iter()
        .map(|t| OrderMessage {
            attempt: Attempt {
                request_id: t.request_id,
                activity_id,
                user_id: t.user_id.clone(),
                quantity: t.quantity,
                buckets: 1,
            },
            reserved_at_ms: now_ms,
            // A recorded winner's units are held by the record, whatever Redis lost since:
            // its order commits under any load epoch.
            load_epoch: None,
            kind: MessageKind::Winner,
        })
        .collect()
}

/// Purchases answered 503 one [`leave_unanswered`] handles at most.
pub const LEAVE_BATCH: i64 = 500;
/// How old a 503's claim must be before the clean-up's cursor passes it: a row id is taken
/// when the claim's insert starts and visible when it commits, so a younger row with a lower
/// id than one already seen may still appear; one older than this cannot (a claim is one
/// short statement).
pub const LEAVE_SETTLED: Duration = Duration::from_secs(60);

/// Before a draw: takes the entries whose purchase was answered 503 out of the pool (see
/// [`draw::leave`]), from the database's claims, so that the draw never picks one whose
/// give-back did not reach Redis (a stalled Redis, a container frozen after its answer).
/// Incremental: up to [`LEAVE_BATCH`] claims after the cursor in the sale's meta, which then
/// moves past those older than [`LEAVE_SETTLED`] (so a claim is handled once, or again only
/// within that minute). Answers how many left.
pub async fn leave_unanswered(
    redis: &Redis,
    db: &PgPool,
    activity_id: i64,
) -> Result<usize, DrawError> {
    let after = draw::left_after(redis, activity_id).await?;
    let rows = order::unanswered_after(db, activity_id, after, LEAVE_BATCH).await?;
    let settled_before =
        chrono::Utc::now() - chrono::Duration::from_std(LEAVE_SETTLED).expect("a short duration");
    let mut left = 0;
    let mut cursor = after;
    let mut settled = true;
    for row in &rows {
        left += usize::from(draw::leave(redis, activity_id, &row.user_id, row.request_id).await?);
        settled &= row.created_at < settled_before;
        if settled {
            cursor = row.id;
        }
    }
    if cursor > after {
        draw::leave_up_to(redis, activity_id, cursor).await?;
    }
    Ok(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_batch_becomes_winner_messages_with_the_restamp_and_no_epoch() {
        let id = Uuid::now_v7();
        let taken = [Taken {
            request_id: id,
            user_id: "alice".into(),
            quantity: 2,
            epoch: 7,
        }];
        let m = messages(5, 1_000, &taken);
        assert_eq!(m.len(), 1);
        assert_eq!(
            (
                m[0].attempt.request_id,
                m[0].attempt.user_id.as_str(),
                m[0].attempt.quantity
            ),
            (id, "alice", 2)
        );
        assert_eq!(
            (m[0].reserved_at_ms, m[0].load_epoch, m[0].attempt.buckets),
            (1_000, None, 1)
        );
        assert_eq!(m[0].kind, MessageKind::Winner);
    }
}
