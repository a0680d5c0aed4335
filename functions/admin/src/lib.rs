//! The admin function: creates and changes activities, every change under the activity's
//! fenced lock ([`seckill_shared::lock`]).
//!
//! # Routes (admin scope `seckill:admin`; a user token gets 403, none 401)
//!
//! | route | does |
//! |---|---|
//! | `POST /admin/activities` | validates and stores a new, published activity; 201 with it |
//! | `PUT /admin/activities/{activityId}` | merge update under the lock; 200 with the result |
//! | `GET /admin/activities/{activityId}` | the activity plus live stats (DB, Redis, drift) |
//! | `GET /admin/activities?limit=&offset=` | a page, newest first |
//! | `GET /admin/ops` | queue depth, purchase counters, latest reconcile checks ([`ops`]) |
//!
//! Creating takes no lock for the insert: nobody can hold the lock of an id that does not
//! exist yet, and the new row starts at `last_fence_token = 0`, below every token
//! [`lock::acquire`] can issue. A sale that starts within the preheat lead is then loaded into
//! Redis at once, fenced like any load (`seckill_shared::load`), so a sale created a minute
//! before its start does not wait for the preheat schedule; a change that finds such a sale
//! not loaded loads it under the lock it holds.
//!
//! # How a change is written
//!
//! [`update_activity`] takes the lock (waiting up to `lock_wait`, else 409 `busy`), runs
//! [`update_with_guard`] under [`LockGuard::run`] (abandoned if the watchdog loses the lease),
//! and releases. Inside one DB transaction, [`lock::fenced_update`] runs *first*: it records
//! the token and takes the row lock, so a stale holder is refused (409 `stale_token`) before it
//! touches Redis, and the row cannot move (the consumer's stock decrement waits) while the
//! change is computed from it. Then the order of the two stores depends on the direction:
//!
//! - **stock lowered**: `lua/adjust.lua` first. It is the only place that knows what is
//!   reserved but not yet in the DB, and it refuses atomically when Redis stock would go
//!   below 0 (409 `conflict`, nothing changed). Then the DB update commits; if it fails,
//!   Redis is given the units back with a second `adjust.lua` (+|d|).
//! - **stock raised, or window / limit / title only**: the DB commits first, then
//!   `adjust.lua` adds the delta (0 for meta-only changes) and writes the new meta. Redis
//!   never offers units the DB does not have.
//!
//! `adjust.lua` answering "not loaded" is fine: the change loads the sale itself when it is
//! within the preheat lead, and preheat loads the DB's values otherwise.
//!
//! A lower whose commit fails is reverted in Redis only when the database proves it did not
//! commit (the row does not carry our token): a connection lost during `COMMIT` may have
//! committed, and reverting then would offer units the database no longer has.
//!
//! # In-between states (a crash, a timeout or a lost lease between the two steps)
//!
//! - lowered in Redis, DB unchanged (crash or lost lease before the commit, or the revert
//!   failed; the request answers 409 or 503, or never answers): Redis
//!   stock is *lower* than the DB allows. Nothing oversells; reconcile sees the drift and,
//!   when the ledger is quiet, sets Redis stock back to the DB's remaining stock, reading it
//!   in the transaction that records its own token: a holder whose lease ran out between its
//!   Redis step and its commit either commits first (reconcile waits on the row and reads the
//!   lower) or is refused after (`stale_token`), never commits behind the fix.
//!   Redis meta already carries the new values and version; the next admin change rewrites it.
//! - raised in the DB, Redis unchanged (crash or Redis error after the commit, or the lease
//!   lost after the commit): Redis offers fewer units and an older meta. Reconcile corrects the
//!   stock from the DB; preheat refreshes the meta because the DB's `config_version` is newer.
//!   The request answers 200: the DB, the system of record, holds the change.
//!
//! Neither state can oversell, which is why the order depends on the direction.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use seckill_shared::activity::{self, Activity, ActivityPatch, Admission, NewActivity, Rules};
use seckill_shared::auth::Admin;
use seckill_shared::error::ErrorBody;
use seckill_shared::http::{with_fallbacks, ActivityId, JsonBody};
use seckill_shared::keys::Bucket;
use seckill_shared::lock::{self, LockError, LockGuard};
use seckill_shared::sale::{self, Adjust, SaleMeta};
use seckill_shared::{buckets, load, order, ApiError, Config, Deps};
use serde::Serialize;
use std::collections::HashMap;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub mod ops;

