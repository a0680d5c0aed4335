//! The local dev server (`make serve`): the whole system in one process.
//!
//! - The HTTP API: the entry and admin functions' axum routers, the *same* routers their
//!   Lambdas run under `lambda_http`, merged and put behind [`auth::authorize`], which plays
//!   API Gateway's JWT authorizer (HS256 tokens signed with `SECKILL_JWT_SECRET`), plus their
//!   OpenAPI document at `/openapi.json`.
//! - The SQS event source mappings: a few [`poller`]s long-poll each queue (the orders', the
//!   draw entries') and hand batches
//!   to the consumer's handler, deleting only what it did not report as failed.
//! - The two EventBridge schedules: preheat and reconcile, every few seconds.
//!
//! It is also the local one-shot migration runner: it applies the migrations before anything
//! else connects. [`start`] returns once everything is connected and listening (tests and the
//! demo use it on an ephemeral port); [`serve`] is `start` plus Ctrl-C.
//!
//! # Layout
//! - [`auth`]: the authorizer middleware (the token, then each route's scopes from
//!   `functions/routes.toml`) and the merged app.
//! - [`poller`]: the queue poller (Lambda's partial-batch semantics).
//! - [`functions`]: builds the five functions from one config.
//! - [`openapi`]: the OpenAPI document of both routers, served at `/openapi.json`.
//! - [`web`]: the storefront and operator pages, `POST /dev/token`, the purchase counter.
//! - [`provider`]: the local payment provider's completion, which sends the webhook a signed
//!   event (loopback only).

pub mod auth;
pub mod functions;
pub mod openapi;
pub mod poller;
pub mod provider;
pub mod web;

use chrono::Utc;
use clap::Parser;
use seckill_shared::http::auth::JwtVerifier;
use seckill_shared::infra::secret::{ExposeSecret, SecretString};
use seckill_shared::Config;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

pub use auth::app;
pub use functions::Functions;

/// Everything the dev server needs to start.
#[derive(Clone, Debug)]
pub struct DevConfig {
    /// Where to listen; port 0 picks a free one (see [`DevServer::addr`]).
    pub addr: SocketAddr,
    pub config: Config,
    pub jwt_secret: SecretString,
    /// Concurrent queue pollers (Lambda scales its pollers too; a few are plenty locally).
    pub pollers: usize,
    pub poll_wait: Duration,
    /// Preheat period; `None` turns the schedule off.
    pub preheat_every: Option<Duration>,
    /// Reconcile period; `None` turns the schedule off.
    pub reconcile_every: Option<Duration>,
    /// Apply the migrations at start (the local stand-in for the deploy step).
    pub migrate: bool,
    /// Requests handled at once; the rest wait for a turn before any handler runs (0 = no
    /// bound). See [`limit_in_flight`].
    pub max_in_flight: usize,
}

/// The secret `scripts/env.sh` sets for local use: published, so good for loopback only.
pub const DEFAULT_JWT_SECRET: &str = "local-dev-secret-change-me";

/// The shortest secret accepted on an address other than loopback: 256 bits, HS256's key size
/// (RFC 7518 section 3.2 asks for a key at least as long as the hash).
pub const MIN_EXPOSED_SECRET_LEN: usize = 32;

/// Refuses a secret anyone could know, or guess offline from one token, on an address
/// reachable from other machines: there the tokens are the only thing between a client and
/// the admin routes. On loopback only this machine's users can connect.
pub fn check_exposure(addr: SocketAddr, jwt_secret: &str) -> anyhow::Result<()> {
    if addr.ip().to_canonical().is_loopback() {
        return Ok(());
    }
    anyhow::ensure!(
        jwt_secret != DEFAULT_JWT_SECRET,
        "refusing to listen on {addr} with the default SECKILL_JWT_SECRET from scripts/env.sh: \
         anyone can sign tokens with it. Set SECKILL_JWT_SECRET to a random secret of at \
         least {MIN_EXPOSED_SECRET_LEN} bytes (e.g. `openssl rand -hex 32`), or listen on \
         127.0.0.1"
    );
    anyhow::ensure!(
        jwt_secret.len() >= MIN_EXPOSED_SECRET_LEN,
        "refusing to listen on {addr} with a SECKILL_JWT_SECRET of {} bytes: off loopback it \
         must be at least {MIN_EXPOSED_SECRET_LEN} bytes (e.g. `openssl rand -hex 32`)",
        jwt_secret.len()
    );
    Ok(())
}

