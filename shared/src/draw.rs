//! Draw admission: a sale whose opening is decided by a draw, not by speed.
//!
//! A draw sale (`admission` = `draw`) collects the purchases of its first `drawWindowMs`
//! into a pool (`lua/purchase.lua` answers them `queued`, one entry per user, no stock
//! taken). When the window closes, [`draw`] runs `lua/draw.lua` once: it shuffles the pool
//! and gives the stock to the entrants in that order, each a reservation exactly like a
//! first-come purchase's, plus an entry in the sale's **outbox**: the winners whose order
//! message is still to be sent. [`drain`] sends them (`lua/outbox_take.lua`, SQS, then
//! `lua/outbox_done.lua`), at least once: the consumer is idempotent per request id. The
//! entry function that ran the draw drains at once; a pool entrant asking for their status,
//! and reconcile on every run, drain what a crash left. Reconcile never gives back a
//! reservation still in the outbox, and a taken reservation is restamped at its send, so a
//! winner never loses the unit to a late send. docs/invariants.md, "Draw admission", has the
//! protocol.

use crate::cache::{CacheError, Redis};
use crate::keys::Bucket;
use crate::queue::{OrderMessage, OrderQueue, QueueError};
use crate::scripts;
use std::time::Duration;
use uuid::Uuid;

/// What [`draw`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drawn {
    /// The window is open for `ms_left` more; `entrants` are in the pool.
    Open { entrants: i64, ms_left: i64 },
    /// This call drew: `winners` entrants won, taking `units`.
    Now {
        winners: i64,
        units: i64,
        entrants: i64,
    },
    /// An earlier call drew.
    Before { entrants: i64 },
    /// A first-come sale: there is nothing to draw.
    NotDraw,
    /// The sale is not in Redis.
    NotLoaded,
}

impl Drawn {
    /// Whether the draw has run (now or before).
    pub fn is_done(self) -> bool {
        matches!(self, Drawn::Now { .. } | Drawn::Before { .. })
    }
}

/// A seed for the draw's shuffle, from the OS's generator. `lua/draw.lua` takes it below 2^31
/// (Lua's `math.randomseed` takes an integer it holds exactly).
pub fn seed() -> u32 {
    rand::random::<u32>() >> 1
}

/// Runs the draw of sale `activity_id` if its window has closed and it has not run; with the
/// `seed` of the shuffle (see [`seed`]; a test passes its own to repeat a draw).
pub async fn draw(redis: &Redis, activity_id: i64, seed: u32) -> Result<Drawn, CacheError> {
    let k = redis.bucket_keys(Bucket::from(activity_id));
    let mut inv = scripts::DRAW.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.users)
        .key(&k.ledger)
        .key(&k.pool)
        .key(&k.outbox)
        .arg(seed);
    let (code, winners, units, entrants, ms_left): (i64, i64, i64, i64, i64) =
        redis.script(&inv).await?;
    Ok(match code {
        0 => Drawn::Open { entrants, ms_left },
        1 => Drawn::Now {
            winners,
            units,
            entrants,
        },
        2 => Drawn::Before { entrants },
        3 => Drawn::NotDraw,
        4 => Drawn::NotLoaded,
        other => return Err(scripts::unknown_answer("draw.lua", other)),
    })
}

/// What one [`drain`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drained {
    /// Order messages the queue confirmed.
    pub sent: usize,
    /// Outbox entries left (their sends failed, or came in meanwhile).
    pub left: i64,
    /// Another drainer held the lease: this one sent nothing.
    pub busy: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Winners taken from the outbox per round.
pub const TAKE: usize = 100;
/// How long a drainer holds the outbox: long enough for one round of sends.
const LEASE: Duration = Duration::from_secs(10);

