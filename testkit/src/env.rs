//! A test's own services: a fresh database, a fresh Redis key prefix on the chosen Redis and a
//! fresh queue with its dead-letter queue, so tests run in parallel and never need FLUSHALL.

use seckill_shared::infra::config::{Config, RedisTopology};
use seckill_shared::infra::shape::Function;
use seckill_shared::infra::sqs::{self, OrderQueue, Queues};
use seckill_shared::store::conn::Redis;
use seckill_shared::Context;
use sqlx::{Connection, PgConnection, PgPool};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Which Redis a test runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedisKind {
    /// 127.0.0.1:6379 (`REDIS_URL`).
    Standalone,
    /// The 3-master cluster on 7001-7003 (`REDIS_CLUSTER_URLS`).
    Cluster,
    /// A standalone Valkey, ElastiCache's default engine, on 127.0.0.1:6380 (`VALKEY_URL`).
    Valkey,
}

/// A variable of the local stack: scripts/env.sh is the one place that sets them.
pub(crate) fn local_env(name: &str) -> String {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} is not set: `source scripts/env.sh` (make does)"))
}

fn server_url() -> String {
    local_env("DATABASE_URL")
}

fn with_database(url: &str, name: &str) -> String {
    match url.rfind('/') {
        Some(i) if url[..i].contains("://") && url[i + 1..].chars().all(|c| c != '@') => {
            let rest = &url[i + 1..];
            let query = rest.find('?').map(|q| &rest[q..]).unwrap_or("");
            format!("{}/{name}{query}", &url[..i])
        }
        _ => format!("{url}/{name}"),
    }
}

/// A fresh, migrated database named `seckill_test_<uuid>`. Returns its URL and a pool.
pub async fn fresh_database() -> anyhow::Result<(String, PgPool)> {
    let url = empty_database().await?;
    // The owner connects to migrate and to set fixtures up, and lets its connections go soon
    // after: while the functions run, only their roles are connected.
    let pool = seckill_shared::infra::db::pool_options()
        .max_connections(16)
        .min_connections(0)
        .idle_timeout(Duration::from_secs(1))
        .connect(&url)
        .await?;
    seckill_shared::infra::db::migrate(&pool).await?;
    // Pause points are scoped by activity id in one process: two tests running side by side
    // (a sale's standalone and cluster variant) must not both have sale 1. Each database's ids
    // start at their own random place, above the few-digit ids tests use for an unknown sale
    // and below the ones they use as unknown past every sale.
    let start: i64 = rand::random_range(10_000_000..900_000_000);
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "alter table activities alter column id restart with {start}"
    )))
    .execute(&pool)
    .await?;
    Ok((url, pool))
}

/// A fresh database named `seckill_test_<uuid>` with nothing in it (no migration run):
/// for a test of the migration itself, which must not depend on what another checkout's
/// migrations left in a shared database. Returns its URL.
pub async fn empty_database() -> anyhow::Result<String> {
    let base = server_url();
    let name = format!("seckill_test_{}", uuid::Uuid::new_v4().simple());
    let mut admin = PgConnection::connect(&with_database(&base, "postgres")).await?;
    // A database name cannot be a bind parameter: the statement is built at runtime, which
    // `sqlx::query!` (a checked literal) cannot take.
    // The name is ours (a UUID), never user input.
    sqlx::query(sqlx::AssertSqlSafe(format!("create database {name}")))
        .execute(&mut admin)
        .await?;
    admin.close().await?;
    Ok(with_database(&base, &name))
}

/// A config for one test: its database, a fresh key prefix, the chosen Redis.
pub fn config(database_url: &str, kind: RedisKind) -> Config {
    let mut config = Config::from_env().expect("test environment parses");
    config.database_url = database_url.into();
    // Under `seckill:`, the key pattern of the functions' Redis ACL users, so a test may run a
    // function logged in as its user ([`seckill_shared::infra::shape::local_redis_login`]).
    config.key_prefix = format!(
        "seckill:t{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    config.redis = match kind {
        RedisKind::Standalone => RedisTopology::Standalone(local_env("REDIS_URL").into()),
        RedisKind::Valkey => RedisTopology::Standalone(local_env("VALKEY_URL").into()),
        RedisKind::Cluster => RedisTopology::Cluster(
            local_env("REDIS_CLUSTER_URLS")
                .split(',')
                .map(seckill_shared::infra::secret::SecretUrl::from)
                .collect(),
        ),
    };
    // Tests run many things at once on 2 cores: be patient with real services. Crowd tests are
    // about correctness, not latency: a 503 from a Redis call that waited behind a busy core is
    // not what they test. Tests of the timeout itself set their own (hundreds of ms).
    config.redis_timeout = Duration::from_secs(10);
    config.sqs_timeout = Duration::from_secs(10);
    config.db_max_connections = 8;
    config
}