impl DevConfig {
    /// Local defaults around a given config: 127.0.0.1:3000, 4 pollers, preheat every 2 s,
    /// reconcile every 5 s, 64 requests in flight.
    pub fn new(config: Config, jwt_secret: impl Into<String>) -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 3000)),
            config,
            jwt_secret: SecretString::from(jwt_secret.into()),
            pollers: 4,
            poll_wait: Duration::from_secs(1),
            preheat_every: Some(Duration::from_secs(2)),
            reconcile_every: Some(Duration::from_secs(5)),
            migrate: true,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        }
    }
}

/// A secret from the command line or the environment.
fn secret(value: &str) -> Result<SecretString, String> {
    Ok(SecretString::from(value))
}

/// Command-line options of `seckill-devserver`, and every [`Config`] setting (from its variable
/// or its flag).
#[derive(Parser, Clone, Debug)]
#[command(name = "seckill-devserver", version, about)]
pub struct DevArgs {
    /// Address to listen on. Off loopback the JWT secret must not be the default one and must
    /// be at least 32 bytes.
    #[arg(long, default_value = "127.0.0.1:3000", env = "SECKILL_DEV_ADDR")]
    pub addr: SocketAddr,
    /// Seconds between preheat runs (0 = off).
    #[arg(long, default_value_t = 2)]
    pub preheat_every: u64,
    /// Seconds between reconcile runs (0 = off).
    #[arg(long, default_value_t = 5)]
    pub reconcile_every: u64,
    /// Concurrent SQS pollers (0 = do not consume the queue).
    #[arg(long, default_value_t = 4)]
    pub pollers: usize,
    /// Long-poll wait of each receive, in seconds.
    #[arg(long, default_value_t = 1)]
    pub poll_wait_secs: u64,
    /// Do not apply the migrations at start.
    #[arg(long)]
    pub no_migrate: bool,
    /// Requests handled at once; more wait for a turn (0 = no bound).
    #[arg(long, default_value_t = DEFAULT_MAX_IN_FLIGHT, env = "SECKILL_DEV_MAX_IN_FLIGHT")]
    pub max_in_flight: usize,
    /// HS256 secret for bearer tokens (`make token` signs with the same).
    #[arg(long, env = "SECKILL_JWT_SECRET", hide_env_values = true, value_parser = secret)]
    pub jwt_secret: SecretString,
    #[command(flatten)]
    pub config: Config,
}

fn every(secs: u64) -> Option<Duration> {
    (secs > 0).then(|| Duration::from_secs(secs))
}

impl DevArgs {
    /// The options and the settings, checked.
    pub fn into_config(self) -> anyhow::Result<DevConfig> {
        check_exposure(self.addr, self.jwt_secret.expose_secret())?;
        let config = self.config.check()?;
        Ok(DevConfig {
            addr: self.addr,
            pollers: self.pollers,
            poll_wait: Duration::from_secs(self.poll_wait_secs),
            preheat_every: every(self.preheat_every),
            reconcile_every: every(self.reconcile_every),
            migrate: !self.no_migrate,
            max_in_flight: self.max_in_flight,
            ..DevConfig::new(config, self.jwt_secret.expose_secret())
        })
    }
}

/// A running dev server. Dropping it without [`DevServer::shutdown`] leaves its tasks running
/// until the runtime ends.
pub struct DevServer {
    addr: SocketAddr,
    functions: Functions,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    server: JoinHandle<std::io::Result<()>>,
}

impl DevServer {
    /// The bound address (the real port when started on port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The connected functions (to run a schedule on demand, as the demo does with reconcile).
    pub fn functions(&self) -> &Functions {
        &self.functions
    }

    /// Stops accepting, lets in-flight requests and batches finish, and waits for every task,
    /// at most [`SHUTDOWN_GRACE`]: past it, what is still running is abandoned (a batch not
    /// acknowledged is redelivered; a schedule run is idempotent).
    pub async fn shutdown(self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        let tasks = self.tasks;
        let threads = self.threads;
        let server = self.server;
        let wait_all = async move {
            for task in tasks {
                let _ = task.await;
            }
            for thread in threads {
                let _ = tokio::task::spawn_blocking(move || thread.join()).await;
            }
            server.await
        };
        match tokio::time::timeout(SHUTDOWN_GRACE, wait_all).await {
            Ok(served) => Ok(served??),
            Err(_) => {
                tracing::warn!("shutdown grace of {SHUTDOWN_GRACE:?} passed; abandoning tasks");
                Ok(())
            }
        }
    }
}

/// How long [`DevServer::shutdown`] waits for in-flight work.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(15);

/// [`DevConfig::max_in_flight`] unless told otherwise.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 64;

