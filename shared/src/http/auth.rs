//! Who is calling: read only from the verified JWT's claims in the request context.
//!
//! In AWS, the HTTP API's JWT authorizer verifies the token and lambda_http puts its claims in
//! the request's [`RequestContext`]. Locally, the dev server verifies HS256 tokens with
//! [`JwtVerifier`] and attaches the very same context with [`request_context`], so handler
//! code never reads identity from a body or a header the client controls.

use crate::http::error::ApiError;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use lambda_http::request::RequestContext;
use serde::{Deserialize, Serialize};

/// The scope that grants the admin routes.
pub const ADMIN_SCOPE: &str = "seckill:admin";

/// The scope the user routes (purchase, my order, pay, cancel) need: template.yaml's
/// `UserScope`, checked by the JWT authorizer (`functions/routes.toml`), not by the functions.
pub const USER_SCOPE: &str = "seckill:user";

/// The `scope` claim of a token as the user pool issues it: every buyer's holds
/// [`USER_SCOPE`]; an operator's [`ADMIN_SCOPE`] as well, so one token serves both kinds of
/// route.
pub fn issued_scope(admin: bool) -> String {
    if admin {
        format!("{USER_SCOPE} {ADMIN_SCOPE}")
    } else {
        USER_SCOPE.to_string()
    }
}

/// The verified caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The token's `sub` claim.
    pub user_id: String,
    pub scopes: Vec<String>,
}

impl Identity {
    pub fn has_scope(&self, scope: &str) -> bool {
        self.scopes.iter().any(|s| s == scope)
    }

    /// Reads the identity from an API Gateway request context, if it carries JWT claims.
    pub fn from_context(ctx: &RequestContext) -> Option<Self> {
        #[allow(irrefutable_let_patterns)]
        let RequestContext::ApiGatewayV2(ctx) = ctx
        else {
            return None;
        };
        let jwt = ctx.authorizer.as_ref()?.jwt.as_ref()?;
        let user_id = jwt.claims.get("sub")?.trim().to_string();
        if user_id.is_empty() || user_id.len() > 128 {
            return None;
        }
        let mut scopes: Vec<String> = jwt
            .claims
            .get("scope")
            .map(|s| s.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default();
        scopes.extend(jwt.scopes.iter().flatten().cloned());
        Some(Self { user_id, scopes })
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Identity {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<RequestContext>()
            .and_then(Identity::from_context)
            .ok_or_else(|| ApiError::Unauthorized("a valid bearer token is required".into()))
    }
}

/// A caller holding the admin scope (`seckill:admin`); others get 403, no token 401.
#[derive(Clone, Debug)]
pub struct Admin(pub Identity);

impl<S: Send + Sync> FromRequestParts<S> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let identity = Identity::from_request_parts(parts, state).await?;
        if identity.has_scope(ADMIN_SCOPE) {
            Ok(Admin(identity))
        } else {
            Err(ApiError::Forbidden(format!(
                "this route needs the {ADMIN_SCOPE} scope"
            )))
        }
    }
}

/// The claims we issue and accept locally.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Claims {
    pub sub: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub scope: String,
    pub exp: u64,
    #[serde(default)]
    pub iat: u64,
}

/// Verifies HS256 tokens the way the HTTP API's JWT authorizer verifies RS256 ones.
#[derive(Clone)]
pub struct JwtVerifier {
    key: DecodingKey,
    validation: Validation,
}

impl JwtVerifier {
    pub fn new(secret: &str) -> anyhow::Result<Self> {
        anyhow::ensure!(!secret.is_empty(), "SECKILL_JWT_SECRET must not be empty");
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "sub"]);
        // A token may carry `nbf` (not before); one not yet valid is refused like an expired
        // one, with the same leeway for clock skew.
        validation.validate_nbf = true;
        validation.leeway = 5;
        Ok(Self {
            key: DecodingKey::from_secret(secret.as_bytes())?,
            validation,
        })
    }

    /// Checks an `Authorization` header value (`Bearer <jwt>`).
    pub fn verify_header(&self, header: Option<&str>) -> Result<Claims, ApiError> {
        let header = header.ok_or_else(|| ApiError::Unauthorized("missing bearer token".into()))?;
        let token = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .ok_or_else(|| ApiError::Unauthorized("expected 'Bearer <token>'".into()))?;
        jsonwebtoken::decode::<Claims>(token.trim(), &self.key, &self.validation)
            .map(|data| data.claims)
            .map_err(|e| ApiError::Unauthorized(format!("invalid token: {e}")))
    }
}

/// Signs a token for local use (`make token`, tests, the load generator).
pub fn mint(secret: &str, sub: &str, scope: &str, ttl_secs: u64) -> anyhow::Result<String> {
    let now = chrono::Utc::now().timestamp() as u64;
    let claims = Claims {
        sub: sub.to_string(),
        scope: scope.to_string(),
        exp: now + ttl_secs,
        iat: now,
    };
    Ok(jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes())?,
    )?)
}

/// Builds the request context API Gateway's JWT authorizer would attach for these claims.
pub fn request_context(claims: Option<&Claims>, method: &str, path: &str) -> RequestContext {
    let mut ctx = serde_json::json!({
        "routeKey": "$default",
        "stage": "$default",
        "requestId": uuid::Uuid::new_v4().to_string(),
        "http": { "method": method, "path": path, "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1" },
        "timeEpoch": chrono::Utc::now().timestamp_millis(),
    });
    if let Some(c) = claims {
        let mut map = serde_json::Map::new();
        map.insert("sub".into(), c.sub.clone().into());
        if !c.scope.is_empty() {
            map.insert("scope".into(), c.scope.clone().into());
        }
        map.insert("exp".into(), c.exp.to_string().into());
        ctx["authorizer"] = serde_json::json!({ "jwt": { "claims": map } });
    }
    RequestContext::ApiGatewayV2(
        serde_json::from_value(ctx).expect("a well-formed API Gateway v2 request context"),
    )
}
