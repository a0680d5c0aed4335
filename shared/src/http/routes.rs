//! What API Gateway asks of a caller on each route, read from `functions/routes.toml`
//! (compiled in): the JWT authorizer with the route's scopes, no token, or an IAM signature.
//!
//! template.yaml states the same in each route's `Auth` (scripts/template_checks holds the two
//! together). In AWS the authorizer refuses before any function runs, so the functions never
//! check a user route's scope; the dev server plays that check in front of the very same
//! routers ([`RouteAuth::admit`]), and the OpenAPI document's security is written from it.

use crate::http::auth::Identity;
use crate::http::error::ApiError;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::LazyLock;

/// Who may call a route, as its authorizer decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Auth {
    /// Anyone (`Authorizer: NONE`).
    None,
    /// A valid JWT (`JwtAuthorizer`), holding one of the route's scopes when it names any.
    Jwt,
    /// A SigV4 signature (`AWS_IAM`). There is no IAM locally: the dev server checks none.
    Iam,
}

/// One row of `functions/routes.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteAuth {
    pub auth: Auth,
    /// The route's `AuthorizationScopes`: a token needs at least one of them (none: any valid
    /// token).
    #[serde(default)]
    pub scopes: Vec<String>,
}

impl RouteAuth {
    /// What the authorizer does with this caller (`None`: no valid token): `Ok` with the
    /// route's scopes the token holds (API Gateway's `jwt.scopes`), or the refusal, 401 for no
    /// valid token and 403 for a token without any of the route's scopes.
    pub fn admit(&self, identity: Option<&Identity>) -> Result<Vec<String>, ApiError> {
        if self.auth != Auth::Jwt {
            return Ok(Vec::new());
        }
        let identity = identity
            .ok_or_else(|| ApiError::Unauthorized("a valid bearer token is required".into()))?;
        let held: Vec<String> = self
            .scopes
            .iter()
            .filter(|s| identity.has_scope(s))
            .cloned()
            .collect();
        if self.scopes.is_empty() || !held.is_empty() {
            Ok(held)
        } else {
            Err(ApiError::Forbidden(format!(
                "this route needs the {} scope",
                self.scopes.join(" or ")
            )))
        }
    }
}

/// The file as it reads: route key -> row.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Table {
    routes: BTreeMap<String, RouteAuth>,
}

/// Every route, by (method, path pattern), the path as the routers and the OpenAPI document
/// write it (`/activities/{activityId}/orders`).
static ROUTES: LazyLock<BTreeMap<(String, String), RouteAuth>> = LazyLock::new(|| {
    let table: Table = toml::from_str(include_str!("../../../functions/routes.toml"))
        .expect("functions/routes.toml reads as a [routes] table of route keys");
    table
        .routes
        .into_iter()
        .map(|(key, row)| {
            let (method, path) = key
                .split_once(' ')
                .filter(|(m, p)| is_method(m) && p.starts_with('/') && !p.contains(' '))
                .unwrap_or_else(|| panic!("functions/routes.toml: {key:?} is not `METHOD /path`"));
            assert!(
                row.auth == Auth::Jwt || row.scopes.is_empty(),
                "functions/routes.toml: {key}: only a jwt route names scopes"
            );
            ((method.to_string(), path.to_string()), row)
        })
        .collect()
});

fn is_method(m: &str) -> bool {
    matches!(m, "GET" | "POST" | "PUT" | "PATCH" | "DELETE")
}

/// The row of `method` on `path` (a pattern, as the router matched it). A `HEAD` the router
/// serves with its `GET` handler takes the `GET` route's row.
pub fn route(method: &str, path: &str) -> Option<&'static RouteAuth> {
    let find = |m: &str| ROUTES.get(&(m.to_string(), path.to_string()));
    find(method).or_else(|| (method == "HEAD").then(|| find("GET")).flatten())
}

