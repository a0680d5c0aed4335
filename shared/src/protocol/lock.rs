//! The per-sale admin lock and its fencing token: a lease in Redis (`lua/lock_acquire.lua`)
//! that a watchdog renews every `ttl / 3`, and a token the database checks in the holder's own
//! write ([`fenced_update`]), so a holder whose lease ran out while it was paused is refused
//! instead of writing behind the next one. Tokens are floored by the database's highest, so a
//! counter Redis lost never makes them go backwards. The lock is re-entrant for its holder
//! ([`LockGuard::reenter`]). docs/invariants.md, "The lock and its fencing token", tells why
//! each of these holds.

use crate::domain::activity;
use crate::store::conn::{Redis, StoreError};
use crate::store::scripts::{self, codes};
use sqlx::{PgConnection, PgPool};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use uuid::Uuid;

codes! {
    /// What `lua/lock_acquire.lua` answers instead of a fencing token (>= 1).
    pub enum AcquireCode of "lock_acquire.lua" {
        /// Someone else holds the lock (or a re-entry's owner no longer does).
        Busy = 0,
    }
}

codes! {
    /// What `lua/lock_renew.lua` answered.
    pub enum RenewCode of "lock_renew.lua" {
        /// Not the owner any more: stop work.
        Lost = 0,
        Renewed = 1,
    }
}

codes! {
    /// What `lua/lock_release.lua` answered.
    pub enum ReleaseCode of "lock_release.lua" {
        NotOwner = 0,
        /// The lock is gone.
        Released = 1,
        /// A nested hold went back; the owner still holds the lock.
        HoldGivenBack = 2,
    }
}

codes! {
    /// What `lua/lock_stamp.lua` answered.
    pub enum StampCode of "lock_stamp.lua" {
        /// A newer holder's stamp is there.
        NewerHolder = 0,
        Stamped = 1,
    }
}

/// A token `lua/lock_acquire.lua` answered: `None` when it answered [`AcquireCode::Busy`].
fn token(answer: i64) -> Result<Option<i64>, StoreError> {
    if answer > 0 {
        return Ok(Some(answer));
    }
    AcquireCode::read(answer).map(|_| None)
}

/// Why the lock could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Someone else held the lock for the whole wait. HTTP: 409 `busy`.
    #[error("the activity is being changed by someone else; retry shortly")]
    Busy,
    /// The lease ran out (or was taken over) before the work finished; the work was abandoned
    /// or refused by an owner check. HTTP: 409 `stale_token`.
    #[error("the lock's lease was lost before the change was written; retry")]
    Lost,
    /// The database has accepted a token at least as high as ours. HTTP: 409 `stale_token`.
    #[error("fencing token {token} is not newer than {seen}, which the database has accepted")]
    StaleToken { token: i64, seen: i64 },
    /// Redis was out of reach. HTTP: 503.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The database failed. HTTP: 503 or 500.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// A held lock (the outermost hold). Release it with [`LockGuard::release`]; dropping it stops
/// the watchdog and releases on a best-effort background task.
pub struct LockGuard {
    /// This holder's identity in Redis (a fresh UUID v4 per outermost acquisition); scripts
    /// that change an activity under the lock (`adjust.lua`, `fix_stock.lua`) take it as their
    /// owner check, which nested holds pass too.
    pub owner: String,
    /// The fencing token; pass it to [`fenced_update`].
    pub token: i64,
    pub activity_id: i64,
    ttl: Duration,
    redis: Redis,
    acquired_at: Instant,
    /// Milliseconds after `acquired_at` until which the lease is known to be valid.
    valid_until_ms: Arc<AtomicU64>,
    lost: Arc<AtomicBool>,
    lost_rx: watch::Receiver<bool>,
    watchdog: Option<JoinHandle<()>>,
    released: bool,
    /// The lock's key and, in a bucketed sale, its stamp in every other bucket: renewed and
    /// released together.
    held: Held,
}

