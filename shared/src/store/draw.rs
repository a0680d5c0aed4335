//! A draw sale's scripts and reads: the draw (`lua/draw.lua`), its winners read for the
//! record, the drawer's settle of the record and of each chunk of orders
//! (`lua/draw_settle.lua`), an entry taken back out of the pool
//! (`lua/pool_leave.lua`), entries and winners put back from the database
//! (`lua/pool_restore.lua`), and the pool's entries. The sequence they run in is
//! [`crate::protocol::draw`]; docs/invariants.md, "Draw admission".

use super::conn::{Redis, StoreError};
use super::keys::Bucket;
use super::scripts::{self, codes};
use super::values::{PoolEntry, WinnerEntry};
use crate::domain::draw::Entry;
use crate::infra::pause;
use uuid::Uuid;

codes! {
    /// `lua/draw.lua`'s reply codes.
    pub enum DrawCode of "draw.lua" {
        Open = 0,
        Step = 1,
        Before = 2,
        NotDraw = 3,
        NotLoaded = 4,
        Done = 5,
        Restoring = 6,
        Waiting = 7,
    }
}

/// Tickets one call of `lua/draw.lua` looks at: each costs a handful of commands (a winner's
/// four writes at most), so one call stays within about a millisecond of server time whatever
/// the pool's size (`make bench`'s draw section measures the longest).
pub const STEP_TICKETS: usize = 32;

/// What [`draw`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drawn {
    /// The window is open for `ms_left` more; `entrants` are in the pool.
    Open { entrants: i64, ms_left: i64 },
    /// This call finished the draw: in its steps `winners` entrants won, taking `units`.
    Now {
        winners: i64,
        units: i64,
        entrants: i64,
    },
    /// This call drew a part (`winners`, `units`) and ran out of its time; the draw goes on
    /// from where it stopped at the next call.
    Running {
        winners: i64,
        units: i64,
        entrants: i64,
    },
    /// An earlier call finished the draw.
    Before { entrants: i64 },
    /// A first-come sale: there is nothing to draw.
    NotDraw,
    /// The sale is not in Redis.
    NotLoaded,
    /// The sale was loaded from scratch and its pool is being rebuilt from the database: the
    /// draw waits for it (the loader finishes it, or its next run).
    Restoring { entrants: i64 },
    /// Rebuilt from the database: the draw waits for the entries still on the queue (the
    /// drawer ends the wait, [`draw_with`]).
    Waiting { entrants: i64 },
}

impl Drawn {
    /// Whether the draw is done (now or before).
    pub fn is_done(self) -> bool {
        matches!(self, Drawn::Now { .. } | Drawn::Before { .. })
    }
}

/// One step of the draw of sale `activity_id` (`lua/draw.lua`): up to `tickets` tickets.
/// Answers the code and the step's winners, units, entrants and ms left of the window.
async fn step(
    redis: &Redis,
    activity_id: i64,
    tickets: usize,
    end_wait: bool,
) -> Result<(DrawCode, i64, i64, i64, i64), StoreError> {
    let k = redis.bucket_keys(Bucket::from(activity_id));
    let mut inv = scripts::DRAW.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.users)
        .key(&k.ledger)
        .key(&k.pool)
        .key(&k.winners)
        .key(&k.tickets)
        .arg(tickets.max(1))
        .arg(u8::from(end_wait));
    let (code, winners, units, entrants, ms_left): (i64, i64, i64, i64, i64) =
        redis.script(&inv).await?;
    Ok((DrawCode::read(code)?, winners, units, entrants, ms_left))
}

/// Runs the draw of sale `activity_id` if its window has closed and it is not done, in steps
/// of [`STEP_TICKETS`] (each one atomic, none long) until it is done or `budget` has passed.
/// Between two steps Redis serves everyone else. A sale rebuilt from the database waits
/// ([`Drawn::Waiting`]): see [`draw_with`].
pub async fn draw(
    redis: &Redis,
    activity_id: i64,
    budget: std::time::Duration,
) -> Result<Drawn, StoreError> {
    draw_with(redis, activity_id, budget, false).await
}

