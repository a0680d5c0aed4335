//! The purchase scripts: `lua/purchase.lua` in one bucket, and the two steps of a transfer
//! between buckets (`lua/borrow.lua`, `lua/credit.lua`). The purchase as a whole, across
//! buckets, is [`crate::protocol::purchase`].

use super::conn::{Redis, StoreError};
use super::keys::Bucket;
use super::scripts::{self, codes};
use super::values::SaleTerms;
use crate::domain::purchase::Attempt;
use crate::domain::refusal::Refusal;
use crate::infra::pause;
use uuid::Uuid;

codes! {
    /// `lua/purchase.lua`'s reply codes.
    pub enum Code of "purchase.lua" {
        Accepted = 0,
        NotFound = 1,
        NotStarted = 2,
        Ended = 3,
        QuantityExceedsLimit = 4,
        SoldOut = 5,
        AlreadyPurchased = 6,
        Expired = 7,
        Layout = 8,
        Short = 9,
        Queued = 10,
        DrawDue = 11,
        RateLimited = 12,
        PoolFull = 13,
    }
}

/// A purchase `purchase.lua` made: stock taken, user added, reservation recorded in the
/// ledger of the user's home bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// Units left after this one (in the home bucket).
    pub stock_left: i64,
    /// The Redis server's clock when the script ran: the reservation's time.
    pub now_ms: i64,
    /// The sale's load epoch, for the order message.
    pub epoch: i64,
    /// The sale's bucket count the reservation was made under, for the order message.
    pub buckets: u32,
}

/// What `purchase.lua` answered in one bucket: one variant per reply code, refusals folded
/// into [`Answer::Refused`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Accepted(Reservation),
    Refused(Refusal),
    /// The sale has this many buckets, not the caller's count: ask the right home bucket.
    Layout(u32),
    /// A bucketed sale's home bucket holds only `stock` units, fewer than asked, and the user
    /// is free to buy: borrow from the other buckets and ask again.
    Short {
        stock: i64,
    },
    /// A draw sale's window is open: the user is in its pool, with this arrival rank (from 1).
    Queued {
        rank: i64,
    },
    /// A draw sale's window has closed and its draw has not run: run it and ask again.
    DrawDue,
}

/// Units [`borrow`] took from another bucket, for the home bucket's purchase to add to its
/// stock (once per id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credit {
    /// The bucket the units came from.
    pub donor: Bucket,
    pub id: Uuid,
    pub units: i64,
    pub epoch: i64,
}

/// Runs `lua/purchase.lua` in bucket `home` for `attempt`, adding `credits` to the bucket's
/// stock first. `deadline_ms` is on the Redis server's clock: a script that only gets to run
/// after it refuses ([`Refusal::Expired`]), so a caller that timed out and answered 503
/// leaves nothing behind. The flag: every credit is in the bucket's stock (now or before), so
/// the donors' ledger entries can go. The call carries the sale's terms as `redis` last read
/// them, and keeps the meta's when the script answers them (the copy was not the meta's).
pub async fn run(
    redis: &Redis,
    home: Bucket,
    attempt: &Attempt,
    deadline_ms: i64,
    credits: &[Credit],
) -> Result<(Answer, bool), StoreError> {
    invoke(redis, home, attempt, deadline_ms, credits, false).await
}

/// [`run`] once more, with no credits, for a purchase whose first call its per-user rate
/// already counted (a short buyer whose sale-wide check found units back in the home bucket).
pub async fn run_again(
    redis: &Redis,
    home: Bucket,
    attempt: &Attempt,
    deadline_ms: i64,
) -> Result<Answer, StoreError> {
    Ok(invoke(redis, home, attempt, deadline_ms, &[], true)
        .await?
        .0)
}

