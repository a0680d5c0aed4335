//! Helpers for tests against the real local services (feature `testing`).
//!
//! Each test gets its own database (UUID-named, migrated), its own Redis key prefix and, when
//! it needs one, its own SQS queue with a dead-letter queue, so tests run in parallel and never
//! need FLUSHALL.

use crate::domain::activity::{self, Activity};
use crate::domain::purchase::Attempt;
use crate::domain::refusal::Refusal;
use crate::domain::settings::{NewActivity, MAX_DRAW_WINDOW_MS};
use crate::infra::aws_secrets::RedisLogin;
use crate::infra::config::{Config, RedisTopology};
use crate::infra::sqs::{self, OrderQueue};
use crate::protocol::purchase;
use crate::store::conn::{Redis, StoreError};
use crate::store::purchase::Reservation;
use crate::store::scripts::unknown_answer;
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use sqlx::{Connection, PgConnection, PgPool};
use std::time::Duration;

/// Which Redis a test runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedisKind {
    /// 127.0.0.1:6379 (`REDIS_URL`).
    Standalone,
    /// The 3-master cluster on 7001-7003 (`REDIS_CLUSTER_URLS`).
    Cluster,
}

/// A variable of the local stack: scripts/env.sh is the one place that sets them.
fn local_env(name: &str) -> String {
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
    let pool = crate::infra::db::pool_options()
        .max_connections(16)
        .connect(&url)
        .await?;
    crate::infra::db::migrate(&pool).await?;
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
    // function logged in as its user ([`local_redis_login`]).
    config.key_prefix = format!(
        "seckill:t{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    config.redis = match kind {
        RedisKind::Standalone => RedisTopology::Standalone(local_env("REDIS_URL").into()),
        RedisKind::Cluster => RedisTopology::Cluster(
            local_env("REDIS_CLUSTER_URLS")
                .split(',')
                .map(crate::infra::secret::SecretUrl::from)
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

/// The local login of a function's Redis ACL user (`seckill-entry`, ...): scripts/stack.sh
/// creates each user of scripts/redis_acl.py on every local server, with the password
/// `local-<user>`.
pub fn local_redis_login(user: &str) -> RedisLogin {
    RedisLogin::parse(
        &serde_json::json!({"username": user, "token": format!("local-{user}")}).to_string(),
    )
    .expect("a login")
}

/// Creates a fresh queue (and its DLQ, with the given `maxReceiveCount`) on the emulator.
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
    let queue = client
        .create_queue()
        .queue_name(&name)
        .attributes(A::VisibilityTimeout, visibility_timeout_secs.to_string())
        .attributes(
            A::RedrivePolicy,
            serde_json::json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": max_receive_count.to_string()})
                .to_string(),
        )
        .send()
        .await?;
    Ok(queue.queue_url().unwrap_or_default().to_string())
}

/// The URL of a queue's dead-letter queue created by [`fresh_queue`].
pub fn dlq_url(queue_url: &str) -> String {
    format!("{queue_url}-dlq")
}

/// Everything a test needs, against the real services.
pub struct TestEnv {
    pub config: Config,
    pub pool: PgPool,
    pub redis: Redis,
    pub sqs: aws_sdk_sqs::Client,
    pub queue: OrderQueue,
}

impl TestEnv {
    pub async fn new(kind: RedisKind) -> anyhow::Result<Self> {
        let (url, pool) = fresh_database().await?;
        let mut config = config(&url, kind);
        let redis = Redis::connect(&config).await?;
        let sqs = sqs::sqs_client().await;
        let queue_url = fresh_queue(&sqs, 30, 5).await?;
        config.order_queue_url = queue_url.clone();
        let queue = OrderQueue::new(sqs.clone(), queue_url, config.sqs_timeout);
        Ok(Self {
            config,
            pool,
            redis,
            sqs,
            queue,
        })
    }

    /// What a function's state is built from: this env's config, database and Redis.
    pub fn context(&self) -> crate::Context {
        crate::Context::new(self.config.clone(), self.pool.clone(), self.redis.clone())
    }

    /// Creates an activity in the database and preheats it into Redis.
    pub async fn sale(
        &self,
        stock: i64,
        limit: i64,
        start_at: DateTime<Utc>,
        end_at: DateTime<Utc>,
    ) -> anyhow::Result<Activity> {
        self.sale_in_buckets(stock, limit, start_at, end_at, 1)
            .await
    }

    /// [`Env::sale`] with its stock in `buckets` buckets.
    pub async fn sale_in_buckets(
        &self,
        stock: i64,
        limit: i64,
        start_at: DateTime<Utc>,
        end_at: DateTime<Utc>,
        buckets: u32,
    ) -> anyhow::Result<Activity> {
        self.load_new(&NewActivity {
            title: "test sale".into(),
            total_stock: stock,
            per_order_limit: limit,
            start_at,
            end_at,
            buckets: Some(i64::from(buckets)),
            admission: None,
            draw_window_ms: None,
            // No rate: these sales test other rules, and a test's crowd may be one user.
            per_user_rate_per_sec: Some(0),
            price_minor: 1_999,
            currency: "usd".into(),
            max_entrants: None,
        })
        .await
    }

    /// Creates the activity `new` in the database and loads it into Redis, as an admin's
    /// create of a sale inside the preheat lead does.
    pub async fn load_new(&self, new: &NewActivity) -> anyhow::Result<Activity> {
        let a = activity::insert(&self.pool, &new.settings()?).await?;
        let (_, loaded) =
            crate::protocol::load::load_under_lock(&self.redis, &self.pool, &self.config, a.id)
                .await?;
        Ok(loaded)
    }

    /// A draw sale whose pool is open now: started a second ago, its draw window the longest
    /// (tests close it with `close_draw_window` in tests/tests/common), ends in an hour.
    pub async fn draw_sale(&self, stock: i64, limit: i64) -> anyhow::Result<Activity> {
        let now = Utc::now();
        self.load_new(&NewActivity {
            title: "test draw".into(),
            total_stock: stock,
            per_order_limit: limit,
            start_at: now - ChronoDuration::seconds(1),
            end_at: now + ChronoDuration::hours(1),
            buckets: None,
            admission: Some("draw".into()),
            draw_window_ms: Some(MAX_DRAW_WINDOW_MS),
            // No rate: these sales test other rules, and a test's crowd may be one user.
            per_user_rate_per_sec: Some(0),
            price_minor: 1_999,
            currency: "usd".into(),
            max_entrants: None,
        })
        .await
    }

    /// A sale that is open now (started a minute ago, ends in an hour).
    pub async fn open_sale(&self, stock: i64, limit: i64) -> anyhow::Result<Activity> {
        self.open_sale_in_buckets(stock, limit, 1).await
    }

    /// [`Env::open_sale`] with its stock in `buckets` buckets.
    pub async fn open_sale_in_buckets(
        &self,
        stock: i64,
        limit: i64,
        buckets: u32,
    ) -> anyhow::Result<Activity> {
        let now = Utc::now();
        self.sale_in_buckets(
            stock,
            limit,
            now - ChronoDuration::minutes(1),
            now + ChronoDuration::hours(1),
            buckets,
        )
        .await
    }

    /// Receives every message currently visible on the test's queue (up to `max`).
    pub async fn drain_messages(
        &self,
        max: usize,
    ) -> anyhow::Result<Vec<aws_sdk_sqs::types::Message>> {
        let mut out = Vec::new();
        let mut empty_polls = 0;
        while out.len() < max && empty_polls < 2 {
            let resp = self
                .sqs
                .receive_message()
                .queue_url(&self.queue.url)
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

/// A request as the HTTP API delivers it to the function: the JWT authorizer's claims for
/// `user` (with `scope`) in the request context, no `Authorization` header needed.
pub fn request(
    method: &str,
    path: &str,
    user: Option<(&str, &str)>,
    body: Option<&str>,
) -> axum::http::Request<axum::body::Body> {
    let claims = user.map(|(sub, scope)| crate::http::auth::Claims {
        sub: sub.to_string(),
        scope: scope.to_string(),
        exp: u64::MAX / 2,
        iat: 0,
    });
    let mut req = axum::http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.unwrap_or("").to_string()))
        .expect("a valid request");
    req.extensions_mut()
        .insert(crate::http::auth::request_context(
            claims.as_ref(),
            method,
            path,
        ));
    req
}

/// Calls a router in-process (as Lambda does: no TCP) and returns the status and JSON body
/// (`Value::Null` for an empty body).
pub async fn call(
    router: &axum::Router,
    req: axum::http::Request<axum::body::Body>,
) -> (axum::http::StatusCode, serde_json::Value) {
    use tower::ServiceExt;
    let resp = router
        .clone()
        .oneshot(req)
        .await
        .expect("infallible router");
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .expect("readable body");
    let json = if bytes.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&bytes).into()))
    };
    (status, json)
}

