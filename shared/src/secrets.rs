//! Connection secrets, read from Secrets Manager once per cold start.
//!
//! In AWS the template hands the functions secret *ARNs* (parsed into [`Config::secrets`]), never secret values:
//! `DATABASE_SECRET_ARN` (JSON `username`, `password`, optionally `host`, `port`, `dbname`, as RDS
//! writes it) plus `DATABASE_HOST` (the RDS Proxy endpoint, which wins over the secret's host),
//! and `REDIS_AUTH_SECRET_ARN` (JSON `{"token": ...}` or the bare token) for the ElastiCache
//! AUTH token. [`resolve`] reads them and rewrites [`Config::database_url`] and the Redis URLs.
//! Locally neither ARN is set and nothing happens, so no AWS call is made.
//!
//! The database URL built here says `sslmode=verify-full`: the server's certificate must chain
//! to the CA bundle (see [`crate::db`]) and name the host, the RDS Proxy endpoint.
//!
//! `DATABASE_ROLE_SECRET_ARNS` names the secrets of the functions' login roles
//! ([`crate::db::ROLES`]); only `seckill-migrate` reads them ([`role_secrets`]), to set each
//! role's password after migrating.
//!
//! A URL built here carries a password: log it only through [`redacted`].

use crate::config::{Config, RedisTopology};
use serde::Deserialize;
use std::time::Duration;

/// Bound on one Secrets Manager read: a cold start must fail visibly, not hang.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Which secrets this process should read: part of [`Config`], parsed with it.
#[derive(Clone, Debug, Default, PartialEq, Eq, clap::Args)]
pub struct SecretRefs {
    /// Secrets Manager ARN of the database credentials (JSON username, password, host, port,
    /// dbname); replaces DATABASE_URL. Set by the template in AWS; unset locally.
    #[arg(
        long = "database-secret-arn",
        env = "DATABASE_SECRET_ARN",
        value_name = "DATABASE_SECRET_ARN",
        value_parser = crate::config::non_blank
    )]
    pub database_secret_arn: Option<String>,
    /// Host that overrides the secret's (the RDS Proxy endpoint in AWS).
    #[arg(
        long = "database-host",
        env = "DATABASE_HOST",
        value_name = "DATABASE_HOST",
        value_parser = crate::config::non_blank
    )]
    pub database_host: Option<String>,
    /// Secrets Manager ARN of the Redis AUTH token, put into every REDIS_URL. Unset locally.
    #[arg(
        long = "redis-auth-secret-arn",
        env = "REDIS_AUTH_SECRET_ARN",
        value_name = "REDIS_AUTH_SECRET_ARN",
        value_parser = crate::config::non_blank
    )]
    pub redis_auth_secret_arn: Option<String>,
    /// Comma-separated Secrets Manager ARNs of the functions' database roles, each secret JSON
    /// {"username": "seckill_entry", "password": "..."}. Read by seckill-migrate only, which
    /// sets each role's password after migrating; the functions ignore it.
    #[arg(
        long = "database-role-secret-arns",
        env = "DATABASE_ROLE_SECRET_ARNS",
        value_name = "DATABASE_ROLE_SECRET_ARNS",
        value_delimiter = ',',
        value_parser = crate::config::trimmed_non_blank
    )]
    pub database_role_secret_arns: Vec<String>,
}

impl SecretRefs {
    /// Whether [`resolve_refs`] has nothing to read (the role secrets are not its to read).
    pub fn is_empty(&self) -> bool {
        self.database_secret_arn.is_none() && self.redis_auth_secret_arn.is_none()
    }
}

/// The database secret as RDS / `SecretTargetAttachment` write it. `Debug` hides the password.
#[derive(Clone, Deserialize, PartialEq, Eq)]
pub struct DatabaseSecret {
    pub username: String,
    pub password: String,
    #[serde(default)]
    pub host: Option<String>,
    #[serde(default, deserialize_with = "port_from_number_or_string")]
    pub port: Option<u16>,
    #[serde(default)]
    pub dbname: Option<String>,
}

impl std::fmt::Debug for DatabaseSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseSecret")
            .field("username", &self.username)
            .field("password", &"***")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("dbname", &self.dbname)
            .finish()
    }
}

