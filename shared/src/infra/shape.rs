//! The shape each function is deployed with, read from `functions/shape.toml` (compiled in):
//! its Lambda Timeout, the database role and the Redis ACL user it logs in as, and the order
//! consumer's event source. template.yaml states the same values (scripts/check-template.py
//! holds the two together); the dev server and the tests run each function by it, as its role
//! and its Redis user, each invocation stopped at its Timeout.

use crate::infra::aws_secrets::RedisLogin;
use crate::infra::config::Config;
use crate::infra::secret::SecretUrl;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

/// One deployed function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Function {
    Entry,
    Consumer,
    Preheat,
    Reconcile,
    Admin,
    Migrate,
}

impl Function {
    /// Every function, in the order of `functions/shape.toml`.
    pub const ALL: [Function; 6] = [
        Function::Entry,
        Function::Consumer,
        Function::Preheat,
        Function::Reconcile,
        Function::Admin,
        Function::Migrate,
    ];

    /// Its binary, as template.yaml's `Binary` names it (and the metrics' function name).
    pub fn binary(self) -> &'static str {
        match self {
            Function::Entry => "seckill-entry",
            Function::Consumer => "order-consumer",
            Function::Preheat => "preheat",
            Function::Reconcile => "reconcile",
            Function::Admin => "admin",
            Function::Migrate => "seckill-migrate",
        }
    }

    /// How it is deployed.
    pub fn shape(self) -> &'static Shape {
        SHAPES
            .get(self.binary())
            .unwrap_or_else(|| panic!("functions/shape.toml has no [{}]", self.binary()))
    }

    /// Its config on the local stack: `base` (the database owner's and Redis's default user's,
    /// as scripts/env.sh gives them) logged in as the function's database role and Redis ACL
    /// user, with the credentials the local stack creates (the roles log in by the loopback's
    /// trust, the Redis users with `local-<user>`: scripts/stack/redis.sh), as each function's
    /// secrets log it in in AWS. A function with no role (migrate) keeps the owner's.
    pub fn local_config(self, base: &Config) -> anyhow::Result<Config> {
        let shape = self.shape();
        let mut config = base.clone();
        if let Some(role) = &shape.role {
            let mut url = url::Url::parse(config.database_url.expose())?;
            url.set_username(role)
                .map_err(|()| anyhow::anyhow!("the database URL takes no user"))?;
            url.set_password(None)
                .map_err(|()| anyhow::anyhow!("the database URL takes no password"))?;
            config.database_url = SecretUrl::from(url.to_string());
        }
        if self.loads_scripts() {
            config.redis_loader = Some(
                config
                    .redis
                    .with_login(&local_redis_login(LOADER_REDIS_USER))?,
            );
        }
        if let Some(user) = &shape.redis_user {
            config.redis = config.redis.with_login(&local_redis_login(user))?;
        }
        Ok(config)
    }

    /// Whether it loads the scripts into Redis, as the loader user (template.yaml gives it
    /// REDIS_LOADER_SECRET_ARN): preheat at each run, seckill-migrate after migrating.
    pub fn loads_scripts(self) -> bool {
        matches!(self, Function::Preheat | Function::Migrate)
    }
}

/// The Redis user that loads the scripts (scripts/redis_acl.py's loader): SCRIPT LOAD and
/// nothing else.
pub const LOADER_REDIS_USER: &str = "seckill-loader";

impl Function {
    /// This function's config as its binary starts: [`Config::load`] (in AWS, its own secrets
    /// log it in as its role and Redis user), and locally, with `SECKILL_LOCAL_LOGINS=true`
    /// (scripts/env.sh: the local stack's stand-in for those secrets), [`Function::local_config`].
    pub async fn load_config(self) -> anyhow::Result<Config> {
        let config = Config::load().await?;
        match std::env::var(LOCAL_LOGINS).as_deref() {
            Ok("true") => self.local_config(&config),
            Ok("false") | Err(_) => Ok(config),
            Ok(other) => anyhow::bail!("{LOCAL_LOGINS} is true or false, not {other:?}"),
        }
    }
}

/// Whether a binary run locally logs in as its function's role and Redis user.
pub const LOCAL_LOGINS: &str = "SECKILL_LOCAL_LOGINS";

/// The local login of a function's Redis ACL user: scripts/stack/redis.sh creates each user
/// of scripts/redis_acl.py on every local server with the password `local-<user>`.
pub fn local_redis_login(user: &str) -> RedisLogin {
    let login = serde_json::json!({"username": user, "token": format!("local-{user}")});
    RedisLogin::parse(&login.to_string()).expect("a login")
}

/// One function's table of `functions/shape.toml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shape {
    pub timeout_secs: u64,
    /// The PostgreSQL role it logs in as (none: the master user, which only migrate uses).
    pub role: Option<String>,
    /// The Redis ACL user it logs in as (none: it does not use Redis).
    pub redis_user: Option<String>,
    /// The database pool one instance holds (`DB_MAX_CONNECTIONS`); its role's connection
    /// limit is sized by it.
    pub db_max_connections: Option<u32>,
    /// The order consumer's event sources (the orders' queue, the draw entries'): messages a
    /// batch, seconds it waits to fill one, and the most instances SQS runs at once for each.
    pub batch_size: Option<usize>,
    pub batching_window_secs: Option<u64>,
    pub maximum_concurrency: Option<usize>,
}

impl Shape {
    /// The Lambda Timeout: the invocation is stopped there.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs)
    }
}

static SHAPES: LazyLock<BTreeMap<String, Shape>> = LazyLock::new(|| {
    toml::from_str(include_str!("../../../functions/shape.toml"))
        .expect("functions/shape.toml reads as one table per function")
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_function_has_its_table_and_no_table_is_another_s() {
        let named: Vec<&str> = Function::ALL.iter().map(|f| f.binary()).collect();
        let tables: Vec<&str> = SHAPES.keys().map(String::as_str).collect();
        let mut sorted = named.clone();
        sorted.sort();
        assert_eq!(tables, sorted);
        for f in Function::ALL {
            assert!(f.shape().timeout_secs > 0, "{f:?}");
            assert_eq!(f.shape().role.is_none(), f == Function::Migrate, "{f:?}");
        }
        assert_eq!(Function::Consumer.shape().batch_size, Some(10));
    }
}