/// The keys a guard renews and releases: the lock first, then its stamps.
type Held = Arc<Mutex<Vec<String>>>;

/// Takes the activity's lock, retrying with jittered backoff for up to `wait`.
///
/// The token is floored by the database's `last_fence_token` (0 when the row does not exist
/// yet). A watchdog renews the lease every `ttl / 3` until the guard is released or dropped.
#[tracing::instrument(skip(redis, pool))]
pub async fn acquire(
    redis: &Redis,
    pool: &PgPool,
    activity_id: i64,
    ttl: Duration,
    wait: Duration,
) -> Result<LockGuard, LockError> {
    let floor: i64 = activity::fence_token(pool, activity_id).await?.unwrap_or(0);
    let owner = Uuid::new_v4().to_string();
    let keys = redis.keys(activity_id);
    let ttl_ms = ttl.as_millis().max(1) as u64;
    let started = Instant::now();
    let token = loop {
        let acquired_at = Instant::now();
        let mut inv = scripts::LOCK_ACQUIRE.prepare_invoke();
        inv.key(&keys.lock)
            .key(&keys.fence)
            .arg(&owner)
            .arg(ttl_ms)
            .arg(floor);
        if let Some(token) = token(redis.script(&inv).await?)? {
            break (token, acquired_at);
        }
        let waited = started.elapsed();
        if waited >= wait {
            tracing::info!(activity_id, "lock busy");
            return Err(LockError::Busy);
        }
        tokio::time::sleep(jitter(20, 50).min(wait - waited)).await;
    };
    let (token, acquired_at) = token;
    tracing::info!(activity_id, token, "lock acquired");
    let held: Held = Arc::new(Mutex::new(vec![keys.lock.clone()]));

    let valid_until_ms = Arc::new(AtomicU64::new(ttl_ms));
    let lost = Arc::new(AtomicBool::new(false));
    let (lost_tx, lost_rx) = watch::channel(false);
    let watchdog = tokio::spawn(watchdog(
        redis.clone(),
        held.clone(),
        owner.clone(),
        ttl,
        acquired_at,
        valid_until_ms.clone(),
        lost.clone(),
        lost_tx,
    ));
    let guard = LockGuard {
        owner,
        token,
        activity_id,
        ttl,
        redis: redis.clone(),
        acquired_at,
        valid_until_ms,
        lost,
        lost_rx,
        watchdog: Some(watchdog),
        released: false,
        held,
    };
    // Under the lock the bucket count cannot change: stamp the other buckets before the
    // holder reads the database, so whatever it then writes there is checked against it.
    let buckets = activity::bucket_count(pool, activity_id).await?;
    guard.cover(buckets).await?;
    Ok(guard)
}

/// A random pause in `[lo, hi)` ms, so that competing admins do not retry in lockstep.
fn jitter(lo: u64, hi: u64) -> Duration {
    let r = (Uuid::new_v4().as_u128() as u64) % (hi - lo).max(1);
    Duration::from_millis(lo + r)
}