fn port_from_number_or_string<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<u16>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Port {
        N(u16),
        S(String),
    }
    match Option::<Port>::deserialize(d)? {
        None => Ok(None),
        Some(Port::N(n)) => Ok(Some(n)),
        Some(Port::S(s)) => s.trim().parse().map(Some).map_err(serde::de::Error::custom),
    }
}

impl DatabaseSecret {
    pub fn parse(secret_string: &str) -> anyhow::Result<Self> {
        // The serde error could quote the input; keep it out of the message.
        serde_json::from_str(secret_string).map_err(|e| {
            anyhow::anyhow!(
                "database secret is not JSON with username and password (line {}, column {})",
                e.line(),
                e.column()
            )
        })
    }

    /// `postgres://user:password@host:port/dbname?sslmode=verify-full`, every part
    /// percent-encoded. `host_override` (DATABASE_HOST, the proxy) wins over the secret's host,
    /// and is the name the server's certificate must carry.
    pub fn database_url(&self, host_override: Option<&str>) -> anyhow::Result<String> {
        let host = host_override
            .or(self.host.as_deref())
            .filter(|h| !h.trim().is_empty())
            .ok_or_else(|| {
                anyhow::anyhow!("no database host: set DATABASE_HOST or put host in the secret")
            })?;
        let port = self.port.unwrap_or(5432);
        let dbname = self.dbname.as_deref().unwrap_or("seckill");
        // TLS with the certificate checked against the CA bundle and the host name: `require`
        // would encrypt to whoever answers on the address.
        Ok(format!(
            "postgres://{}:{}@{}:{port}/{}?sslmode=verify-full",
            encode(&self.username),
            encode(&self.password),
            host.trim(),
            encode(dbname)
        ))
    }
}

/// A function role's credentials, from one of `DATABASE_ROLE_SECRET_ARNS`' secrets: the
/// username must be one of [`crate::db::ROLES`], so no secret can make seckill-migrate change
/// the password of another user (the master's, say). `Debug` hides the password.
#[derive(Clone, PartialEq, Eq)]
pub struct RoleSecret {
    pub role: &'static str,
    pub password: String,
}

impl std::fmt::Debug for RoleSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoleSecret")
            .field("role", &self.role)
            .field("password", &"***")
            .finish()
    }
}

impl RoleSecret {
    /// `{"username": "seckill_entry", "password": "..."}` (other fields, as RDS's rotation
    /// templates add, are ignored).
    pub fn parse(secret_string: &str) -> anyhow::Result<Self> {
        let secret = DatabaseSecret::parse(secret_string)?;
        let role = crate::db::ROLES
            .into_iter()
            .find(|r| *r == secret.username)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "role secret names user {:?}, which is not one of the functions' roles ({})",
                    secret.username,
                    crate::db::ROLES.join(", ")
                )
            })?;
        anyhow::ensure!(
            !secret.password.is_empty(),
            "role secret of {role} has an empty password"
        );
        Ok(Self {
            role,
            password: secret.password,
        })
    }
}

/// Checks that no role is named twice: two secrets for one role would race on its password.
pub fn distinct_roles(secrets: &[RoleSecret]) -> anyhow::Result<()> {
    for (i, s) in secrets.iter().enumerate() {
        anyhow::ensure!(
            !secrets[..i].iter().any(|t| t.role == s.role),
            "DATABASE_ROLE_SECRET_ARNS names two secrets of {}",
            s.role
        );
    }
    Ok(())
}

/// Reads and checks every secret of `arns` ([`RoleSecret::parse`], [`distinct_roles`]); an
/// error names the ARN it is about, never a password.
pub async fn role_secrets(arns: &[String]) -> anyhow::Result<Vec<RoleSecret>> {
    if arns.is_empty() {
        return Ok(Vec::new());
    }
    let sdk = aws_config::load_from_env().await;
    let client = aws_sdk_secretsmanager::Client::new(&sdk);
    let mut secrets = Vec::with_capacity(arns.len());
    for arn in arns {
        let secret = RoleSecret::parse(&read(&client, arn).await?)
            .map_err(|e| anyhow::anyhow!("secret {arn}: {e}"))?;
        secrets.push(secret);
    }
    distinct_roles(&secrets)?;
    Ok(secrets)
}

