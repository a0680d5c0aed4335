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
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use seckill_shared::activity::{self, Activity, ActivityPatch, NewActivity};
use seckill_shared::auth::Admin;
use seckill_shared::cache::Redis;
use seckill_shared::http::{ActivityId, JsonBody};
use seckill_shared::lock::{self, LockError, LockGuard};
use seckill_shared::{db, load, order, sale, scripts, ApiError, Config};
use serde::Serialize;
use sqlx::PgPool;
use std::collections::HashMap;

/// What every handler needs, built once per cold start.
#[derive(Clone)]
pub struct AdminState {
    pub config: Config,
    pub pool: PgPool,
    pub redis: Redis,
}

impl AdminState {
    pub fn new(config: Config, pool: PgPool, redis: Redis) -> Self {
        Self {
            config,
            pool,
            redis,
        }
    }

    /// Connects Redis (bounded) and a lazy pool, as a cold start does.
    pub async fn connect(config: &Config) -> anyhow::Result<Self> {
        let redis = Redis::connect(config).await?;
        let pool = db::connect_lazy(config)?;
        Ok(Self::new(config.clone(), pool, redis))
    }
}

/// The admin routes, for `lambda_http::run` and the local dev server alike.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/admin/activities", post(create).get(list))
        .route("/admin/activities/{activityId}", get(show).put(update))
        .with_state(state)
}

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
            "the body must change at least one of title, totalStock, perOrderLimit, startAt, endAt"
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
    };
    activity::validate_fields(
        &merged.title,
        merged.total_stock,
        merged.per_order_limit,
        merged.start_at,
        merged.end_at,
    )?;
    Ok(merged)
}

/// What `adjust.lua` answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Adjust {
    Applied,
    NotOwner,
    NotLoaded,
    WouldGoNegative { stock: i64 },
}

/// The activity's meta as `adjust.lua` writes it to Redis.
struct RedisMeta {
    total: i64,
    per_order_limit: i64,
    start_at: DateTime<Utc>,
    end_at: DateTime<Utc>,
    version: i64,
}

async fn adjust(
    state: &AdminState,
    guard: &LockGuard,
    delta: i64,
    meta: &RedisMeta,
    change: &str,
) -> Result<Adjust, ApiError> {
    let keys = state.redis.keys(guard.activity_id);
    let expire_at = meta.end_at
        + chrono::Duration::from_std(state.config.expiry_buffer)
            .unwrap_or(chrono::Duration::hours(2));
    let mut inv = scripts::ADJUST.prepare_invoke();
    inv.key(&keys.stock)
        .key(&keys.meta)
        .key(&keys.lock)
        .key(&keys.users)
        .key(&keys.ledger)
        .arg(&guard.owner)
        .arg(delta)
        .arg(meta.total)
        .arg(meta.start_at.timestamp_millis())
        .arg(meta.end_at.timestamp_millis())
        .arg(meta.per_order_limit)
        .arg(meta.version)
        .arg(expire_at.timestamp_millis())
        .arg(change);
    let (code, stock): (i64, i64) = state.redis.script(&inv).await?;
    Ok(match code {
        0 => Adjust::Applied,
        1 => Adjust::NotOwner,
        2 => Adjust::NotLoaded,
        _ => Adjust::WouldGoNegative { stock },
    })
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
    let m = merge(&current, patch)?;
    let delta = m.total_stock - current.total_stock as i64;
    if current.remaining_stock as i64 + delta < 0 {
        return Err(below_sold(m.total_stock));
    }
    let version = current.config_version + 1;
    let new_meta = RedisMeta {
        total: m.total_stock,
        per_order_limit: m.per_order_limit,
        start_at: m.start_at,
        end_at: m.end_at,
        version,
    };
    if delta < 0 {
        // Lowering: Redis first, so units already reserved there are never taken back.
        let change = guard.token.to_string();
        let adjusted = adjust(state, guard, delta, &new_meta, &change).await?;
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
                return Err(below_sold(m.total_stock));
            }
        }
        let committed = async {
            let updated = write_update(&mut tx, id, &m, delta, version).await?;
            tx.commit().await?;
            if seckill_shared::pause::fail("admin.commit.lost_reply", id) {
                // Committed, but the connection dropped before COMMIT's answer arrived.
                return Err(sqlx::Error::Io(std::io::ErrorKind::ConnectionReset.into()));
            }
            Ok::<_, sqlx::Error>(updated)
        }
        .await;
        match committed {
            Ok(updated) => loaded_if_due(state, guard, adjusted, updated).await,
            Err(e) => {
                match committed_under(state, guard).await {
                    // COMMIT's answer was lost, not the commit: the change is in.
                    Ok(Some(updated)) => {
                        return loaded_if_due(state, guard, adjusted, updated).await
                    }
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
                    let old_meta = RedisMeta {
                        total: current.total_stock as i64,
                        per_order_limit: current.per_order_limit as i64,
                        start_at: current.start_at,
                        end_at: current.end_at,
                        version: current.config_version,
                    };
                    let revert = format!("{}-revert", guard.token);
                    let reverted = adjust(state, guard, -delta, &old_meta, &revert).await;
                    if !matches!(reverted, Ok(Adjust::Applied)) {
                        tracing::error!(
                            activity_id = id,
                            delta,
                            ?reverted,
                            "could not give Redis its units back; reconcile will repair"
                        );
                    }
                }
                Err(e.into())
            }
        }
    } else {
        // Raising or meta only: the DB first, so Redis never offers units the DB lacks.
        let updated = write_update(&mut tx, id, &m, delta, version).await?;
        tx.commit().await?;
        match adjust(state, guard, delta, &new_meta, &guard.token.to_string()).await {
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
#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    pub db_remaining: i64,
    /// `None` when the activity is not loaded in Redis.
    pub redis_stock: Option<i64>,
    pub pending_count: i64,
    pub pending_quantity: i64,
    pub confirmed_quantity: i64,
    pub participants: i64,
    /// `redis_stock + pending + confirmed - total`: 0 when stock is conserved; `None` when not
    /// loaded.
    pub drift: Option<i64>,
}

/// An activity with its live stats (`GET /admin/activities/{id}`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ActivityDetail {
    #[serde(flatten)]
    pub activity: Activity,
    pub stats: Stats,
}

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
    let snap = sale::snapshot(&state.redis, id).await?;
    let confirmed = order::sold_quantity(&state.pool, id).await?;
    let redis_stock = if snap.loaded { snap.stock } else { None };
    let pending = snap.pending_quantity();
    let stats = Stats {
        db_remaining: activity.remaining_stock as i64,
        redis_stock,
        pending_count: snap.pending_count() as i64,
        pending_quantity: pending,
        confirmed_quantity: confirmed,
        participants: snap.participants,
        drift: redis_stock.map(|s| s + pending + confirmed - activity.total_stock as i64),
    };
    Ok(ActivityDetail { activity, stats })
}

/// One page of activities.
#[derive(Debug, Serialize)]
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
