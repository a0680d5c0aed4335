//! Which Secrets Manager secrets a process reads at its cold start.

use super::values::trimmed;

/// Which Secrets Manager secrets this process reads at its cold start (AWS only; unset
/// locally, where nothing is read): part of [`Config`](super::Config), parsed with it.
#[derive(Clone, Debug, Default, PartialEq, Eq, clap::Args)]
pub struct SecretRefs {
    /// Secrets Manager ARN of the database credentials (JSON username, password, host, port,
    /// dbname); replaces DATABASE_URL. Set by the template in AWS; unset (or blank) locally.
    #[arg(
        long = "database-secret-arn",
        env = "DATABASE_SECRET_ARN",
        value_name = "DATABASE_SECRET_ARN"
    )]
    pub database_secret_arn: Option<String>,
    /// Host that overrides the secret's (the RDS Proxy endpoint in AWS).
    #[arg(
        long = "database-host",
        env = "DATABASE_HOST",
        value_name = "DATABASE_HOST"
    )]
    pub database_host: Option<String>,
    /// Secrets Manager ARN of this function's Redis login (JSON username + token: its own
    /// ElastiCache user), put into every REDIS_URL. Unset locally.
    #[arg(
        long = "redis-auth-secret-arn",
        env = "REDIS_AUTH_SECRET_ARN",
        value_name = "REDIS_AUTH_SECRET_ARN"
    )]
    pub redis_auth_secret_arn: Option<String>,
    /// Secrets Manager ARN of the script loader's Redis login (JSON username + token: the
    /// `seckill-loader` ElastiCache user, which may load scripts and nothing else). Set for
    /// preheat and seckill-migrate, which load every script on every node; unset locally.
    #[arg(
        long = "redis-loader-secret-arn",
        env = "REDIS_LOADER_SECRET_ARN",
        value_name = "REDIS_LOADER_SECRET_ARN"
    )]
    pub redis_loader_secret_arn: Option<String>,
    /// Comma-separated Secrets Manager ARNs of the functions' database roles, each secret JSON
    /// {"username": "seckill_entry", "password": "..."}. Read by seckill-migrate only, which
    /// sets each role's password after migrating; the functions ignore it.
    #[arg(
        long = "database-role-secret-arns",
        env = "DATABASE_ROLE_SECRET_ARNS",
        value_name = "DATABASE_ROLE_SECRET_ARNS",
        value_delimiter = ',',
        value_parser = trimmed
    )]
    pub database_role_secret_arns: Vec<String>,
}

impl SecretRefs {
    /// A blank reference is no reference: `sam local invoke` can only override variables the
    /// template declares, so `events/env.json` blanks the template's ARNs to run without AWS.
    pub fn drop_blank(&mut self) {
        for reference in [
            &mut self.database_secret_arn,
            &mut self.database_host,
            &mut self.redis_auth_secret_arn,
            &mut self.redis_loader_secret_arn,
        ] {
            if reference.as_deref().is_some_and(|v| v.trim().is_empty()) {
                *reference = None;
            }
        }
        if self
            .database_role_secret_arns
            .iter()
            .all(|arn| arn.is_empty())
        {
            self.database_role_secret_arns.clear();
        }
    }

    /// A list with a blank item (`a,,b`) is a mistake; a blank list is none
    /// ([`SecretRefs::drop_blank`]).
    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.database_role_secret_arns
                .iter()
                .all(|arn| !arn.is_empty()),
            "DATABASE_ROLE_SECRET_ARNS has a blank item: {:?}",
            self.database_role_secret_arns
        );
        Ok(())
    }

    /// Whether [`Config::resolve_secrets`](super::Config::resolve_secrets) has nothing to read
    /// (the role secrets are not its to read).
    pub fn is_empty(&self) -> bool {
        self.database_secret_arn.is_none()
            && self.redis_auth_secret_arn.is_none()
            && self.redis_loader_secret_arn.is_none()
    }
}
