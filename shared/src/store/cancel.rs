//! `lua/cancel_begin.lua`: a cancel attempt announced in the ledger before the database
//! commits it (docs/invariants.md, "Cancel"). The rest of the cancel is
//! [`crate::protocol::cancel`]; its Redis finish is [`super::ledger::cancel_finish`].

use super::conn::{Redis, StoreError};
use super::keys::Bucket;
use super::scripts::{self, codes};
use uuid::Uuid;

codes! {
    /// What `cancel_begin.lua` answered.
    pub enum CancelBegin of "cancel_begin.lua" {
        /// Another entry of the user is in flight; retry shortly.
        Busy = 0,
        /// The cancel is announced in the ledger: commit it in the database, then finish it.
        Recorded = 1,
        /// The activity is not in Redis (sale long over): only the database changes.
        NotLoaded = 2,
        /// The user's field in `users` does not name the order's request: the order holds
        /// nothing in Redis any more (another attempt cancelled it and finished), or Redis
        /// lost the field (the row, read now, tells). Nothing was written.
        NotHeld = 3,
    }
}

/// One cancel attempt, as `lua/cancel_begin.lua` announces it.
#[derive(Clone, Copy, Debug)]
pub struct CancelAttempt<'a> {
    pub activity_id: i64,
    /// The sale's bucket count: with the user it names the home bucket the cancel runs in.
    pub buckets: u32,
    pub user_id: &'a str,
    pub order_id: i64,
    /// The order's request id: its own reservation entry may give way to the cancel.
    pub request_id: Uuid,
    pub quantity: i64,
    /// This attempt's id; the order row records it when the attempt commits.
    pub cancel_id: Uuid,
}

impl CancelAttempt<'_> {
    /// The bucket holding the user's quota and ledger entries.
    pub fn home(&self) -> Bucket {
        Bucket::home(self.activity_id, self.buckets, self.user_id)
    }
}

/// Announces a cancel attempt in the ledger (a `c` entry). Returns what
/// the script answered and the sale's load epoch, which the database commit must still find.
pub async fn begin(
    redis: &Redis,
    attempt: &CancelAttempt<'_>,
    now_ms: i64,
) -> Result<(CancelBegin, i64), StoreError> {
    let k = redis.bucket_keys(attempt.home());
    let mut inv = scripts::CANCEL_BEGIN.prepare_invoke();
    inv.key(&k.meta)
        .key(&k.ledger)
        .key(&k.users)
        .arg(attempt.user_id)
        .arg(attempt.cancel_id.to_string())
        .arg(attempt.quantity)
        .arg(now_ms)
        .arg(attempt.order_id)
        .arg(attempt.request_id.to_string());
    let (code, epoch): (i64, i64) = redis.script(&inv).await?;
    Ok((CancelBegin::read(code)?, epoch))
}