/// Creates a fresh order queue, its draw entries' queue ([`entries_url`]) and their one DLQ
/// (both redrive into it with the given `maxReceiveCount`) on the emulator, as the stack has
/// them. Answers the order queue's URL.
pub async fn fresh_queue(
    client: &aws_sdk_sqs::Client,
    visibility_timeout_secs: u32,
    max_receive_count: u32,
) -> anyhow::Result<String> {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let name = format!("t-{}", uuid::Uuid::new_v4().simple());
    let dlq = client
        .create_queue()
        .queue_name(format!("{name}-dlq"))
        .send()
        .await?;
    let dlq_url = dlq.queue_url().unwrap_or_default().to_string();
    let attrs = client
        .get_queue_attributes()
        .queue_url(&dlq_url)
        .attribute_names(A::QueueArn)
        .send()
        .await?;
    let dlq_arn = attrs
        .attributes()
        .and_then(|a| a.get(&A::QueueArn))
        .cloned()
        .unwrap_or_default();
    let redrive = serde_json::json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": max_receive_count.to_string()})
        .to_string();
    let mut order_url = String::new();
    for queue_name in [format!("{name}-entries"), name] {
        let queue = client
            .create_queue()
            .queue_name(queue_name)
            .attributes(A::VisibilityTimeout, visibility_timeout_secs.to_string())
            .attributes(A::RedrivePolicy, redrive.clone())
            .send()
            .await?;
        order_url = queue.queue_url().unwrap_or_default().to_string();
    }
    Ok(order_url)
}

/// The URL of the draw entries' queue [`fresh_queue`] made beside an order queue.
pub fn entries_url(queue_url: &str) -> String {
    format!("{queue_url}-entries")
}

/// The URL of a queue's dead-letter queue created by [`fresh_queue`].
pub fn dlq_url(queue_url: &str) -> String {
    format!("{queue_url}-dlq")
}

/// Everything a test needs, against the real services. `pool` and `redis` are the database
/// owner's and Redis's default user's: the test's fixtures and reads. Each function's handle is
/// built in one place, [`crate::functions`] (`env.consumer()`, `env.entry_router()`, ...), on
/// the function's own logins ([`FunctionLogins`]), as it runs in AWS.
#[derive(Clone)]
pub struct TestEnv {
    pub config: Config,
    pub pool: PgPool,
    pub redis: Redis,
    pub sqs: aws_sdk_sqs::Client,
    pub queue: OrderQueue,
    pub(crate) logins: FunctionLogins,
}

/// Each function's connections, as its own database role and Redis ACL user
/// ([`Function::local_config`]), made from the env's config when the env is made or
/// [`TestEnv::reconnect`]ed.
#[derive(Clone)]
pub struct FunctionLogins(Arc<BTreeMap<Function, (PgPool, Redis)>>);

impl FunctionLogins {
    async fn connect(config: &Config) -> anyhow::Result<Self> {
        let mut logins = BTreeMap::new();
        for function in Function::ALL {
            if function.shape().role.is_none() {
                continue;
            }
            let mut config = function.local_config(config)?;
            // The pool one deployed instance of the function holds: the roles' connection
            // limits are sized by it. But the entry's: its one handle here stands for the many
            // instances a crowd runs in AWS (one request each), so it keeps the test's pool.
            if function != Function::Entry {
                if let Some(pool) = function.shape().db_max_connections {
                    config.db_max_connections = pool;
                }
            }
            let pool = config.database_pool_lazy()?;
            let redis = Redis::connect(&config).await.map_err(|e| {
                anyhow::anyhow!(
                    "{} logs in to Redis as {:?} ({e}): bash scripts/stack.sh creates the users",
                    function.binary(),
                    function.shape().redis_user
                )
            })?;
            logins.insert(function, (pool, redis));
        }
        // The scripts, as preheat loads them in AWS (no function's user may load one): before
        // any function of the test calls one.
        let preheat = Function::Preheat.local_config(config)?;
        let loader = Redis::connect_loader(&preheat)
            .await?
            .ok_or_else(|| anyhow::anyhow!("preheat has no loader login"))?;
        seckill_shared::store::scripts::load_all(&loader)
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "the scripts load as the loader ({e:#}): bash scripts/stack.sh creates it"
                )
            })?;
        Ok(Self(Arc::new(logins)))
    }

    pub(crate) fn of(&self, function: Function) -> &(PgPool, Redis) {
        self.0
            .get(&function)
            .unwrap_or_else(|| panic!("{function:?} has no login"))
    }
}

