//! The Redis connection: one server or a cluster, behind one type, with bounded waits.
//!
//! Both kinds reconnect by themselves (`ConnectionManager`, `ClusterConnection`); every call
//! made through [`Redis::run`] is also bounded by `redis_timeout`, so a paused or unreachable
//! Redis turns into a fast [`StoreError::Timeout`] (503 for the caller), never a hang.
//! Redis here is the sale's live store (stock, users, ledger), not a cache: it is sized and
//! configured never to evict (see docs/deploy.md).

use crate::infra::config::{Config, RedisTopology};
use crate::store::values::TermsSeen;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, FromRedisValue, Pipeline, RedisFuture, ScriptInvocation, Value};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// A connection to a standalone Redis or to a Redis Cluster.
#[derive(Clone)]
pub enum RedisConn {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Standalone(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Standalone(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Standalone(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
        }
    }
}

/// Why a Redis call failed. Both mean "unavailable, safe to retry" to an HTTP caller.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("redis error: {0}")]
    Redis(#[from] redis::RedisError),
}

/// A cheap-to-clone handle: the connection, the key prefix and the call timeout, and the
/// sales' terms its purchases last read (shared by its clones).
#[derive(Clone)]
pub struct Redis {
    pub conn: RedisConn,
    pub prefix: String,
    pub timeout: Duration,
    pub terms: Arc<TermsSeen>,
}

impl Redis {
    /// Connects to the Redis the config names. Connection attempts are bounded as well.
    pub async fn connect(config: &Config) -> anyhow::Result<Self> {
        Self::connect_to(&config.redis, config).await
    }

    /// Connects as the script loader, when the config names its login
    /// (`Config::redis_loader`): the handle [`crate::store::scripts::load_all`] takes.
    pub async fn connect_loader(config: &Config) -> anyhow::Result<Option<Self>> {
        match &config.redis_loader {
            Some(topology) => Ok(Some(Self::connect_to(topology, config).await?)),
            None => Ok(None),
        }
    }

    async fn connect_to(topology: &RedisTopology, config: &Config) -> anyhow::Result<Self> {
        Self::connect_with(topology, config.redis_timeout, &config.key_prefix).await
    }

    /// Connects to `topology`, each call bounded by `timeout`, its keys under `prefix`.
    pub async fn connect_with(
        topology: &RedisTopology,
        timeout: Duration,
        prefix: &str,
    ) -> anyhow::Result<Self> {
        let conn = connect_topology(topology, timeout).await?;
        Ok(Self::new(conn, prefix, timeout))
    }

    /// A handle on a connection made elsewhere, with no terms seen yet.
    pub fn new(conn: RedisConn, prefix: &str, timeout: Duration) -> Self {
        Self {
            conn,
            prefix: prefix.to_string(),
            timeout,
            terms: Arc::default(),
        }
    }

    /// The keys of one activity under this handle's prefix.
    pub fn keys(&self, activity_id: i64) -> crate::store::keys::Keys {
        crate::store::keys::Keys::new(&self.prefix, activity_id)
    }

    /// The keys of one bucket of an activity under this handle's prefix.
    pub fn bucket_keys(&self, bucket: crate::store::keys::Bucket) -> crate::store::keys::Keys {
        crate::store::keys::Keys::of(&self.prefix, bucket)
    }

    /// Runs a script invocation within the timeout.
    pub async fn script<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn.clone();
        self.run(async move { invocation.invoke_async(&mut conn).await })
            .await
    }

    /// Runs one command within the timeout.
    pub async fn cmd<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, StoreError> {
        let mut conn = self.conn.clone();
        self.run(async move { cmd.query_async(&mut conn).await })
            .await
    }

    /// Bounds any Redis future by the configured timeout.
    pub async fn run<T>(
        &self,
        fut: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }
}

async fn connect_topology(
    topology: &RedisTopology,
    timeout: Duration,
) -> anyhow::Result<RedisConn> {
    // rediss:// (ElastiCache in-transit encryption) builds a rustls client config, which needs a
    // process-wide crypto provider: install aws-lc-rs (already linked by sqlx and the AWS SDK)
    // unless something else already did.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    // Connecting may take a little longer than one command, but it must still be bounded.
    let connect_timeout = timeout.max(Duration::from_millis(500)) * 2;
    let fut = async {
        Ok::<_, anyhow::Error>(match topology {
            RedisTopology::Standalone(url) => {
                let client = redis::Client::open(url.expose())?;
                let cfg = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_response_timeout(Some(timeout))
                    .set_number_of_retries(1);
                RedisConn::Standalone(client.get_connection_manager_with_config(cfg).await?)
            }
            RedisTopology::Cluster(nodes) => {
                let nodes: Vec<&str> = nodes.iter().map(|n| n.expose()).collect();
                let client = ClusterClientBuilder::new(nodes)
                    .connection_timeout(connect_timeout)
                    .response_timeout(timeout)
                    .retries(1)
                    .build()?;
                RedisConn::Cluster(client.get_async_connection().await?)
            }
        })
    };
    tokio::time::timeout(connect_timeout * 2, fut)
        .await
        .map_err(|_| anyhow::anyhow!("redis connection timed out after {connect_timeout:?}"))?
}
