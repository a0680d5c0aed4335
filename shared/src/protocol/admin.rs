//! An admin's changes of a sale, under its fenced lock ([`crate::protocol::lock`]):
//! [`create`] inserts a sale (no lock: nobody can hold the lock of an id that does not exist)
//! and loads it when it starts within the preheat lead; [`change`] is a merge update. Inside
//! one transaction the fence runs first (the token recorded, the row locked); then a
//! **lower** takes from Redis before the commit (`lua/adjust.lua` refuses below what is sold
//! or reserved) and a **raise** (or a change of the meta alone) commits first, so Redis never
//! offers units the database lacks. A lower whose commit fails is reverted only when the row
//! proves it did not commit. A new bucket count unloads the old layout before the commit.
//! docs/invariants.md, "Admin".

use crate::context::Context;
use crate::domain::activity::{self, Activity};
use crate::domain::draw;
use crate::domain::order;
use crate::domain::settings::{ActivityPatch, Admission, Invalid, NewActivity, Settings};
use crate::infra::pause;
use crate::protocol::load;
use crate::protocol::lock::{self, LockError, LockGuard};
use crate::store::buckets;
use crate::store::conn::StoreError;
use crate::store::keys::Bucket;
use crate::store::meta::{self, ActivityMeta, Adjust};
use chrono::Utc;
use std::time::{Duration, Instant};

