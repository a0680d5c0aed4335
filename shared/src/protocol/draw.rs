//! A draw sale's draw and its orders. One actor runs a draw to its end: reconcile's run
//! ([`drive`]), the drawer: the entries answered 503 leave the pool, a sale loaded from scratch
//! after a loss waits for its entries still on the queue, the draw runs if it is due, its
//! outcome is recorded in the database ([`record`]), and the winners' orders are
//! written from the record in chunks ([`write_orders`]), each chunk's reservations settled in
//! Redis by one script; each part bounded by the sale's share of the run and resumed by the
//! next. No winner crosses the queue. A request never runs a step: a purchase after the window
//! answers `draw_running` until the draw is done, a queued entrant's status read reads Redis
//! alone. A load from scratch rebuilds the pool from the database first ([`rebuild`]).
//! docs/invariants.md, "Draw admission".

use crate::domain::draw::{self as kept, Entry, Recorded};
use crate::domain::order;
use crate::infra::pause;
use crate::infra::sqs::OrderQueue;
use crate::protocol::giveback::{self, GiveBackError};
use crate::store::conn::{Redis, StoreError};
use crate::store::draw::{self, Drawn, Restore, RestoreCursor};
use sqlx::PgPool;
use std::time::{Duration, Instant};
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum DrawError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    GiveBack(#[from] GiveBackError),
    /// Redis holds a draw whose winners are not the recorded outcome's: no order is written
    /// from it.
    #[error("the draw in Redis is not the recorded one ({unrecorded} winners not in the record)")]
    Diverged { unrecorded: usize },
}

/// What one [`drive`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrawRun {
    pub drawn: Drawn,
    /// Entries answered 503 taken out of the pool before the draw.
    pub left: usize,
    /// Winners' orders this run wrote.
    pub ordered: usize,
    /// Every winner has its order row (false while the draw is not done): else the next run
    /// goes on from the record's cursor.
    pub written: bool,
    /// Redis holds a draw whose winners are not the recorded outcome's: no order was written,
    /// and the sale must be loaded from scratch (which puts the recorded outcome back).
    pub diverged: bool,
}

/// Reconcile's part in a draw sale, until `until` (the end of the sale's share of the run):
/// the entries answered 503 leave the pool, the end of a rebuilt sale's wait for its queued
/// entries when they are written or `entry_wait` has passed since the close
/// (`entries_written`), the draw's steps if it is due, the record of its outcome, then the
/// winners' orders in chunks of [`ORDER_CHUNK`] while time is left (from the database alone
/// when Redis no longer holds the draw). Each part does its least (a step, the record, a
/// chunk) whatever the time; what is left, the next run goes on with.
pub async fn drive(
    redis: &Redis,
    db: &PgPool,
    queue: &OrderQueue,
    activity_id: i64,
    until: Instant,
    entry_wait: Duration,
) -> Result<DrawRun, DrawError> {
    let left = leave_unanswered(redis, db, activity_id, until).await?;
    let end_wait = entries_written(redis, queue, activity_id, entry_wait).await?;
    let drawn = draw::draw_with(
        redis,
        activity_id,
        until.saturating_duration_since(Instant::now()),
        end_wait,
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
        ordered: 0,
        written: false,
        diverged: false,
    };
    if drawn.is_done() {
        let (recorded, written) = draw::progress(redis, activity_id).await?;
        if written {
            report.written = true;
            return Ok(report);
        }
        if !recorded {
            match record(redis, db, activity_id).await {
                Ok(Some(_)) => {}
                // Loaded from scratch meanwhile: the next run finds the rebuilt sale.
                Ok(None) => return Ok(report),
                Err(DrawError::Diverged { .. }) => {
                    report.diverged = true;
                    return Ok(report);
                }
                Err(e) => return Err(e),
            }
        }
    } else if kept::orders_written(db, activity_id).await? != Some(false) {
        // No outcome yet, or every order written.
        return Ok(report);
    }
    // A recorded outcome's orders are the database's to write, whatever Redis holds now (the
    // sale lost and not loaded again once it ended, its pool still being rebuilt).
    let w = write_orders(redis, db, activity_id, Some(until)).await?;
    report.ordered = w.ordered;
    report.written = w.written;
    if w.ordered > 0 {
        tracing::info!(
            activity_id,
            ordered = w.ordered,
            written = w.written,
            "draw winners' orders written"
        );
    }
    Ok(report)
}

/// How long past the window's close the queue's backlog is first trusted: an entry admitted
/// just before the close is sent after it (within the send's timeout), and SQS's counts lag
/// its sends by a few seconds.
pub const ENTRY_SETTLE: Duration = Duration::from_secs(10);