/// Every row: (method, path pattern, what it asks).
pub fn all() -> impl Iterator<Item = (&'static str, &'static str, &'static RouteAuth)> {
    ROUTES
        .iter()
        .map(|((m, p), row)| (m.as_str(), p.as_str(), row))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::auth::{ADMIN_SCOPE, USER_SCOPE};
    use lambda_http::request::RequestContext;

    fn who(scopes: &[&str]) -> Identity {
        Identity {
            user_id: "alice".into(),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn code(r: Result<Vec<String>, ApiError>) -> Result<Vec<String>, &'static str> {
        r.map_err(|e| e.code())
    }

    #[test]
    fn the_table_reads_and_names_only_the_two_scopes_tokens_carry() {
        assert!(all().count() > 0);
        for (method, path, row) in all() {
            for scope in &row.scopes {
                assert!(
                    [USER_SCOPE, ADMIN_SCOPE].contains(&scope.as_str()),
                    "{method} {path}: {scope}"
                );
            }
            // The admin function checks the same literal (`Admin`), whatever the authorizer.
            if path.starts_with("/admin/") {
                assert_eq!(row.scopes, [ADMIN_SCOPE], "{method} {path}");
            }
        }
    }

    /// The route, the token's scopes (`None`: no valid token), the scopes it is admitted with
    /// or the refusal's code.
    type Case = (
        &'static str,
        &'static str,
        Option<&'static [&'static str]>,
        Result<&'static [&'static str], &'static str>,
    );

    /// One row per case.
    #[rustfmt::skip]
    const CASES: &[Case] = &[
        ("POST", "/activities/{activityId}/orders", None, Err("unauthorized")),
        ("POST", "/activities/{activityId}/orders", Some(&[]), Err("forbidden")),
        ("POST", "/activities/{activityId}/orders", Some(&[ADMIN_SCOPE]), Err("forbidden")),
        ("POST", "/activities/{activityId}/orders", Some(&[USER_SCOPE]), Ok(&[USER_SCOPE])),
        ("POST", "/activities/{activityId}/orders", Some(&[USER_SCOPE, ADMIN_SCOPE]), Ok(&[USER_SCOPE])),
        ("GET", "/admin/ops", Some(&[USER_SCOPE]), Err("forbidden")),
        ("GET", "/admin/ops", Some(&[USER_SCOPE, ADMIN_SCOPE]), Ok(&[ADMIN_SCOPE])),
        ("HEAD", "/admin/ops", Some(&[USER_SCOPE]), Err("forbidden")),
        ("GET", "/activities/{activityId}", None, Ok(&[])),
        ("POST", "/payments/webhook", None, Ok(&[])),
        ("GET", "/health/deep", None, Ok(&[])),
    ];

    #[test]
    fn each_route_admits_as_its_authorizer_would() {
        for (method, path, scopes, want) in CASES {
            let row = route(method, path).unwrap_or_else(|| panic!("{method} {path}: no row"));
            let identity = scopes.map(who);
            let got = code(row.admit(identity.as_ref()));
            let want = want.map(|s| s.iter().map(|s| s.to_string()).collect::<Vec<_>>());
            assert_eq!(got, want, "{method} {path} with {scopes:?}");
        }
        assert_eq!(route("DELETE", "/admin/ops"), None);
        assert_eq!(route("GET", "/activities/1"), None, "a pattern, not a path");
    }

    /// The `events/` fixtures are what API Gateway hands a function after its authorizer
    /// admitted the request: each carries what its route asks.
    #[test]
    fn every_api_gateway_event_fixture_carries_what_its_route_asks() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../events");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).expect("events/") {
            let path = entry.expect("an entry").path();
            let event: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&path).expect("readable"))
                    .expect("JSON");
            let Some((method, route_path)) =
                event["routeKey"].as_str().and_then(|k| k.split_once(' '))
            else {
                continue;
            };
            let name = path.display();
            let row = route(method, route_path).unwrap_or_else(|| panic!("{name}: no row"));
            let ctx = serde_json::from_value(event["requestContext"].clone())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let identity = Identity::from_context(&RequestContext::ApiGatewayV2(ctx));
            let admitted = row.admit(identity.as_ref());
            assert!(admitted.is_ok(), "{name}: {admitted:?}");
            let scopes = &event["requestContext"]["authorizer"]["jwt"]["scopes"];
            if row.auth == Auth::Jwt {
                assert_eq!(
                    scopes,
                    &serde_json::json!(admitted.unwrap()),
                    "{name}: jwt.scopes are the route's scopes the token holds"
                );
            }
            seen += 1;
        }
        assert!(seen >= 10, "{seen} API Gateway events");
    }
}
