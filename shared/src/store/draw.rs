//! A draw sale's scripts and reads: the draw (`lua/draw.lua`), the outbox's take and done
//! (`lua/outbox_take.lua`, `lua/outbox_done.lua`), an entry taken back out of the pool
//! (`lua/pool_leave.lua`), and the pool's entries. The sequence they run in is
//! [`crate::protocol::draw`]; docs/invariants.md, "Draw admission".

use super::conn::{Redis, StoreError};
use super::keys::Bucket;
use super::scripts::{self, codes};
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
) -> Result<(DrawCode, i64, i64, i64, i64), StoreError> {
    let k = redis.bucket_keys(Bucket::from(activity_id));
    let mut inv = scripts::DRAW.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.users)
        .key(&k.ledger)
        .key(&k.pool)
        .key(&k.outbox)
        .key(&k.tickets)
        .arg(tickets.max(1));
    let (code, winners, units, entrants, ms_left): (i64, i64, i64, i64, i64) =
        redis.script(&inv).await?;
    Ok((DrawCode::read(code)?, winners, units, entrants, ms_left))
}

/// Runs the draw of sale `activity_id` if its window has closed and it is not done, in steps
/// of [`STEP_TICKETS`] (each one atomic, none long) until it is done or `budget` has passed.
/// Between two steps Redis serves everyone else.
pub async fn draw(
    redis: &Redis,
    activity_id: i64,
    budget: std::time::Duration,
) -> Result<Drawn, StoreError> {
    let started = std::time::Instant::now();
    let (mut winners, mut units) = (0, 0);
    for n in 0usize.. {
        if n > 0 {
            // Between two steps of one caller: others purchase, read, take entries back, or
            // run steps of the same draw.
            pause::point("draw.between_steps", activity_id).await;
        }
        let (code, w, u, entrants, ms_left) = step(redis, activity_id, STEP_TICKETS).await?;
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

codes! {
    /// `lua/outbox_take.lua`'s reply codes.
    pub enum TakeCode of "outbox_take.lua" {
        /// Another drainer holds the lease.
        Busy = 0,
        Leased = 1,
    }
}

/// One winner `lua/outbox_take.lua` took to send: its reservation restamped to the take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taken {
    pub request_id: Uuid,
    pub user_id: String,
    pub quantity: i64,
    pub epoch: i64,
}

/// `lua/outbox_take.lua` for the drainer `token`: leases the outbox for `lease` and takes up to
/// `want` winners, restamping each reservation to the Redis clock's now (answered with them).
/// `None`: another drainer holds the lease.
pub async fn take(
    redis: &Redis,
    activity_id: i64,
    token: &str,
    lease: std::time::Duration,
    want: usize,
) -> Result<Option<(i64, Vec<Taken>)>, StoreError> {
    let k = redis.bucket_keys(Bucket::from(activity_id));
    let mut inv = scripts::OUTBOX_TAKE.prepare_invoke();
    inv.key(&k.ledger)
        .key(&k.outbox)
        .arg(token)
        .arg(lease.as_millis() as u64)
        .arg(want);
    let (code, now_ms, flat): (i64, i64, Vec<String>) = redis.script(&inv).await?;
    if TakeCode::read(code)? == TakeCode::Busy {
        return Ok(None);
    }
    Ok(Some((now_ms, taken(&flat))))
}

/// The winners of a take's flat answer: request id, user, quantity, load epoch, four fields
/// each (one that does not read is passed over).
fn taken(flat: &[String]) -> Vec<Taken> {
    flat.chunks(4)
        .filter_map(|f| match f {
            [request_id, user_id, quantity, epoch] => Some(Taken {
                request_id: request_id.parse().ok()?,
                user_id: user_id.clone(),
                quantity: quantity.parse().ok()?,
                epoch: epoch.parse().ok()?,
            }),
            _ => None,
        })
        .collect()
}

/// `lua/outbox_done.lua` for the drainer `token`: drops `sent` from the outbox, ends the lease
/// when `last`, and answers the entries left.
pub async fn done(
    redis: &Redis,
    activity_id: i64,
    token: &str,
    last: bool,
    sent: &[Uuid],
) -> Result<i64, StoreError> {
    let k = redis.bucket_keys(Bucket::from(activity_id));
    let mut inv = scripts::OUTBOX_DONE.prepare_invoke();
    inv.key(&k.outbox).arg(token).arg(u8::from(last));
    for id in sent {
        inv.arg(id.to_string());
    }
    redis.script(&inv).await
}

/// Winners in the outbox of sale `activity_id` (0 when it has none, or is not a draw sale).
/// (`lua/outbox_done.lua` with nothing to drop: it counts, in one step, without reading the
/// entries.)
pub async fn unsent(redis: &Redis, activity_id: i64) -> Result<i64, StoreError> {
    done(redis, activity_id, "", false, &[]).await
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

/// A user's entry in a draw sale's pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolEntry {
    pub request_id: Uuid,
    pub quantity: i64,
    /// Arrival order in the pool, from 1.
    pub rank: i64,
    /// Drawn as a winner (else queued, or after the draw not drawn).
    pub won: bool,
}

impl PoolEntry {
    /// Reads `requestId|qty|rank|state`.
    pub fn parse(value: &str) -> Option<Self> {
        let mut parts = value.split('|');
        let request_id = parts.next()?.parse().ok()?;
        let quantity = parts.next()?.parse().ok()?;
        let rank = parts.next()?.parse().ok()?;
        let won = match parts.next()? {
            "w" => true,
            "q" => false,
            _ => return None,
        };
        Some(Self {
            request_id,
            quantity,
            rank,
            won,
        })
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_entry_reads_back_and_bad_ones_do_not() {
        let id = Uuid::now_v7();
        let e = PoolEntry::parse(&format!("{id}|2|17|w")).unwrap();
        assert_eq!((e.request_id, e.quantity, e.rank, e.won), (id, 2, 17, true));
        assert!(!PoolEntry::parse(&format!("{id}|1|3|q")).unwrap().won);
        assert_eq!(PoolEntry::parse(&format!("{id}|1|3|x")), None);
        assert_eq!(PoolEntry::parse("-"), None);
    }

    #[test]
    fn a_taken_batch_reads_its_winners() {
        let id = Uuid::now_v7();
        let flat = [id.to_string(), "alice".into(), "2".into(), "7".into()];
        assert_eq!(
            taken(&flat),
            [Taken {
                request_id: id,
                user_id: "alice".into(),
                quantity: 2,
                epoch: 7
            }]
        );
    }
}