#[allow(clippy::too_many_arguments)]
async fn watchdog(
    redis: Redis,
    held: Held,
    owner: String,
    ttl: Duration,
    acquired_at: Instant,
    valid_until_ms: Arc<AtomicU64>,
    lost: Arc<AtomicBool>,
    lost_tx: watch::Sender<bool>,
) {
    let period = (ttl / 3).max(Duration::from_millis(1));
    let ttl_ms = ttl.as_millis().max(1) as u64;
    let lock_key = held.lock().unwrap_or_else(|p| p.into_inner())[0].clone();
    let mark_lost = |why: &str| {
        tracing::warn!(lock = %lock_key, why, "lock lost");
        lost.store(true, Ordering::SeqCst);
        let _ = lost_tx.send(true);
    };
    loop {
        tokio::time::sleep(period).await;
        let sent = Instant::now();
        let keys = held.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match renew_all(&redis, &keys, &owner, ttl_ms).await {
            Ok(RenewCode::Renewed) => {
                // The lease runs from when we *sent* the renewal, not when it was answered.
                // `fetch_max`: a re-entry sent later may already have extended it further.
                let until = (sent - acquired_at).as_millis() as u64 + ttl_ms;
                valid_until_ms.fetch_max(until, Ordering::SeqCst);
            }
            Ok(RenewCode::Lost) => return mark_lost("renewal refused: no longer the owner"),
            Err(StoreError::Redis(e)) if e.kind() == redis::ErrorKind::Parse => {
                tracing::error!(error = %e, "lock_renew.lua answered a code it does not have");
                return mark_lost("renewal answered an unknown code");
            }
            Err(e) => {
                // Keep trying while the lease we last confirmed still runs; give up before
                // it could have expired unnoticed.
                let valid_until =
                    acquired_at + Duration::from_millis(valid_until_ms.load(Ordering::SeqCst));
                if Instant::now() + period >= valid_until {
                    tracing::warn!(error = %e, "lock renewal failed");
                    return mark_lost("renewal failed until the lease ran out");
                }
                tracing::warn!(error = %e, "lock renewal failed; retrying");
            }
        }
    }
}

/// Renews the lock and its stamps: `Renewed` when every one is still this owner's.
async fn renew_all(
    redis: &Redis,
    keys: &[String],
    owner: &str,
    ttl_ms: u64,
) -> Result<RenewCode, StoreError> {
    for key in keys {
        let mut inv = scripts::LOCK_RENEW.prepare_invoke();
        inv.key(key).arg(owner).arg(ttl_ms);
        let answer = RenewCode::read(redis.script::<i64>(&inv).await?)?;
        if answer != RenewCode::Renewed {
            return Ok(answer);
        }
    }
    Ok(RenewCode::Renewed)
}