/// The local stand-in for the entry's reserved concurrency: in AWS each container handles one
/// request and the reservation caps the containers; here one process takes every connection.
/// Unbounded, a load tool's 256 connections all start their Redis call at once, each with its
/// own deadline (`REDIS_TIMEOUT_MS`), and on a busy machine they time out together: 503s, and
/// give-backs that pile onto the database pool. Bounded, the surplus waits here, before its
/// deadline starts, and each admitted request runs at full speed.
pub async fn limit_in_flight(
    axum::extract::State(turns): axum::extract::State<Arc<Semaphore>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    // Never closed: the semaphore lives as long as the router that holds it.
    let _turn = turns
        .acquire()
        .await
        .expect("the in-flight semaphore is never closed");
    next.run(req).await
}

/// Connects everything, applies migrations, binds, and starts the server, the pollers and the
/// schedules. Returns once all of it is up, so `GET /health` answers from the first request.
/// Refuses, before connecting anything, a weak secret on an address off loopback
/// ([`check_exposure`]).
pub async fn start(dev: DevConfig) -> anyhow::Result<DevServer> {
    check_exposure(dev.addr, dev.jwt_secret.expose_secret())?;
    let verifier = JwtVerifier::new(dev.jwt_secret.expose_secret())?;
    if dev.migrate {
        let pool = dev.config.database_pool().await?;
        seckill_shared::infra::db::migrate(&pool).await?;
        pool.close().await;
    }
    let functions = Functions::connect(&dev.config).await?;
    let sqs = seckill_shared::infra::sqs::sqs_client().await;
    // As the consumer's two event source mappings in AWS: the orders' queue, and the draw
    // entries' when it is another, each with pollers of its own.
    let mut sources = vec![
        poller::QueueSource::connect(sqs.clone(), &dev.config.order_queue_url, dev.poll_wait)
            .await?,
    ];
    if dev.config.entry_queue() != dev.config.order_queue_url {
        sources.push(
            poller::QueueSource::connect(sqs, dev.config.entry_queue(), dev.poll_wait).await?,
        );
    }

    let listener = TcpListener::bind(dev.addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", dev.addr))?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = watch::channel(false);

    let mut router = app(functions.entry.clone(), functions.admin.clone(), verifier);
    let loopback = dev.addr.ip().to_canonical().is_loopback();
    let csp = web::content_security_policy(&dev.config.payments);
    router = web::storefront(router, dev.jwt_secret.expose_secret(), loopback, &csp);
    if loopback {
        let secret = dev.config.payments.webhook_secret.clone();
        router = provider::local_provider(router, functions.entry_pool.clone(), secret);
    }
    if dev.max_in_flight > 0 {
        let turns = Arc::new(Semaphore::new(dev.max_in_flight));
        router = router.layer(axum::middleware::from_fn_with_state(turns, limit_in_flight));
    }
    let mut shutdown = stopped.clone();
    let server = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                let _ = shutdown.wait_for(|s| *s).await;
            })
            .await
    });

    let mut tasks = Vec::new();
    for source in &sources {
        for n in 0..dev.pollers {
            tasks.push(tokio::spawn(poll_loop(
                n,
                source.clone(),
                functions.clone(),
                stopped.clone(),
            )));
        }
    }
    // The scheduled jobs run on threads of their own, driven by this runtime: a job's future
    // need not be `Send` (the Lambda runtime does not ask it to be either).
    let mut threads = Vec::new();
    if let Some(period) = dev.preheat_every {
        let f = functions.clone();
        threads.push(spawn_schedule(
            "preheat",
            period,
            stopped.clone(),
            move || {
                let f = f.clone();
                async move { f.preheat(Utc::now()).await }
            },
        )?);
    }
    if let Some(period) = dev.reconcile_every {
        let f = functions.clone();
        threads.push(spawn_schedule(
            "reconcile",
            period,
            stopped.clone(),
            move || {
                let f = f.clone();
                async move { f.reconcile(Utc::now()).await }
            },
        )?);
    }
    tracing::info!(%addr, pollers = dev.pollers, max_in_flight = dev.max_in_flight, queues = ?sources.iter().map(|s| s.url.as_str()).collect::<Vec<_>>(), "dev server up");
    Ok(DevServer {
        addr,
        functions,
        stop,
        tasks,
        threads,
        server,
    })
}

/// `make serve`: start, announce, run until Ctrl-C, shut down gracefully.
pub async fn serve(dev: DevConfig) -> anyhow::Result<()> {
    let server = start(dev).await?;
    println!("listening on {}", server.url());
    tokio::signal::ctrl_c().await?;
    println!("shutting down");
    server.shutdown().await
}

