//! Credentials read from Secrets Manager, once per cold start (AWS only).
//!
//! The template hands the functions secret *ARNs*, never values (see
//! [`crate::infra::config::SecretRefs`]): the database credentials as RDS writes them
//! ([`DatabaseSecret`]), each function's Redis login ([`RedisLogin`]) and, for `seckill-migrate`
//! only, the login roles' passwords ([`RoleSecret`]). The database URL built here says
//! `sslmode=verify-full`: the certificate must chain to the CA bundle and name the proxy.
//! Every value read here is a [`SecretString`] or a [`SecretUrl`], so nothing of it prints.

use crate::infra::secret::{encode, ExposeSecret, SecretString, SecretUrl};
use serde::Deserialize;
use std::time::Duration;

/// Bound on one Secrets Manager read: a cold start must fail visibly, not hang.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The database secret as RDS / `SecretTargetAttachment` write it.
#[derive(Clone, Debug, Deserialize)]
pub struct DatabaseSecret {
    pub username: String,
    pub password: SecretString,
    #[serde(default)]
    pub host: Option<String>,
    #[serde(default, deserialize_with = "port_from_number_or_string")]
    pub port: Option<u16>,
    #[serde(default)]
    pub dbname: Option<String>,
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
    pub fn database_url(&self, host_override: Option<&str>) -> anyhow::Result<SecretUrl> {
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
        Ok(SecretUrl::new(format!(
            "postgres://{}:{}@{}:{port}/{}?sslmode=verify-full",
            encode(&self.username),
            encode(self.password.expose_secret()),
            host.trim(),
            encode(dbname)
        )))
    }
}

/// A function role's credentials, from one of `DATABASE_ROLE_SECRET_ARNS`' secrets: the
/// username must be one of [`crate::infra::db::ROLES`], so no secret can make seckill-migrate change
/// the password of another user (the master's, say).
#[derive(Clone, Debug)]
pub struct RoleSecret {
    pub role: &'static str,
    pub password: SecretString,
}

impl PartialEq for RoleSecret {
    fn eq(&self, other: &Self) -> bool {
        self.role == other.role && self.password.expose_secret() == other.password.expose_secret()
    }
}