/// What a test body run by [`on_both_redis!`](crate::on_both_redis) returns: like every
/// test, a `Result` whose `Err` fails it.
pub trait Outcome {
    fn check(self);
}

impl<E: std::fmt::Debug> Outcome for Result<(), E> {
    fn check(self) {
        if let Err(e) = self {
            panic!("test failed: {e:?}");
        }
    }
}

/// Runs each `async fn(RedisKind)` as two tests, `<name>::standalone` and `<name>::cluster`,
/// so every Redis-facing behaviour is proven on a single server and on Redis Cluster.
#[macro_export]
macro_rules! on_both_redis {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn standalone() {
                $crate::testing::Outcome::check(
                    super::$name($crate::testing::RedisKind::Standalone).await,
                )
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn cluster() {
                $crate::testing::Outcome::check(
                    super::$name($crate::testing::RedisKind::Cluster).await,
                )
            }
        }
    )*};
}

/// A redis-server of the test's own, on a random port, so a test may pause (SIGSTOP),
/// resume, flush or restart it without disturbing the tests running beside it.
pub struct PrivateRedis {
    child: tokio::process::Child,
    port: u16,
}

impl PrivateRedis {
    pub async fn start() -> Self {
        for _ in 0..20 {
            let port = 20000 + (rand_port() % 20000);
            if let Some(me) = Self::start_on(port).await {
                return me;
            }
        }
        panic!("no private redis-server could be started");
    }