/// Why a change was refused, or could not finish.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// A field breaks a rule of the settings, or the patch changes nothing.
    #[error(transparent)]
    Invalid(#[from] Invalid),
    #[error("activity {0} does not exist")]
    NotFound(i64),
    /// The new total is below what is sold or reserved (or held by a draw's winners).
    #[error("totalStock {0} is below what is already sold or reserved")]
    BelowSold(i64),
    /// A rule of what may change once the sale started (admission, price, buckets).
    #[error("{0}")]
    Conflict(String),
    /// The lock is held, its lease ran out, or a newer holder wrote.
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// How long a create or a change gives the load it makes at once (a draw sale's pool rebuild
/// stops there): with the change itself, well inside the admin's Lambda Timeout. What is left,
/// preheat and reconcile finish.
const LOAD_BUDGET: Duration = Duration::from_secs(5);

/// Validates and stores a new sale (no lock: see the module doc), then loads it into Redis
/// when it starts within the preheat lead. A failed load is logged, not answered: the database
/// holds the sale, and preheat loads it on its next run.
pub async fn create(ctx: &Context, new: &NewActivity) -> Result<Activity, ChangeError> {
    let created = activity::insert(&ctx.pool, &new.settings()?).await?;
    if !created.due_for_preheat(Utc::now(), ctx.config.preheat_lead) {
        return Ok(created);
    }
    let deadline = Instant::now() + LOAD_BUDGET;
    match load::load_under_lock(&ctx.redis, &ctx.pool, &ctx.config, created.id, deadline).await {
        Ok((outcome, row)) => {
            tracing::info!(activity_id = row.id, ?outcome, "new sale loaded into redis");
            Ok(row)
        }
        Err(e) => {
            tracing::warn!(activity_id = created.id, error = %e, "new sale not loaded; preheat will");
            Ok(created)
        }
    }
}

/// A merge update of activity `id` under its fenced lock: acquire (409 `busy` after
/// `lock_wait`), [`change_with_guard`] under the watchdog, release.
#[tracing::instrument(skip(ctx, patch))]
pub async fn change(
    ctx: &Context,
    id: i64,
    patch: &ActivityPatch,
) -> Result<Activity, ChangeError> {
    if patch.is_empty() {
        return Err(Invalid(
            "the body must change at least one of title, totalStock, perOrderLimit, startAt, endAt, buckets, admission, drawWindowMs, perUserRatePerSec, priceMinor, currency, maxEntrants"
                .into(),
        )
        .into());
    }
    // Refuse unknown ids before creating lock keys for them.
    if activity::get(&ctx.pool, id).await?.is_none() {
        return Err(ChangeError::NotFound(id));
    }
    let guard = lock::acquire(
        &ctx.redis,
        &ctx.pool,
        id,
        ctx.config.lock_ttl,
        ctx.config.lock_wait,
    )
    .await?;
    let result = match guard.run(change_with_guard(ctx, &guard, patch)).await {
        Ok(result) => result,
        Err(lost) => committed_under(ctx, &guard)
            .await
            .and_then(|row| row.ok_or_else(|| lost.into())),
    };
    if let Err(e) = guard.release().await {
        // The lease expires by itself; the change (if any) is already fenced.
        tracing::warn!(activity_id = id, error = %e, "lock release failed");
    }
    result
}

/// After the work was abandoned (lease lost): did its DB transaction commit anyway? The row
/// holding our token proves it did (tokens are unique per holder), and then the DB, the system
/// of record, has the change: answer it rather than a misleading 409 (Redis catches up through
/// reconcile and preheat).
async fn committed_under(
    ctx: &Context,
    guard: &LockGuard,
) -> Result<Option<Activity>, ChangeError> {
    let row = activity::get(&ctx.pool, guard.activity_id).await?;
    Ok(row.filter(|a| a.last_fence_token == guard.token))
}

/// What `adjust.lua` added to each bucket (negative: took), for a revert.
type Plan = Vec<(Bucket, i64)>;

/// `adjust.lua` for the holder of `guard`, in every bucket of a sale with `buckets` buckets:
/// the new meta everywhere, and the stock `delta` (a raise, or any change of a sale with one
/// bucket) split evenly over them.
async fn adjust(
    ctx: &Context,
    guard: &LockGuard,
    buckets: u32,
    delta: i64,
    meta: &ActivityMeta,
    change: &str,
) -> Result<(Adjust, Plan), ChangeError> {
    let (redis, owner, id) = (&ctx.redis, &guard.owner, guard.activity_id);
    let shares = buckets::split(delta, buckets);
    let mut plan = Plan::new();
    for (bucket, share) in Bucket::all(id, buckets).zip(shares) {
        match meta::adjust(redis, bucket, owner, share, meta, change).await? {
            Adjust::Applied => plan.push((bucket, share)),
            other => return Ok((other, plan)),
        }
    }
    Ok((Adjust::Applied, plan))
}

/// A lower of a bucketed sale, before its commit: takes `units` from the buckets that hold the
/// most, re-reading a bucket that refused (its buyers took units meanwhile), up to three
/// passes. The buckets keep the meta `current` (the new one is written after the commit), so
/// a lower refused or not committed leaves no trace of its other fields. When the buckets
/// together hold less than it takes, what it took is put back and it is refused whole. A
/// sale not loaded in every bucket is not touched (`NotLoaded`): the commit is enough, and
/// the next load reads it.
async fn take_from_buckets(
    ctx: &Context,
    guard: &LockGuard,
    buckets: u32,
    units: i64,
    current: &ActivityMeta,
    change: &str,
) -> Result<(Adjust, Plan), ChangeError> {
    let (redis, owner, id) = (&ctx.redis, &guard.owner, guard.activity_id);
    if !buckets::all_loaded(redis, id, buckets).await? {
        return Ok((Adjust::NotLoaded, Plan::new()));
    }
    let mut plan = Plan::new();
    let mut left = units;
    for pass in 0..3 {
        if left == 0 {
            break;
        }
        let stocks = buckets::stocks(redis, id, buckets).await?;
        let mut by_stock: Vec<(Bucket, i64)> = Bucket::all(id, buckets)
            .zip(stocks)
            .map(|(b, s)| (b, s.unwrap_or(0)))
            .collect();
        by_stock.sort_by_key(|(_, s)| -s);
        for (bucket, stock) in by_stock {
            let take = stock.min(left);
            if take <= 0 {
                continue;
            }
            let step = format!("{change}-{pass}");
            match meta::adjust(redis, bucket, owner, -take, current, &step).await? {
                Adjust::Applied => {
                    left -= take;
                    plan.push((bucket, -take));
                }
                Adjust::WouldGoNegative { .. } => {}
                other => return Ok((other, plan)),
            }
        }
    }
    if left > 0 {
        let held = buckets::stock(redis, id, buckets).await?.unwrap_or(0);
        revert(ctx, guard, &plan, current, &format!("{change}-undo")).await;
        return Ok((Adjust::WouldGoNegative { stock: held }, Plan::new()));
    }
    Ok((Adjust::Applied, plan))
}

/// Gives every bucket of `plan` back what the plan took (or takes back what it added).
async fn revert(ctx: &Context, guard: &LockGuard, plan: &Plan, meta: &ActivityMeta, change: &str) {
    for (i, (bucket, added)) in plan.iter().enumerate() {
        if *added == 0 {
            continue;
        }
        let step = format!("{change}-{i}");
        let reverted = meta::adjust(&ctx.redis, *bucket, &guard.owner, -added, meta, &step).await;
        if !matches!(reverted, Ok(Adjust::Applied)) {
            tracing::error!(
                activity_id = guard.activity_id,
                bucket = bucket.index,
                added,
                ?reverted,
                "could not give Redis its units back; reconcile will repair"
            );
        }
    }
}

/// One merge update, computed from the row as the fenced transaction read it.
struct Update {
    before: Activity,
    after: Settings,
    /// Units added (positive) or taken away (negative).
    delta: i64,
    version: i64,
}

impl Update {
    /// `held`: units of a draw's recorded winners without an order yet, which the remaining
    /// stock still counts but nobody else may be sold.
    fn new(before: Activity, held: i64, patch: &ActivityPatch) -> Result<Self, ChangeError> {
        let after = patch.merged(&before.settings())?;
        let delta = after.total_stock - before.total_stock;
        if before.remaining_stock - held + delta < 0 {
            return Err(ChangeError::BelowSold(after.total_stock));
        }
        let version = before.config_version + 1;
        Ok(Self {
            before,
            after,
            delta,
            version,
        })
    }

    /// The meta Redis gets with the change.
    fn new_meta(&self, ctx: &Context) -> ActivityMeta {
        ActivityMeta::of(&self.after, self.version, ctx.config.expiry_buffer)
    }

    /// The meta Redis had before it, to give Redis back what a failed lower took.
    fn old_meta(&self, ctx: &Context) -> ActivityMeta {
        let before = &self.before;
        ActivityMeta::of(
            &before.settings(),
            before.config_version,
            ctx.config.expiry_buffer,
        )
    }
}

/// The body of an update, for a caller that already holds the lock. Public so tests can play
/// a holder that was paused past its lease: the fencing check in the DB must refuse it.
#[tracing::instrument(skip(ctx, guard, patch), fields(activity_id = guard.activity_id, token = guard.token))]
pub async fn change_with_guard(
    ctx: &Context,
    guard: &LockGuard,
    patch: &ActivityPatch,
) -> Result<Activity, ChangeError> {
    let id = guard.activity_id;
    let mut tx = ctx.pool.begin().await?;
    // Fence first: records the token and locks the row, before Redis is touched.
    match lock::fenced_update(&mut tx, id, guard.token).await {
        Err(LockError::Db(sqlx::Error::RowNotFound)) => return Err(ChangeError::NotFound(id)),
        other => other?,
    }
    let current = activity::get(&mut *tx, id)
        .await?
        .ok_or(sqlx::Error::RowNotFound)?;
    // Read under the row's lock: no winner's order commits its stock update meanwhile.
    let held = draw::held_units(&mut *tx, id).await?;
    let change = Update::new(current, held, patch)?;
    admission_unchanged_once_started(&change)?;
    price_unchanged_once_started(&change)?;
    price_unchanged_once_bought(ctx, &mut tx, &change).await?;
    if change.after.buckets != change.before.bucket_count() {
        relayout(ctx, guard, &mut tx, &change).await?;
        let updated =
            activity::apply_change(&mut tx, id, &change.after, change.delta, change.version)
                .await?;
        tx.commit().await?;
        return loaded_if_due(ctx, guard, Adjust::NotLoaded, updated).await;
    }
    if change.delta < 0 {
        lower(ctx, guard, tx, change).await
    } else {
        raise(ctx, guard, tx, change).await
    }
}

/// How long before its start a sale's admission is already fixed: the change reaches Redis
/// after its commit, and the clocks of this function and of Redis differ a little.
const ADMISSION_FIXED_BEFORE_START: chrono::Duration = chrono::Duration::seconds(10);

/// A sale's admission, its draw window and (for a draw) its start change only until shortly
/// before the start ([`ADMISSION_FIXED_BEFORE_START`]): the pool of a running draw was
/// collected under them.
fn admission_unchanged_once_started(change: &Update) -> Result<(), ChangeError> {
    let (before, after) = (&change.before.settings(), &change.after);
    let now = Utc::now() + ADMISSION_FIXED_BEFORE_START;
    if now < before.start_at && now < after.start_at {
        return Ok(());
    }
    let draw = before.admission == Admission::Draw;
    if after.admission != before.admission
        || after.draw_window_ms != before.draw_window_ms
        || (draw && after.start_at != before.start_at)
    {
        return Err(ChangeError::Conflict(
            "admission, drawWindowMs and a draw sale's startAt can change only until 10 s before the sale starts"
                .into(),
        ));
    }
    Ok(())
}

/// A sale's price changes only until shortly before its start
/// ([`ADMISSION_FIXED_BEFORE_START`]): a buyer pays the price the sale opened with, and a
/// payment started keeps its amount.
fn price_unchanged_once_started(change: &Update) -> Result<(), ChangeError> {
    let (before, after) = (&change.before, &change.after);
    let now = Utc::now() + ADMISSION_FIXED_BEFORE_START;
    if (now < before.start_at && now < after.start_at)
        || (after.price_minor == before.price_minor && after.currency == before.currency)
    {
        return Ok(());
    }
    Err(ChangeError::Conflict(
        "priceMinor and currency can change only until 10 s before the sale starts".into(),
    ))
}

/// A sale whose start was moved back into the future after it opened keeps its price once
/// anyone bought: an order in the database, or a reservation Redis holds that no order has yet
/// (its stock below the database's remaining). An order's price is written from the sale's
/// when the order is confirmed, which must be the price its buyer pressed buy at. Read under
/// the sale's row lock (no order commits meanwhile) and its admin lock (no load or adjust);
/// a reservation made meanwhile saw the sale open, so it was made at this same price.
async fn price_unchanged_once_bought(
    ctx: &Context,
    tx: &mut sqlx::PgConnection,
    change: &Update,
) -> Result<(), ChangeError> {
    let (before, after) = (&change.before, &change.after);
    if after.price_minor == before.price_minor && after.currency == before.currency {
        return Ok(());
    }
    let reserved = match buckets::stock(&ctx.redis, before.id, before.bucket_count()).await? {
        Some(stock) => stock < before.remaining_stock,
        None => false,
    };
    if reserved || order::exists_for(&mut *tx, before.id).await? {
        return Err(ChangeError::Conflict(
            "priceMinor and currency cannot change once the sale has an order or a reservation"
                .into(),
        ));
    }
    Ok(())
}

/// A new bucket count: only before the sale starts (by the window before and after the
/// change) and while it has no order, since a user's home bucket, which holds their quota, is
/// a function of the count. Every bucket of the old layout is unloaded first (no purchase can
/// run before the start anyway); the caller commits the new count and loads the new layout
/// from scratch, so Redis never holds buckets of a layout the database does not name.
async fn relayout(
    ctx: &Context,
    guard: &LockGuard,
    tx: &mut sqlx::PgConnection,
    change: &Update,
) -> Result<(), ChangeError> {
    let now = Utc::now();
    if now >= change.before.start_at || now >= change.after.start_at {
        return Err(ChangeError::Conflict(
            "buckets can change only before the sale starts".into(),
        ));
    }
    if order::exists_for(&mut *tx, guard.activity_id).await? {
        return Err(ChangeError::Conflict(
            "buckets cannot change once the sale has an order".into(),
        ));
    }
    let old = change.before.bucket_count();
    if !load::unload_layout(&ctx.redis, guard, old).await? {
        return Err(LockError::Lost.into());
    }
    tracing::info!(
        activity_id = guard.activity_id,
        from = old,
        to = change.after.buckets,
        "bucket count changed; the old layout is unloaded"
    );
    Ok(())
}

/// Lowering: Redis first, so units already reserved there are never taken back.
async fn lower(
    ctx: &Context,
    guard: &LockGuard,
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    change: Update,
) -> Result<Activity, ChangeError> {
    let (id, delta) = (guard.activity_id, change.delta);
    let buckets = change.before.bucket_count();
    let change_id = guard.token.to_string();
    // The units only, under the meta Redis holds: the new meta and version follow the commit,
    // so Redis never holds a version the database did not commit (a version that never
    // committed is the next change's too, and preheat would take this one's fields for its).
    let current = change.old_meta(ctx);
    let (adjusted, plan) = if buckets > 1 {
        take_from_buckets(ctx, guard, buckets, -delta, &current, &change_id).await?
    } else {
        adjust(ctx, guard, 1, delta, &current, &change_id).await?
    };
    match adjusted {
        Adjust::Applied | Adjust::NotLoaded => {}
        Adjust::NotOwner => return Err(LockError::Lost.into()),
        Adjust::WouldGoNegative { stock } => {
            tracing::info!(
                activity_id = id,
                stock,
                delta,
                "stock lower refused by Redis"
            );
            return Err(ChangeError::BelowSold(change.after.total_stock));
        }
    }
    // Redis holds the lowered stock under the row's meta and version, the database not yet the
    // lower: a preheat now finds the sale current and leaves it (it never touches a loaded
    // stock).
    pause::point("admin.lower.before_commit", id).await;
    let committed = async {
        let updated =
            activity::apply_change(&mut tx, id, &change.after, delta, change.version).await?;
        if pause::fail("admin.commit.unknown", id) {
            // The connection dropped with COMMIT unsent: the change rolls back, and the
            // read-back below cannot tell.
            drop(tx);
            return Err(sqlx::Error::Io(std::io::ErrorKind::ConnectionReset.into()));
        }
        tx.commit().await?;
        if pause::fail("admin.commit.lost_reply", id) {
            // Committed, but the connection dropped before COMMIT's answer arrived.
            return Err(sqlx::Error::Io(std::io::ErrorKind::ConnectionReset.into()));
        }
        Ok::<_, sqlx::Error>(updated)
    }
    .await;
    match committed {
        Ok(updated) => {
            committed_meta(ctx, guard, &change, adjusted).await;
            loaded_if_due(ctx, guard, adjusted, updated).await
        }
        Err(e) => after_failed_lower(ctx, guard, &change, adjusted, &plan, e).await,
    }
}

/// A committed lower's new meta, written after its commit (a failure leaves the older version,
/// which preheat refreshes). Nothing when Redis does not hold the sale.
async fn committed_meta(ctx: &Context, guard: &LockGuard, change: &Update, adjusted: Adjust) {
    if adjusted != Adjust::Applied {
        return;
    }
    let (buckets, meta_id) = (
        change.before.bucket_count(),
        format!("{}-meta", guard.token),
    );
    let written = if pause::fail("admin.lower.meta", guard.activity_id) {
        Err(StoreError::Timeout(ctx.redis.timeout).into())
    } else {
        adjust(ctx, guard, buckets, 0, &change.new_meta(ctx), &meta_id)
            .await
            .map(|(adjusted, _)| adjusted)
    };
    if !matches!(written, Ok(Adjust::Applied)) {
        tracing::warn!(
            activity_id = guard.activity_id,
            ?written,
            "lower committed; meta left to preheat"
        );
    }
}

/// A lower whose commit reported an error: the change may be in all the same (COMMIT's
/// answer lost). Redis gets its units back only when the database proves it is not.
async fn after_failed_lower(
    ctx: &Context,
    guard: &LockGuard,
    change: &Update,
    adjusted: Adjust,
    plan: &Plan,
    e: sqlx::Error,
) -> Result<Activity, ChangeError> {
    let (id, delta) = (guard.activity_id, change.delta);
    let read_back = if pause::fail("admin.commit.unknown", id) {
        Err(ChangeError::from(sqlx::Error::PoolTimedOut))
    } else {
        committed_under(ctx, guard).await
    };
    match read_back {
        // COMMIT's answer was lost, not the commit: the change is in.
        Ok(Some(updated)) => {
            committed_meta(ctx, guard, change, adjusted).await;
            return loaded_if_due(ctx, guard, adjusted, updated).await;
        }
        Ok(None) => {}
        Err(read) => {
            // Unknown whether it committed: Redis stays lower than the database may
            // allow (never oversells); reconcile corrects the stock once the ledger is
            // quiet, and preheat puts back the meta of the version the database holds.
            tracing::error!(activity_id = id, delta, error = %e, read_error = %read,
                "commit outcome unknown; redis left lowered for reconcile");
            return Err(e.into());
        }
    }
    if adjusted == Adjust::Applied {
        let old_meta = change.old_meta(ctx);
        revert(
            ctx,
            guard,
            plan,
            &old_meta,
            &format!("{}-revert", guard.token),
        )
        .await;
    }
    tracing::warn!(activity_id = id, delta, error = %e, "lower not committed; redis given its units back");
    Err(e.into())
}

/// Raising or meta only: the DB first, so Redis never offers units the DB lacks.
async fn raise(
    ctx: &Context,
    guard: &LockGuard,
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    change: Update,
) -> Result<Activity, ChangeError> {
    let (id, delta) = (guard.activity_id, change.delta);
    let updated = activity::apply_change(&mut tx, id, &change.after, delta, change.version).await?;
    tx.commit().await?;
    let new_meta = change.new_meta(ctx);
    let buckets = change.before.bucket_count();
    let change_id = guard.token.to_string();
    let adjusted = adjust(ctx, guard, buckets, delta, &new_meta, &change_id).await;
    match adjusted.map(|(a, _)| a) {
        Ok(adjusted @ (Adjust::Applied | Adjust::NotLoaded)) => {
            loaded_if_due(ctx, guard, adjusted, updated).await
        }
        other => {
            tracing::warn!(
                activity_id = id,
                delta,
                ?other,
                "DB committed but Redis not adjusted; reconcile and preheat will catch up"
            );
            Ok(updated)
        }
    }
}

/// After a committed change: a sale Redis does not hold is loaded now, under the lock this
/// change holds, when it starts within the preheat lead. A failed load is logged: the change
/// is in the database, and preheat loads it on its next run.
async fn loaded_if_due(
    ctx: &Context,
    guard: &LockGuard,
    adjusted: Adjust,
    updated: Activity,
) -> Result<Activity, ChangeError> {
    if adjusted != Adjust::NotLoaded
        || !updated.due_for_preheat(Utc::now(), ctx.config.preheat_lead)
    {
        return Ok(updated);
    }
    let buffer = ctx.config.expiry_buffer;
    let deadline = Instant::now() + LOAD_BUDGET;
    match load::load_after_change(&ctx.redis, &ctx.pool, guard, buffer, deadline).await {
        Ok(outcome) => tracing::info!(activity_id = updated.id, ?outcome, "changed sale loaded"),
        Err(e) => {
            tracing::warn!(activity_id = updated.id, error = %e, "changed sale not loaded; preheat will")
        }
    }
    Ok(updated)
}