impl RoleSecret {
    /// `{"username": "seckill_entry", "password": "..."}` (other fields, as RDS's rotation
    /// templates add, are ignored).
    pub fn parse(secret_string: &str) -> anyhow::Result<Self> {
        let secret = DatabaseSecret::parse(secret_string)?;
        let role = crate::infra::db::ROLES
            .into_iter()
            .find(|r| *r == secret.username)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "role secret names user {:?}, which is not one of the functions' roles ({})",
                    secret.username,
                    crate::infra::db::ROLES.join(", ")
                )
            })?;
        anyhow::ensure!(
            !secret.password.expose_secret().is_empty(),
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

/// The role secrets of `DATABASE_ROLE_SECRET_ARNS`, each checked ([`RoleSecret::parse`]), no
/// role twice.
pub async fn role_secrets(arns: &[String]) -> anyhow::Result<Vec<RoleSecret>> {
    if arns.is_empty() {
        return Ok(Vec::new());
    }
    let client = client().await;
    let mut secrets = Vec::with_capacity(arns.len());
    for arn in arns {
        let secret = RoleSecret::parse(&read(&client, arn).await?)
            .map_err(|e| anyhow::anyhow!("secret {arn}: {e}"))?;
        secrets.push(secret);
    }
    distinct_roles(&secrets)?;
    Ok(secrets)
}

/// A function's Redis login from its secret: JSON `{"username": "seckill-entry", "token": "..."}`
/// (the function's own ElastiCache user, whose access string allows only what it runs), or
/// `{"token": "..."}` / the bare token (a cluster-wide AUTH token, the default user).
#[derive(Clone, Debug)]
pub struct RedisLogin {
    pub username: Option<String>,
    pub token: SecretString,
}

impl RedisLogin {
    pub fn parse(secret_string: &str) -> anyhow::Result<Self> {
        let trimmed = secret_string.trim();
        let (username, token) = if trimmed.starts_with('{') {
            #[derive(Deserialize)]
            struct Login {
                #[serde(default)]
                username: Option<String>,
                token: String,
            }
            let login = serde_json::from_str::<Login>(trimmed).map_err(|_| {
                anyhow::anyhow!("redis auth secret is JSON without a string \"token\"")
            })?;
            (login.username, login.token)
        } else {
            (None, trimmed.to_string())
        };
        anyhow::ensure!(!token.is_empty(), "redis auth secret is empty");
        let username = username.map(|u| u.trim().to_string());
        anyhow::ensure!(
            username.as_deref().is_none_or(|u| !u.is_empty()),
            "redis auth secret has a blank username"
        );
        Ok(Self {
            username,
            token: SecretString::from(token),
        })
    }

    /// `url` logged in as this login: its user name (when the secret names one, else the URL's)
    /// and its token as the password.
    pub fn apply(&self, url: &SecretUrl) -> anyhow::Result<SecretUrl> {
        let (scheme, rest) = url
            .expose()
            .split_once("://")
            .ok_or_else(|| anyhow::anyhow!("redis url has no scheme: {url:?}"))?;
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        let (url_user, host) = match authority.rsplit_once('@') {
            Some((userinfo, host)) => (userinfo.split(':').next().unwrap_or(""), host),
            None => ("", authority),
        };
        anyhow::ensure!(!host.is_empty(), "redis url has no host: {url:?}");
        let user = match &self.username {
            Some(name) => encode(name),
            None => url_user.to_string(),
        };
        let password = encode(self.token.expose_secret());
        Ok(SecretUrl::new(format!(
            "{scheme}://{user}:{password}@{host}{tail}"
        )))
    }
}

/// A Secrets Manager client from the standard AWS configuration
/// (`AWS_ENDPOINT_URL_SECRETS_MANAGER` points it elsewhere).
pub async fn client() -> aws_sdk_secretsmanager::Client {
    let sdk = aws_config::load_from_env().await;
    aws_sdk_secretsmanager::Client::new(&sdk)
}

/// The `SecretString` of the secret `arn`, bounded by `READ_TIMEOUT`.
pub async fn read(client: &aws_sdk_secretsmanager::Client, arn: &str) -> anyhow::Result<String> {
    read_stage(client, arn, "AWSCURRENT").await
}

/// The `SecretString` of the version of `arn` labelled `stage` (`AWSCURRENT`, `AWSPREVIOUS`).
pub async fn read_stage(
    client: &aws_sdk_secretsmanager::Client,
    arn: &str,
    stage: &str,
) -> anyhow::Result<String> {
    Ok(read_version(client, arn, stage).await?.0)
}

/// The `SecretString` of the version of `arn` labelled `stage`, and when that version was
/// created (`None` when Secrets Manager does not say).
pub async fn read_version(
    client: &aws_sdk_secretsmanager::Client,
    arn: &str,
    stage: &str,
) -> anyhow::Result<(String, Option<chrono::DateTime<chrono::Utc>>)> {
    let call = client
        .get_secret_value()
        .secret_id(arn)
        .version_stage(stage)
        .send();
    let out = tokio::time::timeout(READ_TIMEOUT, call)
        .await
        .map_err(|_| anyhow::anyhow!("reading secret {arn} timed out after {READ_TIMEOUT:?}"))?
        .map_err(|e| {
            anyhow::anyhow!(
                "reading secret {arn} failed: {}",
                aws_sdk_secretsmanager::error::DisplayErrorContext(&e)
            )
        })?;
    let created = out
        .created_date
        .and_then(|d| chrono::DateTime::from_timestamp(d.secs(), d.subsec_nanos()));
    let value = out
        .secret_string
        .ok_or_else(|| anyhow::anyhow!("secret {arn} has no SecretString"))?;
    Ok((value, created))
}

/// The database URL from the credentials secret `arn` (its host replaced by `host` when set),
/// for a process that needs the database only.
pub async fn database_url_from_secret(arn: &str, host: Option<&str>) -> anyhow::Result<SecretUrl> {
    let url = DatabaseSecret::parse(&read(&client().await, arn).await?)?.database_url(host)?;
    tracing::info!(database = ?url, "database credentials read from Secrets Manager");
    Ok(url)
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
    fn a_redis_login_reads_json_with_or_without_a_user_or_a_bare_token() {
        let login = RedisLogin::parse(r#"{"username":"seckill-entry","token":"abc123"}"#).unwrap();
        assert_eq!(login.username.as_deref(), Some("seckill-entry"));
        assert_eq!(login.token.expose_secret(), "abc123");
        let login = RedisLogin::parse(r#"{"token":"abc123"}"#).unwrap();
        assert_eq!(
            (login.username, login.token.expose_secret()),
            (None, "abc123")
        );
        let login = RedisLogin::parse("  abc123\n").unwrap();
        assert_eq!(
            (login.username, login.token.expose_secret()),
            (None, "abc123")
        );
        assert!(RedisLogin::parse(r#"{"password":"x"}"#).is_err());
        assert!(RedisLogin::parse(r#"{"username":" ","token":"x"}"#).is_err());
        assert!(RedisLogin::parse("").is_err());
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
