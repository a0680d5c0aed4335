//! The OpenAPI 3.1 document of the whole HTTP API, assembled from the code once.
//!
//! The paths come from the entry and admin functions' routers ([`seckill_entry::api`],
//! [`admin::api`]): each handler's `#[utoipa::path]` says its parameters, body and statuses,
//! and the types' `ToSchema` say the bodies. The error body and its codes come from
//! [`seckill_shared::http::error::ErrorBody`] and `ApiError::codes`. What is added here is what the
//! functions share: the title, the tags, the security schemes, and each operation's security
//! from its route's row of `functions/routes.toml` ([`route_security`]).
//!
//! `docs/openapi.json` is the committed render ([`render`], written by `make openapi`);
//! `tests/tests/openapi.rs` fails when it is stale. `make serve` serves it at `/openapi.json`.

use seckill_shared::http::routes::{self, Auth};
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{
    ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
};
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, ResponseBuilder};
use utoipa::{Modify, OpenApi as _};

/// The scheme of the routes behind the JWT authorizer, with the route's scopes.
pub const BEARER: &str = "bearer";

/// The scheme of the IAM route (`GET /health/deep`): a SigV4 signature.
pub const SIGV4: &str = "sigv4";

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "seckill HTTP API",
        description = "A flash-sale backend: the `seckill-entry` function (purchase, my order, \
            public view, pay, cancel, health) and the `admin` function (activities, under a \
            fenced lock), behind one API Gateway HTTP API. Identity comes only from the verified \
            JWT: `sub` is the user; its `scope` must hold the scope each operation's security \
            names (`seckill:user` for purchase, my order, pay and cancel, `seckill:admin` for the \
            admin routes), else the API answers 403 before any function runs. \
            Every error is `{\"error\": code, \"message\": text}` (`ErrorBody`), also for an \
            unknown path (404 `not_found`) and a known path with another method (405 \
            `method_not_allowed`, with `Allow`). JSON fields are camelCase. The local dev \
            server (`make serve`) serves this document at `/openapi.json`.",
        license(name = "MIT"),
    ),
    // Every operation says its own (`route_security`); this is what one that did not would need.
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

/// Adds the schemes: the bearer token (API Gateway's JWT authorizer in AWS, HS256 tokens from
/// `make token` on the dev server) and the SigV4 signature of the IAM route.
struct BearerScheme;

impl Modify for BearerScheme {
    fn modify(&self, openapi: &mut OpenApi) {
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .bearer_format("JWT")
            .description(Some(
                "A JWT whose `sub` is the caller and whose `scope` (space-separated) holds one of \
                 the scopes the operation's security names: `seckill:user` for the user routes, \
                 `seckill:admin` for the admin routes. No valid token: 401; a token without the \
                 scope: 403, before any function runs.",
            ))
            .build();
        let sigv4 = ApiKeyValue::with_description(
            "Authorization",
            "An AWS Signature Version 4 of the request, by a principal allowed \
             `execute-api:Invoke` on the route (template.yaml's DeepHealthInvokePolicy); API \
             Gateway refuses an unsigned call. The dev server checks none.",
        );
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(BEARER, SecurityScheme::Http(scheme));
        components.add_security_scheme(SIGV4, SecurityScheme::ApiKey(ApiKey::Header(sigv4)));
    }
}

/// The document: the shared parts, then the entry and admin functions' routes, each with the
/// security of its route's row.
pub fn document() -> OpenApi {
    let mut doc = Base::openapi();
    doc.merge(seckill_entry::api().into_openapi());
    doc.merge(admin::api().into_openapi());
    route_security(&mut doc);
    doc
}

/// Each operation's security from its row of `functions/routes.toml`: the bearer scheme with
/// the route's scopes, SigV4, or none (`{}`); and the authorizer's refusals among its
/// responses (401 without a valid token, 403 without the scope), where the handler does not
/// document them itself. Panics on an operation without a row: the table is what API Gateway
/// is deployed with, and a route it lacks is one AWS would not serve.
pub fn route_security(doc: &mut OpenApi) {
    for (path, item) in doc.paths.paths.iter_mut() {
        let operations = [
            ("GET", &mut item.get),
            ("POST", &mut item.post),
            ("PUT", &mut item.put),
            ("PATCH", &mut item.patch),
            ("DELETE", &mut item.delete),
        ];
        for (method, op) in operations {
            let Some(op) = op else { continue };
            let row = routes::route(method, path)
                .unwrap_or_else(|| panic!("{method} {path} has no row in functions/routes.toml"));
            let requirement = match row.auth {
                Auth::None => SecurityRequirement::default(),
                Auth::Iam => SecurityRequirement::new(SIGV4, Vec::<String>::new()),
                Auth::Jwt => {
                    add_refusal(op, "401", "No valid bearer token".into());
                    if !row.scopes.is_empty() {
                        let scopes = row.scopes.iter().map(|s| format!("`{s}`"));
                        let scopes = scopes.collect::<Vec<_>>().join(" or ");
                        add_refusal(op, "403", format!("The token lacks the {scopes} scope"));
                    }
                    SecurityRequirement::new(BEARER, row.scopes.clone())
                }
            };
            op.security = Some(vec![requirement]);
        }
    }
}

/// A refusal answered with the error body, unless the operation documents that status itself.
fn add_refusal(op: &mut Operation, status: &str, description: String) {
    let body = ContentBuilder::new()
        .schema(Some(Ref::from_schema_name("ErrorBody")))
        .build();
    let response = ResponseBuilder::new()
        .description(description)
        .content("application/json", body)
        .build();
    op.responses
        .responses
        .entry(status.to_string())
        .or_insert_with(|| response.into());
}

/// The document as `docs/openapi.json` holds it: pretty JSON and a final newline.
pub fn render() -> String {
    let mut json = document()
        .to_pretty_json()
        .expect("an OpenAPI document serializes");
    json.push('\n');
    json
}