/// [`draw`], and with `end_wait` the wait of a rebuilt sale for its queued entries ends first
/// (the drawer found them written, or its bound passed).
pub async fn draw_with(
    redis: &Redis,
    activity_id: i64,
    budget: std::time::Duration,
    end_wait: bool,
) -> Result<Drawn, StoreError> {
    let started = std::time::Instant::now();
    let (mut winners, mut units) = (0, 0);
    for n in 0usize.. {
        if n > 0 {
            // Between two steps of one caller: others purchase, read, take entries back, or
            // run steps of the same draw.
            pause::point("draw.between_steps", activity_id).await;
        }
        let (code, w, u, entrants, ms_left) =
            step(redis, activity_id, STEP_TICKETS, end_wait).await?;
        winners += w;
        units += u;
        match code {
            DrawCode::Open => return Ok(Drawn::Open { entrants, ms_left }),
            DrawCode::Before if winners == 0 => return Ok(Drawn::Before { entrants }),
            // Another caller finished it between two of this call's steps.
            DrawCode::Before | DrawCode::Done => {
                return Ok(Drawn::Now {
                    winners,
                    units,
                    entrants,
                })
            }
            DrawCode::NotDraw => return Ok(Drawn::NotDraw),
            DrawCode::NotLoaded => return Ok(Drawn::NotLoaded),
            DrawCode::Restoring => return Ok(Drawn::Restoring { entrants }),
            DrawCode::Waiting => return Ok(Drawn::Waiting { entrants }),
            DrawCode::Step if started.elapsed() >= budget => {
                return Ok(Drawn::Running {
                    winners,
                    units,
                    entrants,
                })
            }
            DrawCode::Step => {}
        }
    }
    unreachable!("the steps end the loop")
}

/// Where a draw sale's draw stands, as a buyer's status read sees it: one read of the meta,
/// no step run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrawState {
    /// The sale is not in Redis.
    NotLoaded,
    /// A first-come sale: there is nothing to draw.
    NotDraw,
    /// The window is open, or the drawer has not finished the draw yet.
    Undecided,
    /// The draw is done: a pool entry's state is final.
    Done,
}

/// Where the draw of sale `activity_id` stands (`HMGET` of the meta's `stock`, `drawEndMs`
/// and `drawn`). A caller that read a pool entry before this and finds the draw done reads the
/// entry again: the step that finished the draw may have made it a winner in between.
pub async fn state(redis: &Redis, activity_id: i64) -> Result<DrawState, StoreError> {
    let k = redis.bucket_keys(Bucket::from(activity_id));
    let (stock, draw_end, drawn): (Option<i64>, Option<i64>, Option<String>) = redis
        .cmd(
            redis::cmd("HMGET")
                .arg(&k.meta)
                .arg("stock")
                .arg("drawEndMs")
                .arg("drawn"),
        )
        .await?;
    Ok(match (stock, draw_end.unwrap_or(0), drawn.as_deref()) {
        (None, _, _) => DrawState::NotLoaded,
        (_, end, _) if end <= 0 => DrawState::NotDraw,
        (_, _, Some("1")) => DrawState::Done,
        _ => DrawState::Undecided,
    })
}