/// Whether a rebuilt sale's draw may stop waiting for its queued entries: its window closed
/// more than the send's timeout and [`ENTRY_SETTLE`] ago and the entries' queue (`queue`) holds
/// no message (every entry sent before the close is written, and put back into the pool by the consumer
/// with its ticket), or `entry_wait` has passed since the close (an entry written later reads
/// `entered_late`). False for a sale that does not wait, or whose window is open. A queue that
/// cannot be read ends no wait before the bound.
async fn entries_written(
    redis: &Redis,
    queue: &OrderQueue,
    activity_id: i64,
    entry_wait: Duration,
) -> Result<bool, DrawError> {
    let Some(close_ms) = draw::waits_for_entries(redis, activity_id).await? else {
        return Ok(false);
    };
    let now_ms = chrono::Utc::now().timestamp_millis();
    let settled_ms = close_ms.saturating_add((queue.timeout + ENTRY_SETTLE).as_millis() as i64);
    if now_ms < settled_ms.min(close_ms.saturating_add(entry_wait.as_millis() as i64)) {
        return Ok(false);
    }
    if now_ms >= close_ms.saturating_add(entry_wait.as_millis() as i64) {
        tracing::warn!(
            activity_id,
            repair = "draw_wait_ended",
            "the draw stops waiting for queued entries: its bound passed"
        );
        return Ok(true);
    }
    match queue.backlog().await {
        Ok(0) => Ok(true),
        Ok(held) => {
            tracing::info!(activity_id, held, "the draw waits for the queued entries");
            Ok(false)
        }
        Err(e) => {
            tracing::warn!(activity_id, error = %e, "the entries queue's backlog is unknown; the draw waits");
            Ok(false)
        }
    }
}

/// Records the outcome of sale `activity_id`'s draw in the database (its cutoff and every
/// winner, read from Redis), so that no other draw can ever replace it: a load from scratch
/// marks the sale drawn and puts back the winners without an order; then marks it `recorded`
/// in Redis. Answers the load epoch the recorded draw ran under; `None`: the draw is not done
/// in Redis (or the sale is not loaded), or the sale was loaded from scratch since it was
/// read: nothing recorded. A record that finds another outcome is an error: no order of this
/// draw may be written.
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
                "the draw in Redis is not the recorded one; no order is written from it"
            );
            return Err(DrawError::Diverged { unrecorded });
        }
    }
    // Committed, not yet marked in Redis: a loss here loads the sale drawn, from the record.
    pause::point("draw.record.after_commit", activity_id).await;
    draw::settle(redis, activity_id, Some(result.epoch), false, &[]).await?;
    Ok(Some(result.epoch))
}

/// Winners whose orders one chunk writes: one insert, one stock update and one cursor move in
/// one transaction, then one settle script of this many (an `HGET` and an `HDEL` each, about
/// 5-8 µs of server time on a large ledger: 500 took 3.9 ms at 10⁵ winners in `make bench`'s
/// draw section, so a call of 200 stays near 1.5 ms).
pub const ORDER_CHUNK: usize = 200;

/// What [`write_orders`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OrdersWritten {
    /// Winners whose order this call wrote.
    pub ordered: usize,
    /// Every winner has its order row, and Redis says so.
    pub written: bool,
}

/// Writes the orders of sale `activity_id`'s recorded winners, in chunks of [`ORDER_CHUNK`]
/// from the record's cursor ([`kept::write_orders`]), no chunk started after `until` but the
/// first; after each commit one `lua/draw_settle.lua` drops the chunk's reservations (the last
/// also marks the orders written). A winner the chunk passed over is applied as its row says
/// (a `failed` claim gives its units back, an `already_purchased` one keeps the user's field).
/// A crash between the commit and the settle leaves reservations whose rows exist: reconcile
/// settles or gives them back like any other.
pub async fn write_orders(
    redis: &Redis,
    db: &PgPool,
    activity_id: i64,
    until: Option<Instant>,
) -> Result<OrdersWritten, DrawError> {
    let mut report = OrdersWritten::default();
    loop {
        let chunk = kept::write_orders(db, activity_id, ORDER_CHUNK as i64).await?;
        if chunk.unrecorded {
            return Ok(report);
        }
        // Committed, not yet settled: reconcile, a reload, a second drawer may run here.
        pause::point("draw.orders.after_commit", activity_id).await;
        for w in &chunk.skipped {
            skipped(redis, db, w).await?;
        }
        let settled = draw::settle(redis, activity_id, None, chunk.done, &chunk.ordered).await?;
        report.ordered += chunk.ordered.len();
        report.written = settled.written;
        if chunk.done || until.is_some_and(|until| Instant::now() >= until) {
            return Ok(report);
        }
    }
}