async fn invoke(
    redis: &Redis,
    home: Bucket,
    attempt: &Attempt,
    deadline_ms: i64,
    credits: &[Credit],
    again: bool,
) -> Result<(Answer, bool), StoreError> {
    let k = redis.bucket_keys(home);
    let mut inv = scripts::PURCHASE.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.users)
        .key(&k.ledger)
        .key(&k.pool)
        .key(k.rate(&attempt.user_id))
        .key(&k.tickets)
        .arg(&attempt.user_id)
        .arg(attempt.quantity)
        .arg(attempt.request_id.to_string())
        .arg(deadline_ms)
        .arg(home.count);
    let terms = redis.terms.get(attempt.activity_id);
    for arg in carried(terms.as_deref()) {
        inv.arg(arg);
    }
    // The copy in hand, the script not yet run: an admin change may land in between.
    pause::point("purchase.terms", attempt.activity_id).await;
    for c in credits {
        inv.arg(c.id.to_string()).arg(c.units).arg(c.epoch);
    }
    if again && credits.is_empty() {
        // No credit, and still a second call: one empty argument says so.
        inv.arg("");
    }
    let r = reply(redis.script(&inv).await?)?;
    match &r.terms {
        Some(Some(text)) => redis.terms.put(attempt.activity_id, text),
        Some(None) => redis.terms.forget(attempt.activity_id),
        None => {}
    }
    let (value, now_ms) = (r.value, r.now_ms);
    let answer = match Code::read(r.code)? {
        Code::Accepted => Answer::Accepted(Reservation {
            stock_left: value,
            now_ms,
            epoch: r.epoch,
            buckets: home.count,
        }),
        Code::Layout => Answer::Layout(u32::try_from(value).unwrap_or(1).max(1)),
        Code::Short => Answer::Short { stock: value },
        Code::Queued => Answer::Queued { rank: value },
        Code::DrawDue => Answer::DrawDue,
        Code::NotFound => Answer::Refused(Refusal::NotFound),
        Code::NotStarted => Answer::Refused(Refusal::NotStarted),
        Code::Ended => Answer::Refused(Refusal::Ended),
        Code::QuantityExceedsLimit => Answer::Refused(Refusal::QuantityExceedsLimit),
        Code::SoldOut => Answer::Refused(Refusal::SoldOut { stock_left: value }),
        Code::AlreadyPurchased => Answer::Refused(Refusal::AlreadyPurchased),
        Code::Expired => Answer::Refused(Refusal::Expired { now_ms }),
        Code::RateLimited => Answer::Refused(Refusal::RateLimited {
            retry_after_ms: value,
        }),
        Code::PoolFull => Answer::Refused(Refusal::PoolFull),
    };
    Ok((answer, r.credited == 1))
}

/// `purchase.lua`'s arguments 6 to 12: the caller's copy of the sale's terms, the whole value
/// and its six fields, or seven empty arguments for none.
pub fn carried(terms: Option<&SaleTerms>) -> [&str; 7] {
    match terms {
        Some(t) => {
            let mut args = [t.text(); 7];
            for (arg, part) in args[1..].iter_mut().zip(t.parts()) {
                *arg = part;
            }
            args
        }
        None => [""; 7],
    }
}

/// The sale's terms as bucket `bucket`'s meta holds them (`None`: not loaded, or kept by a
/// build before the meta held them), for a caller of `purchase.lua` of its own (the bench).
pub async fn read_terms(redis: &Redis, bucket: Bucket) -> Result<Option<SaleTerms>, StoreError> {
    let meta = redis.bucket_keys(bucket).meta;
    let text: Option<String> = redis
        .cmd(redis::cmd("HGET").arg(&meta).arg("terms"))
        .await?;
    Ok(text.as_deref().and_then(SaleTerms::parse))
}

/// `purchase.lua`'s answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub code: i64,
    pub value: i64,
    pub now_ms: i64,
    pub epoch: i64,
    pub credited: i64,
    /// The meta's `terms` (`None` inside: it has none), when the caller's copy was not it.
    pub terms: Option<Option<String>>,
}

/// `purchase.lua`'s reply `{code, value, nowMs, epoch, credited[, terms]}`; the bare sold-out
/// code (its answer from the meta's read alone, the caller's terms the meta's) reads as
/// `{5, 0, 0, 0, 1}`.
pub fn reply(value: redis::Value) -> Result<Reply, redis::RedisError> {
    if let redis::Value::Int(code) = value {
        if code == Code::SoldOut as i64 {
            return Ok(Reply {
                code,
                value: 0,
                now_ms: 0,
                epoch: 0,
                credited: 1,
                terms: None,
            });
        }
    }
    let mut items: Vec<redis::Value> = redis::from_redis_value(value)?;
    let terms = match items.len() {
        5 => None,
        6 => Some(redis::from_redis_value(items.pop().expect("six"))?),
        n => {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Parse,
                "purchase.lua answered a table of another length",
                n.to_string(),
            )))
        }
    };
    let (code, value, now_ms, epoch, credited) =
        redis::from_redis_value(redis::Value::Array(items))?;
    Ok(Reply {
        code,
        value,
        now_ms,
        epoch,
        credited,
        terms,
    })
}