/// The draw's result as Redis holds it, for the database's record: the last ticket the draw
/// looked at and every winner it made (read from `winners` in `HSCAN` pages, each one bounded
/// call; the list holds at most one winner per unit of stock). `None`: the sale is not loaded
/// or its draw is not done.
pub async fn result(redis: &Redis, activity_id: i64) -> Result<Option<DrawResult>, StoreError> {
    let k = redis.bucket_keys(Bucket::from(activity_id));
    let (drawn, cutoff, epoch): (Option<String>, Option<String>, Option<i64>) = redis
        .cmd(
            redis::cmd("HMGET")
                .arg(&k.meta)
                .arg("drawn")
                .arg("drawCutoff")
                .arg("epoch"),
        )
        .await?;
    let (Some("1"), Some(epoch)) = (drawn.as_deref(), epoch) else {
        return Ok(None);
    };
    let mut winners = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, flat): (u64, Vec<String>) = redis
            .cmd(
                redis::cmd("HSCAN")
                    .arg(&k.winners)
                    .arg(cursor)
                    .arg("COUNT")
                    .arg(1000),
            )
            .await?;
        for pair in flat.chunks(2) {
            if let [request_id, value] = pair {
                if let Some(w) = winner(request_id, value) {
                    winners.push(w);
                }
            }
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    Ok(Some(DrawResult {
        epoch,
        cutoff: cutoff.unwrap_or_default(),
        winners,
    }))
}

/// What a draw decided, as [`result`] reads it from Redis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrawResult {
    /// The load epoch the draw ran under: a load from scratch since means another draw.
    pub epoch: i64,
    /// The last ticket the draw looked at (empty: it looked at none).
    pub cutoff: String,
    pub winners: Vec<Entry>,
}

/// A winner from its entry in `winners` (the sentinel is none).
fn winner(request_id: &str, value: &str) -> Option<Entry> {
    let entry = WinnerEntry::parse(value)?;
    Some(Entry {
        request_id: request_id.parse().ok()?,
        user_id: entry.user_id,
        quantity: entry.quantity,
    })
}

codes! {
    /// `lua/pool_restore.lua`'s reply codes.
    pub enum RestoreCode of "pool_restore.lua" {
        NotLoaded = 0,
        Restored = 1,
        Stale = 2,
    }
}

/// What goes back into a pool: entries that wait for the draw (or read `not_drawn` after it),
/// or the recorded winners, with their reservations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restore {
    Entries,
    /// Entries the database keeps as late: they go back late (`l`), whatever the draw.
    LateEntries,
    Winners,
}

/// Where a loader's rebuild stands after a chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestoreCursor<'a> {
    /// Not the loader's (the consumer's restore of one batch).
    None,
    /// The drawer's put-back of a 503's kept entry: as the consumer's, but nothing while a
    /// rebuild is under way (the loader puts the entry back as the database says).
    Cleanup,
    /// The loader's first call in a sale whose outcome is recorded: its `cutoff` is final
    /// from now on (an entry the consumer puts back meanwhile is late, or a loser).
    Recorded { cutoff: &'a str },
    /// Entries up to this row id are back.
    At(i64),
    /// The rebuild is whole; with the recorded outcome's cutoff the draw is marked done, and
    /// without it, when `wait`, the draw waits for the entries still on the queue.
    Done { cutoff: Option<&'a str>, wait: bool },
}

/// `lua/pool_restore.lua`: puts `entries` (user, request id, quantity) back into the pool of
/// sale `activity_id` as `what`, under load `epoch` (`None`: any), and moves the loader's
/// `cursor`. `None`: not loaded, or loaded under another epoch; else what went in.
pub async fn restore(
    redis: &Redis,
    activity_id: i64,
    epoch: Option<i64>,
    what: Restore,
    cursor: RestoreCursor<'_>,
    entries: &[Entry],
) -> Result<Option<Restored>, StoreError> {
    let k = redis.bucket_keys(Bucket::from(activity_id));
    let mut inv = scripts::POOL_RESTORE.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.users)
        .key(&k.ledger)
        .key(&k.pool)
        .key(&k.winners)
        .key(&k.tickets)
        .arg(epoch.map(|e| e.to_string()).unwrap_or_default())
        .arg(match what {
            Restore::Entries => "q",
            Restore::LateEntries => "l",
            Restore::Winners => "w",
        });
    match cursor {
        RestoreCursor::None => inv.arg("").arg(""),
        RestoreCursor::Cleanup => inv.arg("cleanup").arg(""),
        RestoreCursor::Recorded { cutoff } => inv.arg("recorded").arg(cutoff),
        RestoreCursor::At(id) => inv.arg(id).arg(""),
        RestoreCursor::Done { cutoff, wait } => inv
            .arg(if wait { "done-wait" } else { "done" })
            .arg(cutoff.unwrap_or("")),
    };
    for e in entries {
        inv.arg(&e.user_id)
            .arg(e.request_id.to_string())
            .arg(e.quantity);
    }
    let (code, put, late): (i64, i64, Vec<String>) = redis.script(&inv).await?;
    let late = late.iter().filter_map(|id| id.parse().ok()).collect();
    Ok(match RestoreCode::read(code)? {
        RestoreCode::Restored => Some(Restored { put, late }),
        RestoreCode::NotLoaded | RestoreCode::Stale => None,
    })
}

