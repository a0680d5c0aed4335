//! Request extractors every HTTP function shares, so bad input is refused the same way
//! everywhere: a 400 `bad_request` that says what is wrong, before any handler logic runs.
//! Also the answers for requests no route takes ([`with_fallbacks`]), the same JSON error.

use crate::http::error::ApiError;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, RawPathParams, Request};
use axum::http::request::Parts;
use axum::Router;
use serde::de::DeserializeOwned;

/// Largest request body any route accepts. Our bodies are a few fields; anything bigger is an
/// attack or a bug, and it is refused before it is parsed.
pub const MAX_BODY_BYTES: usize = 4 * 1024;

/// A JSON body of at most [`MAX_BODY_BYTES`]; every failure is a 400 naming the problem.
/// An empty body deserializes as `{}` (so optional fields take their defaults).
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if let Some(len) = req
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok())
        {
            if len > MAX_BODY_BYTES {
                return Err(too_large());
            }
        }
        let bytes = axum::body::to_bytes(req.into_body(), MAX_BODY_BYTES)
            .await
            .map_err(|_| too_large())?;
        let _ = state;
        parse_json(&bytes).map(JsonBody)
    }
}

fn too_large() -> ApiError {
    ApiError::BadRequest(format!(
        "request body is larger than {MAX_BODY_BYTES} bytes"
    ))
}

/// Parses a JSON body, treating an empty or blank body as `{}`.
pub fn parse_json<T: DeserializeOwned>(bytes: &Bytes) -> Result<T, ApiError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| ApiError::BadRequest("request body is not valid UTF-8".into()))?;
    let text = if text.trim().is_empty() { "{}" } else { text };
    serde_json::from_str(text).map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))
}

/// Reads a named path parameter as a positive integer id (`activityId`, `orderId`).
pub fn positive_id(params: &RawPathParams, name: &str) -> Result<i64, ApiError> {
    let raw = params
        .iter()
        .find_map(|(key, value)| (key == name).then_some(value))
        .ok_or_else(|| ApiError::BadRequest(format!("missing path parameter {name}")))?;
    match raw.parse::<i64>() {
        // One spelling per id: `+7`, `007` would each miss the edge's cache and the
        // container's, and cost a read of their own. No such address, and no I/O.
        Ok(id) if id > 0 && raw.len() == id.to_string().len() => Ok(id),
        Ok(id) if id > 0 => Err(ApiError::NotFound(format!(
            "no {name} {raw:?}: ids are written without a sign or leading zeros"
        ))),
        _ => Err(ApiError::BadRequest(format!(
            "{name} must be a positive integer, got {raw:?}"
        ))),
    }
}

/// `{activityId}` from the path, as a positive integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActivityId(pub i64);

/// `{orderId}` from the path, as a positive integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrderId(pub i64);

/// The OpenAPI description of a path id as [`positive_id`] reads it.
fn id_parameter(name: &str, description: &str) -> utoipa::openapi::path::Parameter {
    use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
    use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
    use utoipa::openapi::Required;
    let schema = ObjectBuilder::new()
        .schema_type(Type::Integer)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
        .minimum(Some(1));
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Path)
        .required(Required::True)
        .description(Some(description))
        .schema(Some(schema))
        .build()
}

impl utoipa::IntoParams for ActivityId {
    fn into_params(
        _: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        vec![id_parameter("activityId", "The activity (sale) id.")]
    }
}

impl utoipa::IntoParams for OrderId {
    fn into_params(
        _: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        vec![id_parameter("orderId", "The order id.")]
    }
}

/// Answers what no route takes with the error JSON: 404 `not_found` for an unknown path, 405
/// `method_not_allowed` (with axum's `Allow` header) for a known path and another method.
/// Call it on the finished router: axum gives the 405 answer to the routes present then.
pub fn with_fallbacks<S: Clone + Send + Sync + 'static>(router: Router<S>) -> Router<S> {
    router
        .fallback(no_such_route)
        .method_not_allowed_fallback(method_not_allowed)
}

async fn no_such_route() -> ApiError {
    ApiError::NotFound("no such route".into())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// The route's path parameters, percent-decoded, without the map and strings `Path` builds.
async fn path_params<S: Send + Sync>(
    parts: &mut Parts,
    state: &S,
) -> Result<RawPathParams, ApiError> {
    RawPathParams::from_request_parts(parts, state)
        .await
        .map_err(|e| ApiError::BadRequest(e.to_string()))
}

impl<S: Send + Sync> FromRequestParts<S> for ActivityId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        positive_id(&path_params(parts, state).await?, "activityId").map(ActivityId)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for OrderId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        positive_id(&path_params(parts, state).await?, "orderId").map(OrderId)
    }
}