/// Sends the order messages of the winners in sale `activity_id`'s outbox, at least once, in
/// up to `rounds` rounds of [`TAKE`] (the caller answering a request bounds it; a background
/// task or reconcile does not), and drops those the queue confirmed. A send that fails leaves
/// its winners in the outbox for the next drainer (the error says so); no unit is given back
/// for it.
pub async fn drain(
    redis: &Redis,
    queue: &OrderQueue,
    activity_id: i64,
    rounds: usize,
) -> Result<Drained, DrainError> {
    let k = redis.bucket_keys(Bucket::from(activity_id));
    let token = Uuid::new_v4().to_string();
    let mut report = Drained::default();
    for round in 1..=rounds.max(1) {
        let mut take = scripts::OUTBOX_TAKE.prepare_invoke();
        take.key(&k.ledger)
            .key(&k.outbox)
            .arg(&token)
            .arg(LEASE.as_millis() as u64)
            .arg(TAKE);
        let (leased, now_ms, flat): (i64, i64, Vec<String>) = redis.script(&take).await?;
        if leased == 0 {
            report.busy = true;
            return Ok(report);
        }
        let messages = messages(activity_id, now_ms, &flat);
        // Between the restamp and the sends: reconcile must not give these back.
        crate::pause::point("draw.drain.after_take", activity_id).await;
        let mut sent = Vec::new();
        let mut failure = None;
        if crate::pause::fail("draw.drain.after_take", activity_id) {
            failure = Some(QueueError::Timeout(queue.timeout));
        } else {
            for chunk in messages.chunks(10) {
                match queue.send_batch(chunk).await {
                    Ok(ok) => sent.extend(ok),
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
            || round == rounds.max(1);
        let mut done = scripts::OUTBOX_DONE.prepare_invoke();
        done.key(&k.outbox).arg(&token).arg(u8::from(last));
        for id in &sent {
            done.arg(id.to_string());
        }
        report.left = redis.script(&done).await?;
        report.sent += sent.len();
        if let Some(e) = failure {
            return Err(e.into());
        }
        if last {
            break;
        }
    }
    Ok(report)
}

/// The order messages of a batch `lua/outbox_take.lua` answered: request id, user, quantity,
/// load epoch, four fields each. Reserved at `now_ms`, the restamp.
fn messages(activity_id: i64, now_ms: i64, flat: &[String]) -> Vec<OrderMessage> {
    flat.chunks(4)
        .filter_map(|f| match f {
            [request_id, user_id, quantity, epoch] => Some(OrderMessage {
                request_id: request_id.parse().ok()?,
                activity_id,
                user_id: user_id.clone(),
                quantity: quantity.parse().ok()?,
                reserved_at_ms: now_ms,
                load_epoch: Some(epoch.parse().ok()?),
                buckets: None,
            }),
            _ => None,
        })
        .collect()
}

/// Winners in the outbox of sale `activity_id` (0 when it has none, or is not a draw sale).
/// (`lua/outbox_done.lua` with nothing to drop: it counts, in one step, without reading the
/// entries.)
pub async fn unsent(redis: &Redis, activity_id: i64) -> Result<i64, CacheError> {
    let k = redis.bucket_keys(Bucket::from(activity_id));
    let mut count = scripts::OUTBOX_DONE.prepare_invoke();
    count.key(&k.outbox).arg("").arg(0);
    redis.script(&count).await
}

/// Takes back the draw entry of `request_id` whose purchase was answered 503
/// (`lua/pool_leave.lua`): before the draw it leaves the pool; after it a loser's leaves and
/// a winner's stays (its reservation is given back like any other). True when it left.
pub async fn leave(
    redis: &Redis,
    activity_id: i64,
    user_id: &str,
    request_id: Uuid,
) -> Result<bool, CacheError> {
    let k = redis.bucket_keys(Bucket::from(activity_id));
    let mut inv = scripts::POOL_LEAVE.prepare_invoke();
    inv.key(&k.pool).arg(user_id).arg(request_id.to_string());
    let left: i64 = redis.script(&inv).await?;
    scripts::flag("pool_leave.lua", left)
}

/// Before a draw: takes every entry whose purchase was answered 503 out of the pool (see
/// [`leave`]), from the database's claims, so that the draw never picks one whose give-back
/// did not reach Redis (a stalled Redis, a container frozen after its answer). Answers how
/// many left.
pub async fn leave_unanswered(
    redis: &Redis,
    db: &sqlx::PgPool,
    activity_id: i64,
) -> Result<usize, DrainError> {
    let mut left = 0;
    for (user_id, request_id) in crate::order::unanswered(db, activity_id).await? {
        left += usize::from(leave(redis, activity_id, &user_id, request_id).await?);
    }
    Ok(left)
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
) -> Result<Option<PoolEntry>, CacheError> {
    let k = redis.bucket_keys(Bucket::from(activity_id));
    let value: Option<String> = redis
        .cmd(redis::cmd("HGET").arg(&k.pool).arg(user_id))
        .await?;
    Ok(value.as_deref().and_then(PoolEntry::parse))
}

/// Every entry of the pool of sale `activity_id`, by user.
pub async fn pool(redis: &Redis, activity_id: i64) -> Result<Vec<(String, PoolEntry)>, CacheError> {
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
    fn a_taken_batch_becomes_messages_with_the_restamp_and_the_epoch() {
        let id = Uuid::now_v7();
        let flat = [id.to_string(), "alice".into(), "2".into(), "7".into()];
        let m = messages(5, 1_000, &flat);
        assert_eq!(m.len(), 1);
        assert_eq!(
            (m[0].request_id, m[0].user_id.as_str(), m[0].quantity),
            (id, "alice", 2)
        );
        assert_eq!(
            (m[0].reserved_at_ms, m[0].load_epoch, m[0].buckets),
            (1_000, Some(7), None)
        );
    }
}