impl LockGuard {
    /// Stamps this holder into every bucket of the sale's layout with `buckets` buckets but
    /// bucket 0, whose lock this is (`lua/lock_stamp.lua`); the stamps are renewed and
    /// released with the lock. A loader stamps the layout the database names; an admin
    /// changing the bucket count stamps the new layout before it writes there.
    /// [`LockError::Lost`]: a newer holder stamped a bucket first.
    pub async fn cover(&self, buckets: u32) -> Result<(), LockError> {
        let ttl_ms = self.ttl.as_millis().max(1) as u64;
        let mut stamped = false;
        for bucket in crate::store::keys::Bucket::all(self.activity_id, buckets).skip(1) {
            let stamp = self.redis.bucket_keys(bucket).lock;
            if self
                .held
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&stamp)
            {
                continue;
            }
            let mut inv = scripts::LOCK_STAMP.prepare_invoke();
            inv.key(&stamp).arg(&self.owner).arg(ttl_ms).arg(self.token);
            match StampCode::read(self.redis.script::<i64>(&inv).await?)? {
                StampCode::Stamped => self
                    .held
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(stamp),
                StampCode::NewerHolder => return Err(LockError::Lost),
            }
            stamped = true;
        }
        // A holder whose lease ran out before it stamped (a pause) may have stamped buckets
        // that nobody holds now: it stops here, before it reads the database, unless the lock
        // in bucket 0 is still its own.
        if stamped {
            let lock = self.held.lock().unwrap_or_else(|p| p.into_inner())[0].clone();
            let mut inv = scripts::LOCK_RENEW.prepare_invoke();
            inv.key(&lock).arg(&self.owner).arg(ttl_ms);
            if RenewCode::read(self.redis.script::<i64>(&inv).await?)? != RenewCode::Renewed {
                return Err(LockError::Lost);
            }
        }
        Ok(())
    }

    /// True once the watchdog saw the lease lost, or the last confirmed lease has run out
    /// (e.g. nothing renewed it because the process was paused).
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
            || self.acquired_at.elapsed()
                > Duration::from_millis(self.valid_until_ms.load(Ordering::SeqCst))
    }

    /// The lease length this guard renews to.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Runs `work`, abandoning it with [`LockError::Lost`] as soon as the watchdog reports the
    /// lease lost. Abandoning drops the future at its current await point: an open sqlx
    /// transaction rolls back; a Redis script already sent may still have run (each script
    /// is atomic, so the activity is in one of the in-between states reconcile repairs).
    pub async fn run<F, T>(&self, work: F) -> Result<T, LockError>
    where
        F: std::future::Future<Output = T>,
    {
        let mut rx = self.lost_rx.clone();
        let lost = async move {
            // A closed channel means the watchdog was stopped, not that the lease was lost.
            if rx.wait_for(|lost| *lost).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            biased;
            _ = lost => Err(LockError::Lost),
            out = work => Ok(out),
        }
    }

    /// Stops renewing the lease, as if this process had been paused: nothing extends it any
    /// more and it expires `ttl` after the last renewal. Tests use it to model a paused holder.
    pub fn stop_watchdog(&mut self) {
        if let Some(handle) = self.watchdog.take() {
            handle.abort();
        }
    }

    /// Adds a hold to this lock for the same holder: the returned guard has the same owner
    /// and the same token, lives on this guard's lease and watchdog, and refreshes the lease.
    /// [`LockError::Lost`] when the lease already ran out (nothing changed in Redis).
    pub async fn reenter(&self) -> Result<NestedGuard<'_>, LockError> {
        let keys = self.redis.keys(self.activity_id);
        let ttl_ms = self.ttl.as_millis().max(1) as u64;
        let sent = Instant::now();
        let mut inv = scripts::LOCK_ACQUIRE.prepare_invoke();
        // The floor is not read by a re-entry: it issues no token.
        inv.key(&keys.lock)
            .key(&keys.fence)
            .arg(&self.owner)
            .arg(ttl_ms)
            .arg(0)
            .arg("reenter");
        let token = token(self.redis.script(&inv).await?)?;
        if token.is_none() {
            tracing::warn!(
                activity_id = self.activity_id,
                "re-entry refused: lease lost"
            );
            return Err(LockError::Lost);
        }
        debug_assert_eq!(
            token,
            Some(self.token),
            "a re-entry answers the outermost token"
        );
        let until = (sent - self.acquired_at).as_millis() as u64 + ttl_ms;
        self.valid_until_ms.fetch_max(until, Ordering::SeqCst);
        Ok(NestedGuard { outer: self })
    }

    /// Stops the watchdog and deletes the lock if we still own it, nested holds and all
    /// (owner-checked in `lua/lock_release.lua`, so a holder whose lease expired cannot touch
    /// the next holder's lock). Returns whether the lock was ours to release.
    pub async fn release(mut self) -> Result<bool, LockError> {
        self.stop_watchdog();
        self.released = true;
        release_stamps(&self.redis, &self.held, &self.owner).await?;
        Ok(release(&self.redis, self.activity_id, &self.owner, Release::All).await?)
    }
}

/// A hold added by [`LockGuard::reenter`]. It derefs to the outer guard, whose owner, token,
/// [`LockGuard::run`] and [`LockGuard::is_lost`] it shares, so helpers that take a
/// `&LockGuard` take it too. Release it with [`NestedGuard::release`]; dropped unreleased,
/// its hold goes with the outer guard's release, which ends the lock whatever its count.
pub struct NestedGuard<'a> {
    outer: &'a LockGuard,
}