    /// Starts a server on `port`; `None` when it did not come up (the port was taken).
    pub async fn start_on(port: u16) -> Option<Self> {
        let child = tokio::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server on PATH");
        let mut me = Self { child, port };
        for _ in 0..100 {
            if me.raw().await.is_ok() {
                return Some(me);
            }
            if let Ok(Some(_)) = me.child.try_wait() {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A plain connection that bypasses the test's `Redis` handle (and its timeout).
    pub async fn raw(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        redis::Client::open(self.url())?
            .get_multiplexed_async_connection()
            .await
    }

    /// Sends a signal to the server (`-STOP` pauses it, `-CONT` resumes it).
    pub fn signal(&self, sig: &str) {
        let pid = self.child.id().expect("running").to_string();
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("kill on PATH")
            .success();
        assert!(ok, "kill {sig} {pid}");
    }

    /// Commands the server has executed, apart from the INFO calls that read the count.
    pub async fn commands_served(&self) -> u64 {
        let mut con = self.raw().await.expect("private redis answers");
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut con)
            .await
            .expect("INFO answers");
        info.lines()
            .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }

    /// A test env whose Redis is this server (its own prefix, database and queue as usual).
    pub async fn env(&self, redis_timeout: Duration, sold_out_ttl: Duration) -> TestEnv {
        let mut env = TestEnv::new(RedisKind::Standalone)
            .await
            .expect("test env against the real services");
        env.config.redis = RedisTopology::Standalone(self.url().into());
        env.config.redis_timeout = redis_timeout;
        env.config.sold_out_cache_ttl = sold_out_ttl;
        env.redis = Redis::connect(&env.config)
            .await
            .expect("private redis connects");
        env
    }
}

fn rand_port() -> u16 {
    (uuid::Uuid::new_v4().as_u128() % 65_536) as u16
}

/// Loads `activity` into Redis as preheat would, for tests and the benchmark, which may load
/// activities the database does not hold: the lock is taken directly in Redis by
/// `lua/lock_acquire.lua` with no database floor (its token fences nothing), held for the one
/// script, and released.
pub async fn load_without_db(
    redis: &Redis,
    activity: &Activity,
    buffer: Duration,
) -> anyhow::Result<crate::store::meta::PreheatOutcome> {
    let owner = uuid::Uuid::new_v4().to_string();
    let keys = redis.keys(activity.id);
    let mut inv = crate::store::scripts::LOCK_ACQUIRE.prepare_invoke();
    inv.key(&keys.lock)
        .key(&keys.fence)
        .arg(&owner)
        .arg(10_000)
        .arg(0);
    let token: i64 = redis.script(&inv).await?;
    anyhow::ensure!(token > 0, "activity {} is locked", activity.id);
    let outcome = crate::store::meta::preheat(redis, activity, buffer, &owner).await;
    crate::protocol::lock::release_owned(redis, activity.id, &owner).await?;
    Ok(outcome?)
}

/// The activity's lock as Redis holds it (`lua/lock_acquire.lua`): who holds it, how many
/// holds they have, and the fencing token of their outermost acquisition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockHold {
    pub owner: String,
    pub holds: i64,
    pub token: i64,
}

/// Reads the activity's lock; `None` when nobody holds it.
pub async fn lock_hold(redis: &Redis, activity_id: i64) -> anyhow::Result<Option<LockHold>> {
    let lock = redis.keys(activity_id).lock;
    let fields: std::collections::HashMap<String, i64> =
        redis.cmd(redis::cmd("HGETALL").arg(&lock)).await?;
    if fields.is_empty() {
        return Ok(None);
    }
    let token = *fields
        .get("token")
        .ok_or_else(|| anyhow::anyhow!("{lock} has no token"))?;
    let mut owners = fields.into_iter().filter(|(field, _)| field != "token");
    let (owner, holds) = owners
        .next()
        .ok_or_else(|| anyhow::anyhow!("{lock} has no owner"))?;
    anyhow::ensure!(owners.next().is_none(), "{lock} has two owners");
    Ok(Some(LockHold {
        owner,
        holds,
        token,
    }))
}

/// Redis loses a sale, as after a restart with no data: its meta (with the stock), users,
/// ledger and a draw sale's pool, tickets and outbox go (the lock and the fencing counter
/// stay).
pub async fn lose_sale(redis: &Redis, activity_id: i64) -> anyhow::Result<()> {
    let k = redis.keys(activity_id);
    let _: i64 = redis
        .cmd(
            redis::cmd("DEL")
                .arg(&k.meta)
                .arg(&k.users)
                .arg(&k.ledger)
                .arg(&k.pool)
                .arg(&k.outbox)
                .arg(&k.tickets),
        )
        .await?;
    Ok(())
}

/// Redis loses one buyer's field in `users` while the sale stays loaded, as a failover that
/// dropped the last writes can leave it: only a field with no ledger entry of the user (every
/// script writes an entry together with the field, so a lost suffix of writes never leaves
/// an entry without its field). Returns whether a field went.
pub async fn lose_field(
    redis: &Redis,
    at: impl Into<crate::store::keys::Bucket>,
    user: &str,
) -> anyhow::Result<bool> {
    let k = redis.bucket_keys(at.into());
    let script = redis::Script::new(
        "if redis.call('EXISTS', KEYS[1]) == 1 and redis.call('HEXISTS', KEYS[3], ARGV[1]) == 0 \
         then return redis.call('HDEL', KEYS[2], ARGV[1]) end return 0",
    );
    let mut inv = script.prepare_invoke();
    inv.key(&k.meta).key(&k.users).key(&k.ledger).arg(user);
    let lost: i64 = redis.script(&inv).await?;
    Ok(lost == 1)
}

/// What `user`'s field in `users` holds (the request id that holds her quota), if any.
pub async fn field(
    redis: &Redis,
    at: impl Into<crate::store::keys::Bucket>,
    user: &str,
) -> anyhow::Result<Option<String>> {
    let k = redis.bucket_keys(at.into());
    Ok(redis
        .cmd(redis::cmd("HGET").arg(&k.users).arg(user))
        .await?)
}

/// Buys `quantity` units of sale `activity_id` for `user` as the entry function does, with the
/// sale's bucket count learnt from Redis: the reservation, or the refusal. A draw sale's
/// answers (queued, draw due) are an error here: tests of a draw read [`purchase::enter`].
pub async fn purchase(
    redis: &Redis,
    activity_id: i64,
    user: &str,
    quantity: i64,
    request_id: uuid::Uuid,
    deadline_ms: i64,
) -> Result<Result<Reservation, Refusal>, StoreError> {
    let mut attempt = Attempt {
        request_id,
        activity_id,
        user_id: user.to_string(),
        quantity,
        buckets: 1,
    };
    match purchase::enter(
        redis,
        &crate::protocol::buckets::Hints::none(),
        &mut attempt,
        deadline_ms,
    )
    .await?
    {
        purchase::Outcome::Reserved(r) => Ok(Ok(r)),
        purchase::Outcome::Refused(refusal) => Ok(Err(refusal)),
        purchase::Outcome::Queued { .. } => Err(unknown_answer(
            "purchase.lua",
            crate::store::purchase::Code::Queued as i64,
        )),
        purchase::Outcome::DrawDue => Err(unknown_answer(
            "purchase.lua",
            crate::store::purchase::Code::DrawDue as i64,
        )),
    }
}

/// Pays order `order_id` as its owner and the provider would: starts its payment with the
/// local provider, then settles the provider's `payment_intent.succeeded` event for it (the
/// webhook's signature check is the HTTP layer's, tested there). The payment timeout is
/// `timeout`. Answers what the event came to, or why the payment could not start.
pub async fn pay(
    pool: &PgPool,
    order_id: i64,
    timeout: Duration,
) -> anyhow::Result<Result<crate::protocol::pay::Settled, String>> {
    use crate::infra::payments::{self, LocalProvider, PaymentRequest, Provider};
    use crate::protocol::pay::{self, Started};
    let order = crate::domain::order::get(pool, order_id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no order {order_id}"))?;
    let payment = match pay::start(pool, &LocalProvider, &order, Utc::now(), timeout).await? {
        Started::Pending { payment, .. } | Started::Paid(payment) => payment,
        Started::NotPayable(why) => return Ok(Err(why)),
    };
    let request = PaymentRequest {
        order_id,
        amount_minor: payment.amount_minor,
        currency: payment.currency.clone(),
    };
    let event_id = format!("evt_test_{}", uuid::Uuid::new_v4().simple());
    let body = payments::succeeded_event(&event_id, &request, &payment.provider_payment_id);
    let event: payments::Event = serde_json::from_str(&body)?;
    let settled = pay::settle(pool, LocalProvider.name(), &event, Utc::now(), timeout).await?;
    Ok(settled.map_err(|mismatch| mismatch.to_string()))
}

/// The provider's webhook request for the payment a `POST /orders/{id}/pay` answered
/// (`started`): a `payment_intent.succeeded` event with id `event_id`, for `amount_minor`,
/// signed with `secret` at `signed_at` (unix seconds) as the provider signs.
pub fn provider_event(
    secret: &str,
    event_id: &str,
    started: &serde_json::Value,
    amount_minor: i64,
    signed_at: i64,
) -> axum::http::Request<axum::body::Body> {
    use crate::infra::payments::{self, signature, PaymentRequest};
    let request = PaymentRequest {
        order_id: started["orderId"].as_i64().expect("a payment's orderId"),
        amount_minor,
        currency: started["currency"].as_str().expect("a currency").into(),
    };
    let payment_id = started["paymentId"].as_str().expect("a paymentId");
    let body = payments::succeeded_event(event_id, &request, payment_id);
    let header = signature::sign(secret.as_bytes(), signed_at, body.as_bytes());
    axum::http::Request::post("/payments/webhook")
        .header("content-type", "application/json")
        .header(signature::HEADER, header)
        .body(axum::body::Body::from(body))
        .expect("a valid request")
}

/// `POST /orders/{order_id}/pay` as `user` on `router`, then the provider's signed event for
/// the payment it started, as the buyer completing the payment causes. Answers the webhook's
/// answer, or the pay's when it was refused.
pub async fn pay_through_provider(
    router: &axum::Router,
    config: &Config,
    order_id: i64,
    user: &str,
) -> (axum::http::StatusCode, serde_json::Value) {
    use crate::infra::secret::ExposeSecret;
    let path = format!("/orders/{order_id}/pay");
    let (status, started) = call(router, request("POST", &path, Some((user, "")), None)).await;
    if status != axum::http::StatusCode::OK {
        return (status, started);
    }
    let secret = config
        .payments
        .webhook_secret
        .as_ref()
        .expect("PAYMENT_WEBHOOK_SECRET is set (scripts/env.sh)");
    let event_id = format!("evt_test_{}", uuid::Uuid::new_v4().simple());
    let amount = started["amountMinor"].as_i64().expect("an amountMinor");
    let event = provider_event(
        secret.expose_secret(),
        &event_id,
        &started,
        amount,
        Utc::now().timestamp(),
    );
    call(router, event).await
}
