//! A sale as stored with its live stats (the database, every bucket of Redis, the drift), and
//! a page of sales.

use crate::state::{not_found, AdminState};
use axum::extract::{Query, State};
use axum::Json;
use seckill_shared::domain::activity::{self, Activity};
use seckill_shared::domain::order;
use seckill_shared::http::auth::Admin;
use seckill_shared::http::error::ErrorBody;
use seckill_shared::http::extract::ActivityId;
use seckill_shared::store::buckets;
use seckill_shared::ApiError;
use serde::Serialize;
use std::collections::HashMap;

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
pub(crate) async fn show(
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
        db_remaining: activity.remaining_stock,
        redis_stock,
        pending_count: snaps.iter().map(|(_, s)| s.pending_count() as i64).sum(),
        pending_quantity: pending,
        transfer_quantity: in_transfer,
        confirmed_quantity: confirmed,
        participants: snaps.iter().map(|(_, s)| s.participants).sum(),
        bucket_stock: snaps.iter().map(|(_, s)| s.stock).collect(),
        drift: redis_stock.map(|s| s + pending + in_transfer + confirmed - activity.total_stock),
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
    responses(
        (status = 200, description = "The page", body = Page),
        (status = 400, description = "A query parameter unknown or out of range (`bad_request`)", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The token lacks the `seckill:admin` scope", body = ErrorBody),
        (status = 503, description = "The database is out of reach", body = ErrorBody),
        (status = 500, description = "Unexpected; logged", body = ErrorBody),
    )
)]
pub(crate) async fn list(
    Admin(_): Admin,
    State(state): State<AdminState>,
    query: Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Page>, ApiError> {
    let Query(params) = query.map_err(seckill_shared::http::error::rejection_to_bad_request)?;
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
