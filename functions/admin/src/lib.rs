//! The admin function: creates and changes sales, every change under the sale's fenced lock
//! ([`seckill_shared::protocol::lock`]): the lock's fencing token is recorded in the change's
//! own transaction, so a holder whose lease ran out is refused (409 `stale_token`).
//!
//! - `POST /admin/activities`: a new, published sale; one inside the preheat lead is loaded
//!   into Redis at once ([`protocol::admin::create`]).
//! - `PUT /admin/activities/{activityId}`: a merge update ([`update`]; docs/invariants.md,
//!   "Admin": a lower takes from Redis before the commit, a raise commits first).
//! - `GET /admin/activities/{activityId}`, `GET /admin/activities`: a sale with its live
//!   stats, a page of sales ([`stats`]).
//! - `GET /admin/ops`: the operator page's numbers, and the refunds and disputes that need a
//!   human ([`ops`]).

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Json, Router};
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::settings::NewActivity;
use seckill_shared::http::auth::Admin;
use seckill_shared::http::error::ErrorBody;
use seckill_shared::http::extract::{with_fallbacks, JsonBody};
use seckill_shared::protocol;
use seckill_shared::ApiError;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

mod state;

pub mod ops;
pub mod stats;
pub mod update;

pub use state::AdminState;
pub use stats::{activity_detail, ActivityDetail, Page, Stats};
pub use update::{update_activity, update_with_guard};

/// The admin routes, for `lambda_http::run` and the local dev server alike. Unknown routes
/// answer 404 and wrong methods 405, both as error JSON; with the edge on, a request without
/// the origin secret answers 403 before any of them.
pub fn router(state: AdminState) -> Router {
    let (routes, _) = api().split_for_parts();
    let origin = state.config.edge_origin.clone();
    seckill_shared::http::origin::guard(with_fallbacks(routes).with_state(state), &origin)
}

/// The routes of [`router`] with their OpenAPI description (`docs/openapi.json`).
pub fn api() -> OpenApiRouter<AdminState> {
    OpenApiRouter::new()
        .routes(routes!(create, stats::list))
        .routes(routes!(stats::show, update::update))
        .routes(routes!(ops::ops))
}

#[utoipa::path(
    post,
    path = "/admin/activities",
    tag = "admin",
    operation_id = "createActivity",
    summary = "Create a published sale; one starting within the preheat lead is loaded into Redis at once",
    request_body = NewActivity,
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

/// Validates and stores a new sale, loaded into Redis at once when it starts within the
/// preheat lead ([`protocol::admin::create`]).
pub async fn create_activity(state: &AdminState, new: &NewActivity) -> Result<Activity, ApiError> {
    Ok(protocol::admin::create(state, new).await?)
}
