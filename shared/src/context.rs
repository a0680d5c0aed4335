//! What every function's state is built from: the config and the two clients it names.
//!
//! One [`Context`] per container (per cold start), built by [`Context::connect`]; each
//! function's state takes its fields and adds only what is its own (the entry's queue and
//! guards, the consumer's batch switch). Tests build one from their own database, Redis and
//! config.

use crate::infra::config::Config;
use crate::store::conn::Redis;
use anyhow::Context as _;
use sqlx::PgPool;

/// The config, the database pool and the Redis connection. Cheap to clone (handles only).
#[derive(Clone)]
pub struct Context {
    pub config: Config,
    pub pool: PgPool,
    pub redis: Redis,
}

impl Context {
    pub fn new(config: Config, pool: PgPool, redis: Redis) -> Self {
        Self {
            config,
            pool,
            redis,
        }
    }

    /// Connects as a cold start does: Redis now (bounded, so an unreachable Redis fails the
    /// start visibly), the pool lazily (`db_max_connections`), so a container whose database is
    /// briefly out of reach still starts and reports the failure per request.
    pub async fn connect(config: Config) -> anyhow::Result<Self> {
        let redis = Redis::connect(&config)
            .await
            .context("failed to connect to redis")?;
        let pool = config.database_pool_lazy()?;
        Ok(Self::new(config, pool, redis))
    }
}