/// A recorded winner whose order the chunk did not insert: its request's row (a claim after a
/// 503, a give-back, or the chunk's own `already_purchased` claim) applied as it says.
async fn skipped(redis: &Redis, db: &PgPool, w: &Entry) -> Result<(), DrawError> {
    if let Some(row) = order::by_request(db, w.request_id).await? {
        giveback::apply(redis, &row).await?;
    }
    Ok(())
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
    if let (0, Some(recorded)) = (at, cutoff.as_deref()) {
        let winners = kept::winners_without_order(db, activity_id).await?;
        // The first call (with no winner if there is none) makes the recorded cutoff final in
        // the meta: an entry the consumer puts back from now on is late or a loser.
        let chunks: Vec<&[Entry]> = if winners.is_empty() {
            vec![&[]]
        } else {
            winners.chunks(RESTORE_CALL).collect()
        };
        for (i, chunk) in chunks.into_iter().enumerate() {
            let cursor = if i == 0 {
                RestoreCursor::Recorded { cutoff: recorded }
            } else {
                RestoreCursor::None
            };
            let put = draw::restore(
                redis,
                activity_id,
                Some(epoch),
                Restore::Winners,
                cursor,
                chunk,
            )
            .await?;
            let Some(put) = put else { return Ok(report) };
            report.winners += put.put;
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
                    // A sale's first load (epoch 1) has no entry on its way back; a load
                    // after a loss may.
                    wait: epoch > 1,
                }
            } else {
                RestoreCursor::At(at)
            };
            let (late, entries): (Vec<&kept::EntryRow>, Vec<&kept::EntryRow>) =
                part.iter().filter(|r| r.live).partition(|r| r.late);
            let entry = |r: &&kept::EntryRow| r.entry.clone();
            // The late ones first, moving no cursor: a crash between the two calls puts them
            // back again (a second time adds nothing).
            if !late.is_empty() {
                let late: Vec<Entry> = late.iter().map(entry).collect();
                let (what, none) = (Restore::LateEntries, RestoreCursor::None);
                let put = draw::restore(redis, activity_id, Some(epoch), what, none, &late).await?;
                let Some(put) = put else { return Ok(report) };
                report.entries += put.put;
            }
            let entries: Vec<Entry> = entries.iter().map(entry).collect();
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
            report.entries += put.put;
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

/// After request `left` of `user_id` was taken out of sale `activity_id`'s pool (answered 503):
/// the user's other live entry the database keeps, if any, goes back in its place
/// (`lua/pool_restore.lua` as the consumer runs it: queued with its ticket while no step ran,
/// else late, and then marked late in the database, as the consumer marks its own). The
/// consumer may have found the user's field held by `left` when it kept that other entry (the
/// user entered again after Redis lost the sale, before her first entry was written) and added
/// nothing: without this, an entry answered 202 `queued` would take part in no draw. Answers
/// whether one went back. Idempotent: a user whose field is held (that entry back already, or
/// a newer one) gets nothing, and one held late is marked late again. `by_drawer`: the
/// drawer's clean-up, which puts nothing back while a rebuild is under way (after a loss, the
/// rebuild puts the entry back as the database says: late, or looked at by a draw already
/// recorded, which a put-back now could not tell apart).
pub async fn put_back_other_entry(
    redis: &Redis,
    db: &PgPool,
    activity_id: i64,
    user_id: &str,
    left: Uuid,
    by_drawer: bool,
) -> Result<bool, DrawError> {
    let Some((entry, late)) = kept::other_live_entry(db, activity_id, user_id, left).await? else {
        return Ok(false);
    };
    let what = if late {
        Restore::LateEntries
    } else {
        Restore::Entries
    };
    let cursor = if by_drawer {
        RestoreCursor::Cleanup
    } else {
        RestoreCursor::None
    };
    let restored = draw::restore(redis, activity_id, None, what, cursor, &[entry]).await?;
    pause::point("draw.put_back.before_mark", activity_id).await;
    if pause::fail("draw.put_back.before_mark", activity_id) {
        return Err(StoreError::Timeout(redis.timeout).into());
    }
    let Some(restored) = restored else {
        return Ok(false);
    };
    if !restored.late.is_empty() {
        kept::mark_late(db, activity_id, &restored.late).await?;
    }
    Ok(restored.put > 0)
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
/// give-back did not reach Redis (a stalled Redis, a container frozen after its answer); and
/// for each, whoever took it out, puts the user's other kept entry back
/// ([`put_back_other_entry`]), should the 503's own put-back not have got through.
/// Incremental: up to [`LEAVE_BATCH`] claims after the cursor in the sale's meta, which then
/// moves past those older than [`LEAVE_SETTLED`] (so a claim is handled once, or again only
/// within that minute), and stops after the claim it handles at `until` (the rest go to the
/// next run). Answers how many left.
pub async fn leave_unanswered(
    redis: &Redis,
    db: &PgPool,
    activity_id: i64,
    until: Instant,
) -> Result<usize, DrawError> {
    let after = draw::left_after(redis, activity_id).await?;
    let rows = order::unanswered_after(db, activity_id, after, LEAVE_BATCH).await?;
    let settled_before =
        chrono::Utc::now() - chrono::Duration::from_std(LEAVE_SETTLED).expect("a short duration");
    let mut left = 0;
    let mut cursor = after;
    let mut settled = true;
    for (handled, row) in rows.iter().enumerate() {
        if handled > 0 && Instant::now() >= until {
            break;
        }
        if draw::leave(redis, activity_id, &row.user_id, row.request_id).await? {
            left += 1;
        }
        put_back_other_entry(redis, db, activity_id, &row.user_id, row.request_id, true).await?;
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
