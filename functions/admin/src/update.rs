//! `PUT /admin/activities/{id}`: a merge update of a sale under its fenced lock. The protocol
//! makes the change ([`seckill_shared::protocol::admin`]: a lower takes from Redis before the
//! commit, a raise commits first); this handler answers it. docs/invariants.md, "Admin".

use crate::state::AdminState;
use axum::extract::State;
use axum::Json;
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::settings::ActivityPatch;
use seckill_shared::http::auth::Admin;
use seckill_shared::http::error::ErrorBody;
use seckill_shared::http::extract::{ActivityId, JsonBody};
use seckill_shared::protocol;
use seckill_shared::protocol::lock::LockGuard;
use seckill_shared::ApiError;

#[utoipa::path(
    put,
    path = "/admin/activities/{activityId}",
    tag = "admin",
    operation_id = "updateActivity",
    summary = "Merge update under the activity's fenced lock",
    params(ActivityId),
    request_body = ActivityPatch,
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
pub(crate) async fn update(
    Admin(who): Admin,
    State(state): State<AdminState>,
    ActivityId(id): ActivityId,
    JsonBody(patch): JsonBody<ActivityPatch>,
) -> Result<Json<Activity>, ApiError> {
    let updated = update_activity(&state, id, &patch).await?;
    tracing::info!(admin = %who.user_id, activity_id = id, version = updated.config_version, "activity updated");
    Ok(Json(updated))
}

/// A merge update of activity `id` under its fenced lock ([`protocol::admin::change`]).
pub async fn update_activity(
    state: &AdminState,
    id: i64,
    patch: &ActivityPatch,
) -> Result<Activity, ApiError> {
    Ok(protocol::admin::change(state, id, patch).await?)
}

/// The body of an update, for a caller that already holds the lock
/// ([`protocol::admin::change_with_guard`]). Public so tests can play a holder that was
/// paused past its lease: the fencing check in the DB must refuse it.
pub async fn update_with_guard(
    state: &AdminState,
    guard: &LockGuard,
    patch: &ActivityPatch,
) -> Result<Activity, ApiError> {
    Ok(protocol::admin::change_with_guard(state, guard, patch).await?)
}
