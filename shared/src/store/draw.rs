//! A draw sale's scripts and reads: the draw (`lua/draw.lua`), the outbox's take and done
//! (`lua/outbox_take.lua`, `lua/outbox_done.lua`), an entry taken back out of the pool
//! (`lua/pool_leave.lua`), and the pool's entries. The sequence they run in is
//! [`crate::protocol::draw`]; docs/invariants.md, "Draw admission".

use super::conn::{Redis, StoreError};
use super::keys::Bucket;
use super::scripts::{self, codes};
use uuid::Uuid;

codes! {
    /// `lua/draw.lua`'s reply codes.
    pub enum DrawCode of "draw.lua" {
        Open = 0,
        Now = 1,
        Before = 2,
        NotDraw = 3,
        NotLoaded = 4,
    }
}

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
pub async fn draw(redis: &Redis, activity_id: i64, seed: u32) -> Result<Drawn, StoreError> {
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
    Ok(match DrawCode::read(code)? {
        DrawCode::Open => Drawn::Open { entrants, ms_left },
        DrawCode::Now => Drawn::Now {
            winners,
            units,
            entrants,
        },
        DrawCode::Before => Drawn::Before { entrants },
        DrawCode::NotDraw => Drawn::NotDraw,
        DrawCode::NotLoaded => Drawn::NotLoaded,
    })
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
    }
}

/// Takes back the draw entry of `request_id` whose purchase was answered 503
/// (`lua/pool_leave.lua`): before the draw it leaves the pool; after it a loser's leaves and
/// a winner's stays (its reservation is given back like any other). True when it left.
pub async fn leave(
    redis: &Redis,
    activity_id: i64,
    user_id: &str,
    request_id: Uuid,
) -> Result<bool, StoreError> {
    let k = redis.bucket_keys(Bucket::from(activity_id));
    let mut inv = scripts::POOL_LEAVE.prepare_invoke();
    inv.key(&k.pool).arg(user_id).arg(request_id.to_string());
    Ok(LeaveCode::read(redis.script(&inv).await?)? == LeaveCode::Left)
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