/// The Redis AUTH token from its secret: `{"token": "..."}` (what the template generates) or the
/// bare string.
pub fn redis_token(secret_string: &str) -> anyhow::Result<String> {
    let trimmed = secret_string.trim();
    let token = if trimmed.starts_with('{') {
        #[derive(Deserialize)]
        struct Token {
            token: String,
        }
        serde_json::from_str::<Token>(trimmed)
            .map_err(|_| anyhow::anyhow!("redis auth secret is JSON without a string \"token\""))?
            .token
    } else {
        trimmed.to_string()
    };
    anyhow::ensure!(!token.is_empty(), "redis auth secret is empty");
    Ok(token)
}

/// `url` with `token` as its password (`rediss://:token@host:port`), replacing any credentials
/// already in it. ElastiCache AUTH tokens have no user name.
pub fn with_redis_password(url: &str, token: &str) -> anyhow::Result<String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| anyhow::anyhow!("redis url has no scheme: {}", redacted(url)))?;
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (user, host) = match authority.rsplit_once('@') {
        Some((userinfo, host)) => (userinfo.split(':').next().unwrap_or(""), host),
        None => ("", authority),
    };
    anyhow::ensure!(!host.is_empty(), "redis url has no host: {}", redacted(url));
    Ok(format!("{scheme}://{user}:{}@{host}{tail}", encode(token)))
}