/// What every handler needs, built once per cold start: the [`Deps`] and nothing else
/// (handlers read `state.pool`, `state.config`, `state.redis` through it).
#[derive(Clone)]
pub struct AdminState {
    deps: Deps,
}

impl AdminState {
    pub fn new(deps: Deps) -> Self {
        Self { deps }
    }

    /// Connects Redis (bounded) and a lazy pool, as a cold start does.
    pub async fn connect(config: Config) -> anyhow::Result<Self> {
        Ok(Self::new(Deps::connect(config).await?))
    }
}

impl std::ops::Deref for AdminState {
    type Target = Deps;

    fn deref(&self) -> &Deps {
        &self.deps
    }
}

/// The admin routes, for `lambda_http::run` and the local dev server alike. Unknown routes
/// answer 404 and wrong methods 405, both as error JSON.
pub fn router(state: AdminState) -> Router {
    let (routes, _) = api().split_for_parts();
    with_fallbacks(routes).with_state(state)
}

/// The routes of [`router`] with their OpenAPI description (`docs/openapi.json`).
pub fn api() -> OpenApiRouter<AdminState> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(show, update))
        .routes(routes!(ops::ops))
}

#[utoipa::path(
    post,
    path = "/admin/activities",
    tag = "admin",
    operation_id = "createActivity",
    summary = "Create a published sale; one starting within the preheat lead is loaded into Redis at once",
    request_body = NewActivity,
    security(("bearer" = ["seckill:admin"])),
    responses(
        (status = 201, description = "Created", body = Activity),
        (status = 400, description = "A field is missing, unknown or out of range (`bad_request`)", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The token lacks the `seckill:admin` scope", body = ErrorBody),
        (status = 503, description = "The database is out of reach", body = ErrorBody),
        (status = 500, description = "Unexpected; logged", body = ErrorBody),
    )
)]
async fn create(
    Admin(who): Admin,
    State(state): State<AdminState>,
    JsonBody(new): JsonBody<NewActivity>,
) -> Result<(StatusCode, Json<Activity>), ApiError> {
    let created = create_activity(&state, &new).await?;
    tracing::info!(admin = %who.user_id, activity_id = created.id, "activity created");
    Ok((StatusCode::CREATED, Json(created)))
}

