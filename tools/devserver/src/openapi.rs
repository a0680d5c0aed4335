//! The OpenAPI 3.1 document of the whole HTTP API, assembled from the code once.
//!
//! The paths come from the entry and admin functions' routers ([`seckill_entry::api`],
//! [`admin::api`]): each handler's `#[utoipa::path]` says its parameters, body, statuses and
//! security, and the types' `ToSchema` say the bodies. The error body and its codes come from
//! [`seckill_shared::http::error::ErrorBody`] and `ApiError::codes`. What is added here is what the
//! functions share: the title, the tags and the bearer (JWT) security scheme.
//!
//! `docs/openapi.json` is the committed render ([`render`], written by `make openapi`);
//! `tests/tests/openapi.rs` fails when it is stale. `make serve` serves it at `/openapi.json`.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::OpenApi;
use utoipa::{Modify, OpenApi as _};

/// The name the handlers' `security(("bearer" = [...]))` refer to.
pub const BEARER: &str = "bearer";

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "seckill HTTP API",
        description = "A flash-sale backend: the `seckill-entry` function (purchase, my order, \
            public view, pay, cancel, health) and the `admin` function (activities, under a \
            fenced lock), behind one API Gateway HTTP API. Identity comes only from the verified \
            JWT: `sub` is the user, a `scope` containing `seckill:admin` grants the admin routes. \
            Every error is `{\"error\": code, \"message\": text}` (`ErrorBody`), also for an \
            unknown path (404 `not_found`) and a known path with another method (405 \
            `method_not_allowed`, with `Allow`). JSON fields are camelCase. The local dev \
            server (`make serve`) serves this document at `/openapi.json`.",
        license(name = "MIT"),
    ),
    // Every operation needs the token unless it says otherwise (`security(())`: the public
    // view and the health checks).
    security(("bearer" = [])),
    servers((url = "http://127.0.0.1:3000", description = "`make serve`")),
    tags(
        (name = "purchase", description = "Buying in a sale (`seckill-entry`)"),
        (name = "orders", description = "An order after it is confirmed (`seckill-entry`)"),
        (name = "health", description = "Liveness (no I/O) and the deep check of Redis, the database and the queue (`seckill-entry`)"),
        (name = "admin", description = "Activities, for the `seckill:admin` scope (`admin`)"),
    ),
    modifiers(&BearerScheme),
)]
struct Base;

/// Adds the bearer scheme: API Gateway's JWT authorizer in AWS, HS256 tokens from `make token`
/// on the dev server.
struct BearerScheme;

impl Modify for BearerScheme {
    fn modify(&self, openapi: &mut OpenApi) {
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .bearer_format("JWT")
            .description(Some(
                "A JWT whose `sub` is the caller; admin routes need `seckill:admin` in `scope`.",
            ))
            .build();
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme(BEARER, SecurityScheme::Http(scheme));
    }
}

/// The document: the shared parts, then the entry and admin functions' routes.
pub fn document() -> OpenApi {
    let mut doc = Base::openapi();
    doc.merge(seckill_entry::api().into_openapi());
    doc.merge(admin::api().into_openapi());
    doc
}

/// The document as `docs/openapi.json` holds it: pretty JSON and a final newline.
pub fn render() -> String {
    let mut json = document()
        .to_pretty_json()
        .expect("an OpenAPI document serializes");
    json.push('\n');
    json
}