/// `url` safe for a log line: the password in its user info and any `password=` / `token=` /
/// `auth=` query value become `***`. Anything that is not a URL is returned as `***` whole,
/// since we cannot tell which part is secret.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "***".into();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{host}"),
            None => format!("{userinfo}@{host}"),
        },
        None => authority.to_string(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((k, _))
                        if ["password", "token", "auth", "pass"]
                            .contains(&k.to_ascii_lowercase().as_str()) =>
                    {
                        format!("{k}=***")
                    }
                    _ => pair.to_string(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_string(),
    };
    format!("{scheme}://{authority}{tail}")
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Puts the Redis token into every URL of the topology.
pub fn apply_redis_token(topology: &RedisTopology, token: &str) -> anyhow::Result<RedisTopology> {
    Ok(match topology {
        RedisTopology::Standalone(url) => {
            RedisTopology::Standalone(with_redis_password(url, token)?)
        }
        RedisTopology::Cluster(nodes) => RedisTopology::Cluster(
            nodes
                .iter()
                .map(|n| with_redis_password(n, token))
                .collect::<anyhow::Result<_>>()?,
        ),
    })
}

async fn read(client: &aws_sdk_secretsmanager::Client, arn: &str) -> anyhow::Result<String> {
    let call = client.get_secret_value().secret_id(arn).send();
    let out = tokio::time::timeout(READ_TIMEOUT, call)
        .await
        .map_err(|_| anyhow::anyhow!("reading secret {arn} timed out after {READ_TIMEOUT:?}"))?
        .map_err(|e| {
            anyhow::anyhow!(
                "reading secret {arn} failed: {}",
                aws_sdk_secretsmanager::error::DisplayErrorContext(&e)
            )
        })?;
    out.secret_string
        .ok_or_else(|| anyhow::anyhow!("secret {arn} has no SecretString"))
}

/// Reads the secrets `refs` names with `client` and rewrites the config's database URL and Redis
/// URLs. Does nothing (and calls nothing) when no ARN is set.
pub async fn resolve_with(
    config: &mut Config,
    refs: &SecretRefs,
    client: &aws_sdk_secretsmanager::Client,
) -> anyhow::Result<()> {
    if let Some(arn) = &refs.database_secret_arn {
        let secret = DatabaseSecret::parse(&read(client, arn).await?)?;
        config.database_url = secret.database_url(refs.database_host.as_deref())?;
        tracing::info!(
            database = %redacted(&config.database_url),
            "database credentials read from Secrets Manager"
        );
    }
    if let Some(arn) = &refs.redis_auth_secret_arn {
        let token = redis_token(&read(client, arn).await?)?;
        config.redis = apply_redis_token(&config.redis, &token)?;
        tracing::info!("redis auth token read from Secrets Manager");
    }
    Ok(())
}

/// The database URL from the credentials secret `arn` (its host replaced by `host` when set),
/// for a process that needs the database only.
pub async fn database_url_from_secret(arn: &str, host: Option<&str>) -> anyhow::Result<String> {
    let sdk = aws_config::load_from_env().await;
    let client = aws_sdk_secretsmanager::Client::new(&sdk);
    let url = DatabaseSecret::parse(&read(&client, arn).await?)?.database_url(host)?;
    tracing::info!(database = %redacted(&url), "database credentials read from Secrets Manager");
    Ok(url)
}

/// [`resolve_refs`] with the secret references the config was parsed with.
pub async fn resolve(config: &mut Config) -> anyhow::Result<()> {
    let refs = config.secrets.clone();
    resolve_refs(config, &refs).await
}

/// [`resolve_with`] with a client built from the standard AWS configuration
/// (`AWS_ENDPOINT_URL_SECRETS_MANAGER` points it elsewhere). Builds nothing when `refs` is empty.
pub async fn resolve_refs(config: &mut Config, refs: &SecretRefs) -> anyhow::Result<()> {
    if refs.is_empty() {
        return Ok(());
    }
    let sdk = aws_config::load_from_env().await;
    let client = aws_sdk_secretsmanager::Client::new(&sdk);
    resolve_with(config, refs, &client).await
}

#[cfg(test)]
mod tests {
    use super::*;

    const RDS_SECRET: &str = r#"{"username":"seckill","password":"p@ss:w/rd?#%","engine":"postgres",
        "host":"seckill.cluster-abc.us-east-1.rds.amazonaws.com","port":5432,"dbname":"seckill",
        "dbClusterIdentifier":"seckill"}"#;

    #[test]
    fn database_url_prefers_the_proxy_host_and_verifies_its_certificate() {
        let secret = DatabaseSecret::parse(RDS_SECRET).unwrap();
        let url = secret
            .database_url(Some("seckill-proxy.proxy-abc.us-east-1.rds.amazonaws.com"))
            .unwrap();
        assert_eq!(
            url,
            "postgres://seckill:p%40ss%3Aw%2Frd%3F%23%25@seckill-proxy.proxy-abc.us-east-1.rds.amazonaws.com:5432/seckill?sslmode=verify-full"
        );
    }

    #[test]
    fn database_url_falls_back_to_the_secrets_host_port_and_name() {
        let secret = DatabaseSecret::parse(
            r#"{"username":"u","password":"pw","host":"db.internal","port":"6543","dbname":"orders"}"#,
        )
        .unwrap();
        assert_eq!(
            secret.database_url(None).unwrap(),
            "postgres://u:pw@db.internal:6543/orders?sslmode=verify-full"
        );
    }

    #[test]
    fn database_url_without_any_host_is_an_error() {
        let secret = DatabaseSecret::parse(r#"{"username":"u","password":"pw"}"#).unwrap();
        let err = secret.database_url(None).unwrap_err().to_string();
        assert!(err.contains("DATABASE_HOST"), "{err}");
    }

    #[test]
    fn a_malformed_secret_is_rejected_without_quoting_it() {
        let err = DatabaseSecret::parse(r#"{"username":"u","pasword":"hunter2"}"#)
            .unwrap_err()
            .to_string();
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn debug_output_hides_the_password() {
        let secret = DatabaseSecret::parse(RDS_SECRET).unwrap();
        assert!(!format!("{secret:?}").contains("p@ss"));
    }

    #[test]
    fn redis_token_reads_json_or_a_bare_string() {
        assert_eq!(redis_token(r#"{"token":"abc123"}"#).unwrap(), "abc123");
        assert_eq!(redis_token("  abc123\n").unwrap(), "abc123");
        assert!(redis_token(r#"{"password":"x"}"#).is_err());
        assert!(redis_token("").is_err());
    }

    #[test]
    fn the_token_becomes_the_password_of_every_cluster_node() {
        let topology = RedisTopology::Cluster(vec![
            "rediss://clustercfg.seckill.abc.use1.cache.amazonaws.com:6379".into(),
            "rediss://old:stale@node2:6379/0".into(),
        ]);
        let RedisTopology::Cluster(nodes) = apply_redis_token(&topology, "t0k/en").unwrap() else {
            panic!("still a cluster")
        };
        assert_eq!(
            nodes,
            [
                "rediss://:t0k%2Fen@clustercfg.seckill.abc.use1.cache.amazonaws.com:6379",
                "rediss://old:t0k%2Fen@node2:6379/0",
            ]
        );
    }

    #[test]
    fn a_standalone_url_gets_the_token_too() {
        let topology = RedisTopology::Standalone("redis://127.0.0.1:6379".into());
        assert_eq!(
            apply_redis_token(&topology, "tok").unwrap(),
            RedisTopology::Standalone("redis://:tok@127.0.0.1:6379".into())
        );
    }

    #[test]
    fn redacted_hides_passwords_and_keeps_the_rest() {
        assert_eq!(
            redacted("postgres://seckill:s3cr%40t@proxy:5432/seckill?sslmode=require"),
            "postgres://seckill:***@proxy:5432/seckill?sslmode=require"
        );
        assert_eq!(
            redacted("rediss://:tok@clustercfg:6379"),
            "rediss://:***@clustercfg:6379"
        );
        assert_eq!(
            redacted("postgres://u@h/db?password=hunter2&sslmode=require"),
            "postgres://u@h/db?password=***&sslmode=require"
        );
        assert_eq!(redacted("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redacted("not a url hunter2"), "***");
    }

    #[test]
    fn no_arn_means_no_secret_to_read() {
        assert!(SecretRefs::default().is_empty());
        let roles_only = SecretRefs {
            database_role_secret_arns: vec!["arn:aws:secretsmanager:us-east-1:1:secret:r".into()],
            ..SecretRefs::default()
        };
        assert!(roles_only.is_empty(), "the functions read no role secret");
    }

    #[test]
    fn a_role_secret_names_one_of_the_functions_roles() {
        let s = RoleSecret::parse(r#"{"username":"seckill_entry","password":"pw'; --"}"#).unwrap();
        assert_eq!(
            s,
            RoleSecret {
                role: "seckill_entry",
                password: "pw'; --".into()
            }
        );
        let rds_style = r#"{"engine":"postgres","host":"h","port":5432,"username":"seckill_admin",
            "password":"x","dbname":"seckill"}"#;
        assert_eq!(RoleSecret::parse(rds_style).unwrap().role, "seckill_admin");
    }

    #[test]
    fn a_role_secret_for_any_other_user_is_refused() {
        for username in [
            "postgres",
            "seckill",
            "SECKILL_ENTRY",
            "seckill_entry ",
            "\"x\"; drop",
        ] {
            let json = serde_json::json!({"username": username, "password": "hunter2"});
            let err = RoleSecret::parse(&json.to_string())
                .unwrap_err()
                .to_string();
            assert!(err.contains("not one of the functions' roles"), "{err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
        let err = RoleSecret::parse(r#"{"username":"seckill_entry","password":""}"#).unwrap_err();
        assert!(err.to_string().contains("empty password"), "{err}");
        let err = RoleSecret::parse(r#"{"username":"seckill_entry"}"#).unwrap_err();
        assert!(err.to_string().contains("username and password"), "{err}");
    }

    #[test]
    fn two_secrets_of_one_role_are_refused() {
        let entry = |pw: &str| RoleSecret {
            role: "seckill_entry",
            password: pw.into(),
        };
        let admin = RoleSecret {
            role: "seckill_admin",
            password: "a".into(),
        };
        assert!(distinct_roles(&[entry("a"), admin.clone()]).is_ok());
        let err = distinct_roles(&[entry("a"), admin, entry("b")]).unwrap_err();
        assert!(
            err.to_string().contains("two secrets of seckill_entry"),
            "{err}"
        );
    }

    #[test]
    fn a_role_secrets_debug_hides_the_password() {
        let s = RoleSecret::parse(r#"{"username":"seckill_entry","password":"hunter2"}"#).unwrap();
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