/// A purchase deadline that never passes, for callers with no timeout of their own to honour
/// (tests, tools).
pub fn far_deadline() -> i64 {
    i64::MAX / 2
}

codes! {
    /// `lua/borrow.lua`'s one code; any other first value is the units it took.
    pub enum Borrowed of "borrow.lua" {
        Nothing = 0,
    }
}

/// `lua/borrow.lua`: takes units from `donor` for a purchase in `home` that is short of
/// `need`, under the transfer id `id`. `None`: nothing there (empty, not loaded, or another
/// layout).
pub async fn borrow(
    redis: &Redis,
    donor: Bucket,
    home: Bucket,
    id: Uuid,
    need: i64,
) -> Result<Option<Credit>, StoreError> {
    let k = redis.bucket_keys(donor);
    let mut inv = scripts::BORROW.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.ledger)
        .arg(id.to_string())
        .arg(need)
        .arg(home.index)
        .arg(donor.count);
    let (units, epoch): (i64, i64) = redis.script(&inv).await?;
    Ok((units != Borrowed::Nothing as i64).then_some(Credit {
        donor,
        id,
        units,
        epoch,
    }))
}

codes! {
    /// What `lua/credit.lua` answered.
    pub enum Credited of "credit.lua" {
        /// The home bucket is not loaded: a load from scratch is under way or due.
        NotLoaded = 0,
        Now = 1,
        Before = 2,
        /// The home bucket was loaded again since the units were taken.
        OtherEpoch = 3,
    }
}

/// `lua/credit.lua`: puts a transfer's units into its home bucket, once.
pub async fn credit(
    redis: &Redis,
    home: Bucket,
    id: Uuid,
    units: i64,
    epoch: i64,
) -> Result<Credited, StoreError> {
    let k = redis.bucket_keys(home);
    let mut inv = scripts::CREDIT.prepare_invoke();
    inv.key(&k.meta).arg(id.to_string()).arg(units).arg(epoch);
    Credited::read(redis.script::<i64>(&inv).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bare_sold_out_code_reads_as_its_table_and_no_other_bare_code_does() {
        use redis::Value::{Array, BulkString, Int, Nil};
        let numbers = |r: Reply| (r.code, r.value, r.now_ms, r.epoch, r.credited);
        let sold_out = reply(Int(5)).unwrap();
        assert_eq!(
            (numbers(sold_out.clone()), sold_out.terms),
            ((5, 0, 0, 0, 1), None)
        );
        let five = vec![Int(0), Int(7), Int(1_700), Int(3), Int(1)];
        let table = reply(Array(five.clone())).unwrap();
        assert_eq!(
            (numbers(table.clone()), table.terms),
            ((0, 7, 1_700, 3, 1), None)
        );
        let with = |last| Array(five.iter().cloned().chain([last]).collect());
        let terms = b"1:1:2:3:0:0".to_vec();
        assert_eq!(
            reply(with(BulkString(terms))).unwrap().terms,
            Some(Some("1:1:2:3:0:0".into()))
        );
        assert_eq!(reply(with(Nil)).unwrap().terms, Some(None));
        for bare in [0, 1, 6] {
            assert!(reply(Int(bare)).is_err(), "a bare {bare} is no answer");
        }
        assert!(reply(Array(five[..4].to_vec())).is_err());
    }

    #[test]
    fn a_code_the_wrapper_does_not_know_is_an_error_not_an_outcome() {
        assert_eq!(Code::read(0).unwrap(), Code::Accepted);
        assert_eq!(Code::read(12).unwrap(), Code::RateLimited);
        assert_eq!(Code::read(13).unwrap(), Code::PoolFull);
        for code in [-1, 14, 99] {
            let e = Code::read(code).unwrap_err();
            assert!(
                e.to_string()
                    .contains(&format!("purchase.lua answered {code}")),
                "{e}"
            );
        }
    }
}