impl NestedGuard<'_> {
    /// Gives back this hold. The lock stays with the outer guard (`lua/lock_release.lua`
    /// never gives back the last hold this way). Returns whether the hold was ours: false
    /// when the lease ran out and the lock is gone or someone else's (nothing changed). On an
    /// error the hold is left to the outer guard's release.
    pub async fn release(self) -> Result<bool, LockError> {
        let outer = self.outer;
        Ok(release(&outer.redis, outer.activity_id, &outer.owner, Release::One).await?)
    }
}

impl std::ops::Deref for NestedGuard<'_> {
    type Target = LockGuard;

    fn deref(&self) -> &LockGuard {
        self.outer
    }
}

/// Releases the activity's lock, nested holds and all, only if `owner` holds it. Returns
/// whether `owner` held it.
pub async fn release_owned(
    redis: &Redis,
    activity_id: i64,
    owner: &str,
) -> Result<bool, StoreError> {
    release(redis, activity_id, owner, Release::All).await
}

/// What a release gives back.
#[derive(Clone, Copy, Debug)]
enum Release {
    /// The outermost holder is done: the lock goes.
    All,
    /// One nested hold, never the last.
    One,
}

async fn release(
    redis: &Redis,
    activity_id: i64,
    owner: &str,
    what: Release,
) -> Result<bool, StoreError> {
    let keys = redis.keys(activity_id);
    let mut inv = scripts::LOCK_RELEASE.prepare_invoke();
    inv.key(&keys.lock).arg(owner).arg(match what {
        Release::All => "all",
        Release::One => "one",
    });
    Ok(ReleaseCode::read(redis.script::<i64>(&inv).await?)? != ReleaseCode::NotOwner)
}

/// Deletes this owner's stamps of the lock in the other buckets (owner-checked like the lock).
async fn release_stamps(redis: &Redis, held: &Held, owner: &str) -> Result<(), StoreError> {
    let stamps: Vec<String> = held.lock().unwrap_or_else(|p| p.into_inner())[1..].to_vec();
    for stamp in stamps {
        let mut inv = scripts::LOCK_RELEASE.prepare_invoke();
        inv.key(&stamp).arg(owner).arg("all");
        ReleaseCode::read(redis.script::<i64>(&inv).await?)?;
    }
    Ok(())
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.stop_watchdog();
        if self.released {
            return;
        }
        // Drop cannot await: release on a background task if a runtime is around; otherwise
        // the lease simply expires after `ttl`.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let redis = self.redis.clone();
            let owner = std::mem::take(&mut self.owner);
            let activity_id = self.activity_id;
            let held = self.held.clone();
            rt.spawn(async move {
                if let Err(e) = release_stamps(&redis, &held, &owner).await {
                    tracing::warn!(activity_id, error = %e, "best-effort stamp release failed");
                }
                if let Err(e) = release(&redis, activity_id, &owner, Release::All).await {
                    tracing::warn!(activity_id, error = %e, "best-effort lock release failed");
                }
            });
        }
    }
}

/// Records `token` as the activity's newest fencing token, inside the transaction `conn`
/// that makes the change, so the change commits only if no newer holder has written.
///
/// Refused with [`LockError::StaleToken`] when the row has already accepted a token `>=` ours;
/// [`sqlx::Error::RowNotFound`] when the activity does not exist. The update also takes the
/// row lock, so a concurrent writer with a higher token waits for this transaction and then
/// sees its result.
pub async fn fenced_update(
    conn: &mut PgConnection,
    activity_id: i64,
    token: i64,
) -> Result<(), LockError> {
    let updated = sqlx::query!(
        "update activities set last_fence_token = $2 where id = $1 and last_fence_token < $2",
        activity_id,
        token
    )
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if updated == 1 {
        return Ok(());
    }
    let seen = activity::fence_token(&mut *conn, activity_id).await?;
    match seen {
        Some(seen) => {
            tracing::warn!(activity_id, token, seen, "stale fencing token refused");
            Err(LockError::StaleToken { token, seen })
        }
        None => Err(LockError::Db(sqlx::Error::RowNotFound)),
    }
}