/// What one [`restore`] put back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// Entries or winners put back.
    pub put: i64,
    /// The consumer's entries put back late (the draw had begun), or found held late already:
    /// the database keeps them so.
    pub late: Vec<Uuid>,
}

/// Where the rebuild of sale `activity_id`'s pool stands: `None` when none is due (not a sale
/// loaded from scratch, or its rebuild is whole), else the last entry row id put back, and the
/// load epoch.
pub async fn restore_at(redis: &Redis, activity_id: i64) -> Result<Option<(i64, i64)>, StoreError> {
    let k = redis.bucket_keys(Bucket::from(activity_id));
    let (at, epoch): (Option<i64>, Option<i64>) = redis
        .cmd(
            redis::cmd("HMGET")
                .arg(&k.meta)
                .arg("restoreAt")
                .arg("epoch"),
        )
        .await?;
    Ok(at.zip(epoch))
}

/// When a rebuilt sale's draw waits for its queued entries: the window's close (ms of the
/// Redis clock); `None` when it does not wait.
pub async fn waits_for_entries(redis: &Redis, activity_id: i64) -> Result<Option<i64>, StoreError> {
    let k = redis.bucket_keys(Bucket::from(activity_id));
    let (wait, draw_end): (Option<String>, Option<i64>) = redis
        .cmd(
            redis::cmd("HMGET")
                .arg(&k.meta)
                .arg("waitEntries")
                .arg("drawEndMs"),
        )
        .await?;
    Ok(wait.and(draw_end))
}

/// Where the drawer's work on a sale stands in Redis, after a [`settle`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// The meta says the outcome is in the database.
    pub recorded: bool,
    /// The meta says every winner's order is written.
    pub written: bool,
    /// Reservations dropped.
    pub dropped: usize,
}

/// `lua/draw_settle.lua` for sale `activity_id`: marks the outcome `recorded` when the caller
/// committed it under load `recorded` (the draw's epoch), drops the reservations of the
/// winners whose orders committed (`ordered`: user, request id), and marks the orders
/// `written` when `all_written`. One call per chunk: its arguments are the chunk's.
pub async fn settle(
    redis: &Redis,
    activity_id: i64,
    recorded: Option<i64>,
    all_written: bool,
    ordered: &[Entry],
) -> Result<Settled, StoreError> {
    let k = redis.bucket_keys(Bucket::from(activity_id));
    let mut inv = scripts::DRAW_SETTLE.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.ledger)
        .arg(recorded.map(|e| e.to_string()).unwrap_or_default())
        .arg(u8::from(all_written));
    for w in ordered {
        inv.arg(&w.user_id).arg(w.request_id.to_string());
    }
    let (recorded, written, dropped): (i64, i64, i64) = redis.script(&inv).await?;
    Ok(Settled {
        recorded: recorded == 1,
        written: written == 1,
        dropped: dropped as usize,
    })
}

/// Where sale `activity_id`'s drawer stands in Redis: (`recorded`, `written`) from its meta.
pub async fn progress(redis: &Redis, activity_id: i64) -> Result<(bool, bool), StoreError> {
    let s = settle(redis, activity_id, None, false, &[]).await?;
    Ok((s.recorded, s.written))
}