/// Validates and stores a new activity (no lock: see the module doc), then loads it into Redis
/// when it starts within the preheat lead. A failed load is logged, not answered: the database
/// holds the sale, and preheat loads it on its next run.
pub async fn create_activity(state: &AdminState, new: &NewActivity) -> Result<Activity, ApiError> {
    new.validate()?;
    let created = activity::insert(&state.pool, new).await?;
    if !created.due_for_preheat(Utc::now(), state.config.preheat_lead) {
        return Ok(created);
    }
    match load::load_under_lock(&state.redis, &state.pool, &state.config, created.id).await {
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

#[utoipa::path(
    put,
    path = "/admin/activities/{activityId}",
    tag = "admin",
    operation_id = "updateActivity",
    summary = "Merge update under the activity's fenced lock",
    params(ActivityId),
    request_body = ActivityPatch,
    security(("bearer" = ["seckill:admin"])),
    responses(
        (status = 200, description = "The activity after the change", body = Activity),
        (status = 400, description = "Empty patch, or a field unknown or out of range (`bad_request`)", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The token lacks the `seckill:admin` scope", body = ErrorBody),
        (status = 404, description = "No such activity", body = ErrorBody),
        (status = 409, description = "The lock is held (`busy`), a newer holder wrote (`stale_token`), or stock below what is sold (`conflict`)", body = ErrorBody),
        (status = 503, description = "Redis or the database is out of reach", body = ErrorBody),
        (status = 500, description = "Unexpected; logged", body = ErrorBody),
    )
)]
async fn update(
    Admin(who): Admin,
    State(state): State<AdminState>,
    ActivityId(id): ActivityId,
    JsonBody(patch): JsonBody<ActivityPatch>,
) -> Result<Json<Activity>, ApiError> {
    let updated = update_activity(&state, id, &patch).await?;
    tracing::info!(admin = %who.user_id, activity_id = id, version = updated.config_version, "activity updated");
    Ok(Json(updated))
}

/// A merge update of activity `id` under its fenced lock: acquire (409 `busy` after
/// `lock_wait`), [`update_with_guard`] under the watchdog, release.
#[tracing::instrument(skip(state, patch))]
pub async fn update_activity(
    state: &AdminState,
    id: i64,
    patch: &ActivityPatch,
) -> Result<Activity, ApiError> {
    if patch.is_empty() {
        return Err(ApiError::BadRequest(
            "the body must change at least one of title, totalStock, perOrderLimit, startAt, endAt, buckets, admission, drawWindowMs, perUserRatePerSec"
                .into(),
        ));
    }
    // Refuse unknown ids before creating lock keys for them.
    if activity::get(&state.pool, id).await?.is_none() {
        return Err(not_found(id));
    }
    let guard = lock::acquire(
        &state.redis,
        &state.pool,
        id,
        state.config.lock_ttl,
        state.config.lock_wait,
    )
    .await?;
    let result = match guard.run(update_with_guard(state, &guard, patch)).await {
        Ok(result) => result,
        Err(lost) => committed_under(state, &guard)
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
    state: &AdminState,
    guard: &LockGuard,
) -> Result<Option<Activity>, ApiError> {
    let row = activity::get(&state.pool, guard.activity_id).await?;
    Ok(row.filter(|a| a.last_fence_token == guard.token))
}

/// The merged fields of an update, validated.
struct Merged {
    title: String,
    total_stock: i64,
    per_order_limit: i64,
    start_at: DateTime<Utc>,
    end_at: DateTime<Utc>,
    buckets: i64,
    rules: Rules,
}

fn merge(current: &Activity, patch: &ActivityPatch) -> Result<Merged, ApiError> {
    let merged = Merged {
        title: patch
            .title
            .as_deref()
            .unwrap_or(&current.title)
            .trim()
            .to_string(),
        total_stock: patch.total_stock.unwrap_or(current.total_stock as i64),
        per_order_limit: patch
            .per_order_limit
            .unwrap_or(current.per_order_limit as i64),
        start_at: patch.start_at.unwrap_or(current.start_at),
        end_at: patch.end_at.unwrap_or(current.end_at),
        buckets: patch.buckets.unwrap_or(current.buckets as i64),
        rules: Rules::merged(current, patch),
    };
    activity::validate_fields(
        &merged.title,
        merged.total_stock,
        merged.per_order_limit,
        merged.start_at,
        merged.end_at,
    )?;
    activity::validate_buckets(merged.buckets)?;
    activity::validate_admission(
        &merged.rules,
        merged.start_at,
        merged.end_at,
        merged.buckets,
    )?;
    Ok(merged)
}

/// The Redis meta of a sale with these settings, expiring `expiry_buffer` after its end.
fn sale_meta(state: &AdminState, m: &Merged, version: i64) -> SaleMeta {
    let buffer = chrono::Duration::from_std(state.config.expiry_buffer)
        .unwrap_or(chrono::Duration::hours(2));
    SaleMeta {
        title: m.title.clone(),
        total: m.total_stock,
        per_order_limit: m.per_order_limit,
        start_at: m.start_at,
        end_at: m.end_at,
        version,
        expire_at: m.end_at + buffer,
        draw_end_ms: m.rules.draw_end_ms(m.start_at),
        rate: m.rules.per_user_rate_per_sec,
    }
}

/// What `adjust.lua` added to each bucket (negative: took), for a revert.
type Plan = Vec<(Bucket, i64)>;

/// `adjust.lua` for the holder of `guard`, in every bucket of a sale with `buckets` buckets:
/// the new meta everywhere, and the stock `delta` (a raise, or any change of a sale with one
/// bucket) split evenly over them.
async fn adjust(
    state: &AdminState,
    guard: &LockGuard,
    buckets: u32,
    delta: i64,
    meta: &SaleMeta,
    change: &str,
) -> Result<(Adjust, Plan), ApiError> {
    let (redis, owner, id) = (&state.redis, &guard.owner, guard.activity_id);
    let shares = buckets::split(delta, buckets);
    let mut plan = Plan::new();
    for (bucket, share) in Bucket::all(id, buckets).zip(shares) {
        match sale::adjust(redis, bucket, owner, share, meta, change).await? {
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
    state: &AdminState,
    guard: &LockGuard,
    buckets: u32,
    units: i64,
    current: &SaleMeta,
    change: &str,
) -> Result<(Adjust, Plan), ApiError> {
    let (redis, owner, id) = (&state.redis, &guard.owner, guard.activity_id);
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
            match sale::adjust(redis, bucket, owner, -take, current, &step).await? {
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
        revert(state, guard, &plan, current, &format!("{change}-undo")).await;
        return Ok((Adjust::WouldGoNegative { stock: held }, Plan::new()));
    }
    Ok((Adjust::Applied, plan))
}

/// Gives every bucket of `plan` back what the plan took (or takes back what it added).
async fn revert(state: &AdminState, guard: &LockGuard, plan: &Plan, meta: &SaleMeta, change: &str) {
    for (i, (bucket, added)) in plan.iter().enumerate() {
        if *added == 0 {
            continue;
        }
        let step = format!("{change}-{i}");
        let reverted = sale::adjust(&state.redis, *bucket, &guard.owner, -added, meta, &step).await;
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
struct Change {
    before: Activity,
    merged: Merged,
    /// Units added (positive) or taken away (negative).
    delta: i64,
    version: i64,
}

impl Change {
    fn new(before: Activity, patch: &ActivityPatch) -> Result<Self, ApiError> {
        let merged = merge(&before, patch)?;
        let delta = merged.total_stock - before.total_stock as i64;
        if before.remaining_stock as i64 + delta < 0 {
            return Err(below_sold(merged.total_stock));
        }
        let version = before.config_version + 1;
        Ok(Self {
            before,
            merged,
            delta,
            version,
        })
    }

    /// The settings before the change, to give Redis back what a failed lower took.
    fn before_merged(&self) -> Merged {
        let a = &self.before;
        Merged {
            title: a.title.clone(),
            total_stock: a.total_stock as i64,
            per_order_limit: a.per_order_limit as i64,
            start_at: a.start_at,
            end_at: a.end_at,
            buckets: a.buckets as i64,
            rules: Rules::of(a),
        }
    }
}

/// The body of an update, for a caller that already holds the lock. Public so tests can play
/// a holder that was paused past its lease: the fencing check in the DB must refuse it.
#[tracing::instrument(skip(state, guard, patch), fields(activity_id = guard.activity_id, token = guard.token))]
pub async fn update_with_guard(
    state: &AdminState,
    guard: &LockGuard,
    patch: &ActivityPatch,
) -> Result<Activity, ApiError> {
    let id = guard.activity_id;
    let mut tx = state.pool.begin().await?;
    // Fence first: records the token and locks the row, before Redis is touched.
    match lock::fenced_update(&mut tx, id, guard.token).await {
        Err(LockError::Db(sqlx::Error::RowNotFound)) => return Err(not_found(id)),
        other => other?,
    }
    let current = activity::get(&mut *tx, id)
        .await?
        .ok_or(sqlx::Error::RowNotFound)?;
    let change = Change::new(current, patch)?;
    admission_unchanged_once_started(&change)?;
    if change.merged.buckets != change.before.buckets as i64 {
        relayout(state, guard, &mut tx, &change).await?;
        let updated =
            write_update(&mut tx, id, &change.merged, change.delta, change.version).await?;
        tx.commit().await?;
        return loaded_if_due(state, guard, Adjust::NotLoaded, updated).await;
    }
    if change.delta < 0 {
        lower(state, guard, tx, change).await
    } else {
        raise(state, guard, tx, change).await
    }
}

/// How long before its start a sale's admission is already fixed: the change reaches Redis
/// after its commit, and the clocks of this function and of Redis differ a little.
const ADMISSION_FIXED_BEFORE_START: chrono::Duration = chrono::Duration::seconds(10);

/// A sale's admission, its draw window and (for a draw) its start change only until shortly
/// before the start ([`ADMISSION_FIXED_BEFORE_START`]): the pool of a running draw was
/// collected under them.
fn admission_unchanged_once_started(change: &Change) -> Result<(), ApiError> {
    let (before, after) = (&change.before, &change.merged);
    let now = Utc::now() + ADMISSION_FIXED_BEFORE_START;
    if now < before.start_at && now < after.start_at {
        return Ok(());
    }
    let was = Rules::of(before);
    let draw = was.admission == Admission::Draw.as_str();
    if after.rules.admission != was.admission
        || after.rules.draw_window_ms != was.draw_window_ms
        || (draw && after.start_at != before.start_at)
    {
        return Err(ApiError::Conflict(
            "admission, drawWindowMs and a draw sale's startAt can change only until 10 s before the sale starts"
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
    state: &AdminState,
    guard: &LockGuard,
    tx: &mut sqlx::PgConnection,
    change: &Change,
) -> Result<(), ApiError> {
    let now = Utc::now();
    if now >= change.before.start_at || now >= change.merged.start_at {
        return Err(ApiError::Conflict(
            "buckets can change only before the sale starts".into(),
        ));
    }
    if order::exists_for(&mut *tx, guard.activity_id).await? {
        return Err(ApiError::Conflict(
            "buckets cannot change once the sale has an order".into(),
        ));
    }
    let old = change.before.bucket_count();
    if !load::unload_layout(&state.redis, guard, old).await? {
        return Err(LockError::Lost.into());
    }
    tracing::info!(
        activity_id = guard.activity_id,
        from = old,
        to = change.merged.buckets,
        "bucket count changed; the old layout is unloaded"
    );
    Ok(())
}

/// Lowering: Redis first, so units already reserved there are never taken back.
async fn lower(
    state: &AdminState,
    guard: &LockGuard,
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    change: Change,
) -> Result<Activity, ApiError> {
    let (id, delta) = (guard.activity_id, change.delta);
    let new_meta = sale_meta(state, &change.merged, change.version);
    let buckets = change.before.bucket_count();
    let change_id = guard.token.to_string();
    let (adjusted, plan) = if buckets > 1 {
        let current = sale_meta(state, &change.before_merged(), change.before.config_version);
        take_from_buckets(state, guard, buckets, -delta, &current, &change_id).await?
    } else {
        adjust(state, guard, 1, delta, &new_meta, &change_id).await?
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
            return Err(below_sold(change.merged.total_stock));
        }
    }
    let committed = async {
        let updated = write_update(&mut tx, id, &change.merged, delta, change.version).await?;
        tx.commit().await?;
        if seckill_shared::pause::fail("admin.commit.lost_reply", id) {
            // Committed, but the connection dropped before COMMIT's answer arrived.
            return Err(sqlx::Error::Io(std::io::ErrorKind::ConnectionReset.into()));
        }
        Ok::<_, sqlx::Error>(updated)
    }
    .await;
    match committed {
        Ok(updated) => {
            if buckets > 1 && adjusted == Adjust::Applied {
                // The new meta, now that the database holds it (a failure leaves the older
                // version, which preheat refreshes).
                let meta_id = format!("{change_id}-meta");
                if let Err(e) = adjust(state, guard, buckets, 0, &new_meta, &meta_id).await {
                    tracing::warn!(activity_id = id, error = %e, "lower committed; meta left to preheat");
                }
            }
            loaded_if_due(state, guard, adjusted, updated).await
        }
        Err(e) => after_failed_lower(state, guard, &change, adjusted, &plan, e).await,
    }
}

/// A lower whose commit reported an error: the change may be in all the same (COMMIT's
/// answer lost). Redis gets its units back only when the database proves it is not.
async fn after_failed_lower(
    state: &AdminState,
    guard: &LockGuard,
    change: &Change,
    adjusted: Adjust,
    plan: &Plan,
    e: sqlx::Error,
) -> Result<Activity, ApiError> {
    let (id, delta) = (guard.activity_id, change.delta);
    match committed_under(state, guard).await {
        // COMMIT's answer was lost, not the commit: the change is in.
        Ok(Some(updated)) => return loaded_if_due(state, guard, adjusted, updated).await,
        Ok(None) => {}
        Err(read) => {
            // Unknown whether it committed: Redis stays lower than the database may
            // allow (never oversells); reconcile corrects it once the ledger is quiet.
            tracing::error!(activity_id = id, delta, error = %e, read_error = %read,
                "commit outcome unknown; redis left lowered for reconcile");
            return Err(e.into());
        }
    }
    if adjusted == Adjust::Applied {
        let old_meta = sale_meta(state, &change.before_merged(), change.before.config_version);
        revert(
            state,
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
    state: &AdminState,
    guard: &LockGuard,
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    change: Change,
) -> Result<Activity, ApiError> {
    let (id, delta) = (guard.activity_id, change.delta);
    let updated = write_update(&mut tx, id, &change.merged, delta, change.version).await?;
    tx.commit().await?;
    let new_meta = sale_meta(state, &change.merged, change.version);
    let buckets = change.before.bucket_count();
    let change_id = guard.token.to_string();
    let adjusted = adjust(state, guard, buckets, delta, &new_meta, &change_id).await;
    match adjusted.map(|(a, _)| a) {
        Ok(adjusted @ (Adjust::Applied | Adjust::NotLoaded)) => {
            loaded_if_due(state, guard, adjusted, updated).await
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
    state: &AdminState,
    guard: &LockGuard,
    adjusted: Adjust,
    updated: Activity,
) -> Result<Activity, ApiError> {
    if adjusted != Adjust::NotLoaded
        || !updated.due_for_preheat(Utc::now(), state.config.preheat_lead)
    {
        return Ok(updated);
    }
    let buffer = state.config.expiry_buffer;
    match load::load_after_change(&state.redis, &state.pool, guard, buffer).await {
        Ok(outcome) => tracing::info!(activity_id = updated.id, ?outcome, "changed sale loaded"),
        Err(e) => {
            tracing::warn!(activity_id = updated.id, error = %e, "changed sale not loaded; preheat will")
        }
    }
    Ok(updated)
}

/// The row update of a merge, in the caller's transaction (after the fence).
async fn write_update(
    tx: &mut sqlx::PgConnection,
    id: i64,
    m: &Merged,
    delta: i64,
    version: i64,
) -> Result<Activity, sqlx::Error> {
    let change = activity::Change {
        title: &m.title,
        total_stock: m.total_stock as i32,
        stock_delta: delta as i32,
        per_order_limit: m.per_order_limit as i32,
        start_at: m.start_at,
        end_at: m.end_at,
        config_version: version,
        buckets: m.buckets as i32,
        rules: m.rules.clone(),
    };
    activity::apply_change(tx, id, &change).await
}

fn not_found(id: i64) -> ApiError {
    ApiError::NotFound(format!("activity {id} does not exist"))
}

fn below_sold(total: i64) -> ApiError {
    ApiError::Conflict(format!(
        "totalStock {total} is below what is already sold or reserved"
    ))
}

/// Live numbers of one activity, for the admin's view.
#[derive(Debug, Serialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    pub db_remaining: i64,
    /// `None` when the activity is not loaded in Redis.
    pub redis_stock: Option<i64>,
    pub pending_count: i64,
    pub pending_quantity: i64,
    /// Units on their way between two buckets of a bucketed sale (taken from one, not yet
    /// known to be in the other).
    pub transfer_quantity: i64,
    pub confirmed_quantity: i64,
    pub participants: i64,
    /// Each bucket's Redis stock, bucket 0 first (one entry for a sale with one bucket;
    /// `None` for a bucket not loaded).
    pub bucket_stock: Vec<Option<i64>>,
    /// `redis_stock + pending + transfers + confirmed - total`: 0 when stock is conserved;
    /// `None` when not loaded.
    pub drift: Option<i64>,
}

/// An activity with its live stats (`GET /admin/activities/{id}`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActivityDetail {
    #[serde(flatten)]
    pub activity: Activity,
    pub stats: Stats,
}

#[utoipa::path(
    get,
    path = "/admin/activities/{activityId}",
    tag = "admin",
    operation_id = "showActivity",
    summary = "The activity as stored, plus live stats from the database and Redis",
    params(ActivityId),
    security(("bearer" = ["seckill:admin"])),
    responses(
        (status = 200, description = "The activity and its stats", body = ActivityDetail),
        (status = 400, description = "Bad id (`bad_request`)", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The token lacks the `seckill:admin` scope", body = ErrorBody),
        (status = 404, description = "No such activity", body = ErrorBody),
        (status = 503, description = "Redis or the database is out of reach", body = ErrorBody),
        (status = 500, description = "Unexpected; logged", body = ErrorBody),
    )
)]
async fn show(
    Admin(_): Admin,
    State(state): State<AdminState>,
    ActivityId(id): ActivityId,
) -> Result<Json<ActivityDetail>, ApiError> {
    Ok(Json(activity_detail(&state, id).await?))
}

/// Reads an activity and its live stats.
pub async fn activity_detail(state: &AdminState, id: i64) -> Result<ActivityDetail, ApiError> {
    let activity = activity::get(&state.pool, id)
        .await?
        .ok_or_else(|| not_found(id))?;
    let snaps = buckets::snapshots(&state.redis, id, activity.bucket_count()).await?;
    let confirmed = order::sold_quantity(&state.pool, id).await?;
    let loaded = snaps.iter().all(|(_, s)| s.loaded);
    let redis_stock = loaded.then(|| snaps.iter().filter_map(|(_, s)| s.stock).sum::<i64>());
    let pending: i64 = snaps.iter().map(|(_, s)| s.pending_quantity()).sum();
    let in_transfer: i64 = snaps.iter().map(|(_, s)| s.transfer_quantity()).sum();
    let stats = Stats {
        db_remaining: activity.remaining_stock as i64,
        redis_stock,
        pending_count: snaps.iter().map(|(_, s)| s.pending_count() as i64).sum(),
        pending_quantity: pending,
        transfer_quantity: in_transfer,
        confirmed_quantity: confirmed,
        participants: snaps.iter().map(|(_, s)| s.participants).sum(),
        bucket_stock: snaps.iter().map(|(_, s)| s.stock).collect(),
        drift: redis_stock
            .map(|s| s + pending + in_transfer + confirmed - activity.total_stock as i64),
    };
    Ok(ActivityDetail { activity, stats })
}

/// One page of activities.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Page {
    pub items: Vec<Activity>,
    pub limit: i64,
    pub offset: i64,
}

fn query_number(
    params: &HashMap<String, String>,
    name: &str,
    default: i64,
    range: std::ops::RangeInclusive<i64>,
) -> Result<i64, ApiError> {
    match params.get(name) {
        None => Ok(default),
        Some(raw) => match raw.parse::<i64>() {
            Ok(n) if range.contains(&n) => Ok(n),
            _ => Err(ApiError::BadRequest(format!(
                "{name} must be an integer in {}..={}, got {raw:?}",
                range.start(),
                range.end()
            ))),
        },
    }
}

#[utoipa::path(
    get,
    path = "/admin/activities",
    tag = "admin",
    operation_id = "listActivities",
    summary = "A page of activities, newest first",
    params(
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "Page size (default 20)"),
        ("offset" = Option<i64>, Query, minimum = 0, maximum = 1000000, description = "Rows to skip (default 0)"),
    ),
    security(("bearer" = ["seckill:admin"])),
    responses(
        (status = 200, description = "The page", body = Page),
        (status = 400, description = "A query parameter unknown or out of range (`bad_request`)", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The token lacks the `seckill:admin` scope", body = ErrorBody),
        (status = 503, description = "The database is out of reach", body = ErrorBody),
        (status = 500, description = "Unexpected; logged", body = ErrorBody),
    )
)]
async fn list(
    Admin(_): Admin,
    State(state): State<AdminState>,
    query: Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Page>, ApiError> {
    let Query(params) = query.map_err(seckill_shared::error::rejection_to_bad_request)?;
    if let Some(unknown) = params.keys().find(|k| *k != "limit" && *k != "offset") {
        return Err(ApiError::BadRequest(format!(
            "unknown query parameter {unknown:?}"
        )));
    }
    let limit = query_number(&params, "limit", 20, 1..=100)?;
    let offset = query_number(&params, "offset", 0, 0..=1_000_000)?;
    let items = activity::list(&state.pool, limit, offset).await?;
    Ok(Json(Page {
        items,
        limit,
        offset,
    }))
}
