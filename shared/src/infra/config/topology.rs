//! Where Redis is: one server, or the seed nodes of a cluster, parsed from `REDIS_URL` and
//! `REDIS_CLUSTER` as a part of [`super::Config`].

use super::values::non_blank;
use crate::infra::aws_secrets::RedisLogin;
use crate::infra::secret::SecretUrl;

/// Where Redis is: one server, or the seed nodes of a cluster. Parsed from `REDIS_URL` (one URL,
/// or a comma-separated list of cluster nodes) and `REDIS_CLUSTER` (a single URL that is a
/// cluster's configuration endpoint).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisTopology {
    Standalone(SecretUrl),
    Cluster(Vec<SecretUrl>),
}

impl RedisTopology {
    /// More than one URL, or `cluster`, is a cluster; otherwise the one URL as given.
    pub fn from_urls(urls: &str, cluster: bool) -> Self {
        let nodes: Vec<SecretUrl> = urls
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(SecretUrl::from)
            .collect();
        if nodes.len() > 1 || cluster {
            RedisTopology::Cluster(nodes)
        } else {
            RedisTopology::Standalone(SecretUrl::from(urls))
        }
    }

    /// The same servers, every URL logged in as `login` (the function's ElastiCache user).
    pub fn with_login(&self, login: &RedisLogin) -> anyhow::Result<RedisTopology> {
        Ok(match self {
            RedisTopology::Standalone(url) => RedisTopology::Standalone(login.apply(url)?),
            RedisTopology::Cluster(nodes) => RedisTopology::Cluster(
                nodes
                    .iter()
                    .map(|n| login.apply(n))
                    .collect::<anyhow::Result<_>>()?,
            ),
        })
    }
}

/// The two variables [`RedisTopology`] is parsed from.
#[derive(clap::Args)]
struct RedisArgs {
    /// Redis: one URL, or the comma-separated nodes of a cluster (rediss:// for TLS). Required;
    /// the local stack's is in scripts/env.sh.
    #[arg(
        long = "redis-url",
        env = "REDIS_URL",
        value_name = "REDIS_URL",
        value_parser = non_blank,
        hide_env_values = true
    )]
    url: String,
    /// The one REDIS_URL is a cluster's configuration endpoint (true/false, yes/no, 1/0).
    #[arg(
        long = "redis-cluster",
        env = "REDIS_CLUSTER",
        value_name = "REDIS_CLUSTER",
        default_value = "false",
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    cluster: bool,
}

impl clap::FromArgMatches for RedisTopology {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let args = RedisArgs::from_arg_matches(matches)?;
        Ok(RedisTopology::from_urls(&args.url, args.cluster))
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl clap::Args for RedisTopology {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        RedisArgs::augment_args(cmd)
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        RedisArgs::augment_args_for_update(cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_login_becomes_the_user_and_password_of_every_cluster_node() {
        let topology = RedisTopology::Cluster(vec![
            "rediss://clustercfg.seckill.abc.use1.cache.amazonaws.com:6379".into(),
            "rediss://old:stale@node2:6379/0".into(),
        ]);
        let RedisTopology::Cluster(nodes) = topology.with_login(&token("t0k/en")).unwrap() else {
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
            topology.with_login(&token("tok")).unwrap(),
            RedisTopology::Standalone("redis://:tok@127.0.0.1:6379".into())
        );
        let user = RedisLogin::parse(r#"{"username":"seckill-entry","token":"tok"}"#).unwrap();
        assert_eq!(
            RedisTopology::Standalone("redis://old:stale@127.0.0.1:6379".into())
                .with_login(&user)
                .unwrap(),
            RedisTopology::Standalone("redis://seckill-entry:tok@127.0.0.1:6379".into())
        );
    }

    fn token(token: &str) -> RedisLogin {
        RedisLogin::parse(token).unwrap()
    }
}