codes! {
    /// `lua/pool_leave.lua`'s reply codes.
    pub enum LeaveCode of "pool_leave.lua" {
        Stayed = 0,
        Left = 1,
        Winner = 2,
    }
}

/// What [`leave_entry`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Left {
    /// No entry of this request in the pool (none was made, or it left before).
    None,
    /// The entry left: the draw cannot pick it.
    Left,
    /// The entry was drawn a winner and stays: its reservation is in the ledger.
    Winner,
}

/// Takes back the draw entry of `request_id` whose purchase was answered 503
/// (`lua/pool_leave.lua`): before the draw it leaves the pool; after it a loser's leaves and
/// a winner's stays (its reservation is given back like any other).
pub async fn leave_entry(
    redis: &Redis,
    activity_id: i64,
    user_id: &str,
    request_id: Uuid,
) -> Result<Left, StoreError> {
    let k = redis.bucket_keys(Bucket::from(activity_id));
    let mut inv = scripts::POOL_LEAVE.prepare_invoke();
    inv.key(&k.pool)
        .key(&k.meta)
        .arg(user_id)
        .arg(request_id.to_string());
    Ok(match LeaveCode::read(redis.script(&inv).await?)? {
        LeaveCode::Stayed => Left::None,
        LeaveCode::Left => Left::Left,
        LeaveCode::Winner => Left::Winner,
    })
}

/// [`leave_entry`], true when the entry left.
pub async fn leave(
    redis: &Redis,
    activity_id: i64,
    user_id: &str,
    request_id: Uuid,
) -> Result<bool, StoreError> {
    Ok(leave_entry(redis, activity_id, user_id, request_id).await? == Left::Left)
}

/// Where the clean-up of the purchases answered 503 stands in sale `activity_id`: the row id
/// up to which they are handled (0: none yet, or the sale's meta was lost since).
pub async fn left_after(redis: &Redis, activity_id: i64) -> Result<i64, StoreError> {
    let k = redis.bucket_keys(Bucket::from(activity_id));
    let at: Option<i64> = redis
        .cmd(redis::cmd("HGET").arg(&k.meta).arg("leftAfter"))
        .await?;
    Ok(at.unwrap_or(0))
}

/// Moves the clean-up's cursor of sale `activity_id` up to `row_id` (`lua/pool_leave.lua` with
/// no entry; never down, and never into a meta that is not there).
pub async fn leave_up_to(redis: &Redis, activity_id: i64, row_id: i64) -> Result<(), StoreError> {
    let k = redis.bucket_keys(Bucket::from(activity_id));
    let mut inv = scripts::POOL_LEAVE.prepare_invoke();
    inv.key(&k.pool).key(&k.meta).arg("").arg("").arg(row_id);
    LeaveCode::read(redis.script(&inv).await?)?;
    Ok(())
}

/// The user's entry in the pool of sale `activity_id`, if any.
pub async fn pool_entry(
    redis: &Redis,
    activity_id: i64,
    user_id: &str,
) -> Result<Option<PoolEntry>, StoreError> {
    let k = redis.bucket_keys(Bucket::from(activity_id));
    let value: Option<String> = redis
        .cmd(redis::cmd("HGET").arg(&k.pool).arg(user_id))
        .await?;
    Ok(value.as_deref().and_then(PoolEntry::parse))
}

/// Every entry of the pool of sale `activity_id`, by user.
pub async fn pool(redis: &Redis, activity_id: i64) -> Result<Vec<(String, PoolEntry)>, StoreError> {
    let k = redis.bucket_keys(Bucket::from(activity_id));
    let flat: Vec<String> = redis.cmd(redis::cmd("HGETALL").arg(&k.pool)).await?;
    Ok(flat
        .chunks(2)
        .filter_map(|pair| match pair {
            [user, value] if !user.is_empty() => PoolEntry::parse(value).map(|e| (user.clone(), e)),
            _ => None,
        })
        .collect())
}