async fn poll_loop(
    n: usize,
    source: poller::QueueSource,
    functions: Functions,
    mut stopped: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(200);
    loop {
        // Not raced against shutdown: a batch in hand is finished and acknowledged first (the
        // long poll is short), so stopping the server never forces a redelivery.
        let result = poller::poll_once(&source, |event| functions.handle_batch(event)).await;
        match result {
            Ok(outcome) => {
                backoff = Duration::from_millis(200);
                if outcome.received > 0 {
                    tracing::debug!(poller = n, ?outcome, "batch handled");
                }
            }
            Err(e) => {
                tracing::warn!(poller = n, error = %e, "poll failed; backing off");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stopped.wait_for(|s| *s) => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
        if *stopped.borrow() {
            return;
        }
    }
}

fn spawn_schedule<F, Fut, R>(
    name: &'static str,
    period: Duration,
    stopped: watch::Receiver<bool>,
    job: F,
) -> anyhow::Result<std::thread::JoinHandle<()>>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<R>>,
    R: serde::Serialize,
{
    let runtime = tokio::runtime::Handle::current();
    Ok(std::thread::Builder::new()
        .name(format!("schedule-{name}"))
        .spawn(move || runtime.block_on(schedule(name, period, stopped, job)))?)
}

async fn schedule<F, Fut, R>(
    name: &'static str,
    period: Duration,
    mut stopped: watch::Receiver<bool>,
    job: F,
) where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<R>>,
    R: serde::Serialize,
{
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stopped.wait_for(|s| *s) => return,
        }
        match job().await {
            Ok(report) => tracing::debug!(
                job = name,
                report = %serde_json::to_string(&report).unwrap_or_default(),
                "scheduled run done"
            ),
            Err(e) => tracing::warn!(job = name, error = %e, "scheduled run failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STRONG: &str = "0123456789abcdef0123456789abcdef";

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn any_secret_serves_loopback() {
        for a in [
            "127.0.0.1:3000",
            "127.0.0.2:3000",
            "[::1]:3000",
            "[::ffff:127.0.0.1]:3000",
        ] {
            assert!(check_exposure(addr(a), DEFAULT_JWT_SECRET).is_ok(), "{a}");
            assert!(check_exposure(addr(a), "short").is_ok(), "{a}");
        }
    }

    #[test]
    fn off_loopback_the_default_or_a_short_secret_is_refused_with_a_reason() {
        for a in ["0.0.0.0:3000", "[::]:3000", "192.0.2.10:3000"] {
            let err = check_exposure(addr(a), DEFAULT_JWT_SECRET)
                .unwrap_err()
                .to_string();
            assert!(err.contains("default SECKILL_JWT_SECRET"), "{err}");
            let err = check_exposure(addr(a), &STRONG[..31])
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("31 bytes") && err.contains("at least 32"),
                "{err}"
            );
            assert!(check_exposure(addr(a), STRONG).is_ok(), "{a}");
        }
    }

    #[test]
    fn the_command_line_refuses_a_weak_secret_off_loopback() {
        let args = DevArgs::try_parse_from([
            "seckill-devserver",
            "--addr=0.0.0.0:3000",
            &format!("--jwt-secret={DEFAULT_JWT_SECRET}"),
            "--database-url=postgres://u@127.0.0.1/seckill",
            "--redis-url=redis://127.0.0.1:6379",
            "--order-queue-url=http://127.0.0.1:4566/1/q",
        ])
        .unwrap();
        let err = args.into_config().unwrap_err().to_string();
        assert!(err.contains("refusing to listen on 0.0.0.0:3000"), "{err}");
    }

    #[tokio::test]
    async fn start_refuses_before_connecting_anything() {
        // Nothing listens on these: had it tried to connect, the error would name them.
        let args = DevArgs::try_parse_from([
            "seckill-devserver",
            "--jwt-secret=x",
            "--database-url=postgres://u@127.0.0.1:1/nowhere",
            "--redis-url=redis://127.0.0.1:1",
            "--order-queue-url=http://127.0.0.1:1/1/q",
        ])
        .unwrap();
        let mut dev = args.into_config().unwrap();
        dev.addr = addr("0.0.0.0:0");
        let err = start(dev).await.err().expect("refused").to_string();
        assert!(err.contains("refusing to listen"), "{err}");
    }

    #[test]
    fn debug_shows_neither_the_jwt_secret_nor_a_url_password() {
        let args = DevArgs::try_parse_from([
            "seckill-devserver",
            "--jwt-secret=jwt-s3cret-value",
            "--database-url=postgres://u:db-pa55@127.0.0.1/seckill",
            "--redis-url=redis://:redis-t0ken@127.0.0.1:6379",
            "--order-queue-url=http://127.0.0.1:4566/1/q",
        ])
        .unwrap();
        let dev = args.clone().into_config().unwrap();
        for debug in [format!("{args:?}"), format!("{dev:?}")] {
            for secret in ["jwt-s3cret-value", "db-pa55", "redis-t0ken"] {
                assert!(!debug.contains(secret), "{secret} in {debug}");
            }
            assert!(debug.contains("u:***@127.0.0.1"), "{debug}");
        }
    }
}