impl TestEnv {
    pub async fn new(kind: RedisKind) -> anyhow::Result<Self> {
        let (url, pool) = fresh_database().await?;
        let mut config = config(&url, kind);
        let redis = Redis::connect(&config).await?;
        let sqs = sqs::sqs_client().await;
        let queue_url = fresh_queue(&sqs, 30, 5).await?;
        config.order_queue_url = queue_url.clone();
        config.entry_queue_url = Some(entries_url(&queue_url));
        let queue = OrderQueue::new(sqs.clone(), queue_url, config.sqs_timeout);
        let logins = FunctionLogins::connect(&config).await?;
        Ok(Self {
            config,
            pool,
            redis,
            sqs,
            queue,
            logins,
        })
    }

    /// Connects again after a change of [`TestEnv::config`]'s Redis (its servers, its
    /// timeout): the env's own handle and every function's logins.
    /// The database pool and the Redis connection `function` logs in with: for a test that runs
    /// a step of the protocol itself, as the function does (a cancel as the entry, a load as
    /// preheat), rather than through the function's handle.
    pub fn login(&self, function: Function) -> (PgPool, Redis) {
        self.logins.of(function).clone()
    }

    /// The operator's view of the stores while the functions run: the admin function's logins
    /// (its role reads every sale and its orders' status and units; its Redis user reads the
    /// meta). A check that samples a run reads through it, so that only the functions' roles
    /// and users are connected while the functions run.
    pub fn observer(&self) -> (&PgPool, &Redis) {
        let (pool, redis) = self.logins.of(Function::Admin);
        (pool, redis)
    }

    pub async fn reconnect(&mut self) -> anyhow::Result<()> {
        self.redis = Redis::connect(&self.config).await?;
        self.logins = FunctionLogins::connect(&self.config).await?;
        Ok(())
    }

    /// What `function`'s state is built from: this env's config as the function logs in with
    /// it, its role's pool and its Redis user's connection. Only the kit's
    /// [`crate::functions`] builds on it, so how a function connects stays there.
    pub(crate) fn context(&self, function: Function) -> Context {
        let config = function
            .local_config(&self.config)
            .expect("a local config of the function");
        let (pool, redis) = self.logins.of(function);
        Context::new(config, pool.clone(), redis.clone())
    }

    /// The entry's queues as the test's config names them: the test's order queue, and its
    /// entries' queue (on a line of coalesced sends of its own, as a fresh container has).
    pub fn queues(&self) -> Queues {
        Queues::around(self.queue.clone(), self.config.entry_queue_url.as_deref())
    }

    /// The test's queues' URLs: the orders', then the entries' when it is another.
    pub fn queue_urls(&self) -> Vec<String> {
        let entries = self.config.entry_queue();
        let mut urls = vec![self.queue.url.clone()];
        if entries != self.queue.url {
            urls.push(entries.to_string());
        }
        urls
    }

    /// Receives every message currently visible on the test's queues (up to `max` from each):
    /// the order queue's, then the entries queue's.
    pub async fn drain_messages(
        &self,
        max: usize,
    ) -> anyhow::Result<Vec<aws_sdk_sqs::types::Message>> {
        let mut out = Vec::new();
        for url in self.queue_urls() {
            out.extend(self.drain_messages_of(&url, max).await?);
        }
        Ok(out)
    }

    /// Receives every message currently visible on queue `url` (up to `max`).
    pub async fn drain_messages_of(
        &self,
        url: &str,
        max: usize,
    ) -> anyhow::Result<Vec<aws_sdk_sqs::types::Message>> {
        let mut out = Vec::new();
        let mut empty_polls = 0;
        while out.len() < max && empty_polls < 2 {
            let resp = self
                .sqs
                .receive_message()
                .queue_url(url)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .send()
                .await?;
            let msgs = resp.messages.unwrap_or_default();
            if msgs.is_empty() {
                empty_polls += 1;
            } else {
                empty_polls = 0;
            }
            out.extend(msgs);
        }
        Ok(out)
    }
}
