//! `seckill-entry`: the HTTP function every click of a sale reaches.
//!
//! - [`purchase`]: one Lua script on Redis decides, the order message goes to SQS, 202 at
//!   once; a 503 means nothing happened (docs/invariants.md, "Entry: a purchase").
//! - [`orders`]: where the caller's purchase is, and cancel.
//! - [`payments`]: pay (a payment started at the provider) and the provider's signed webhook.
//! - [`view`]: the public view of a sale, from Redis behind a short per-container cache.
//! - [`health`]: liveness with no I/O, and a deep check of every dependency.
//! - [`guards`]: what each container keeps in front of Redis (the sold-out memory, bucket
//!   counts, the clock offset, the circuit breaker); [`counters`]: its EMF counters.
//! - [`db_guards`]: what it keeps in front of the database per user (the per-user rate of
//!   requests that reach it, the memory of "no order" answers).
//!
//! The same [`router`] runs in Lambda (`lambda_http::run`) and in the local dev server; [`api`]
//! is its routes with their OpenAPI description, from each handler's `#[utoipa::path]`.

use axum::Router;
use seckill_shared::http::extract::with_fallbacks;
use seckill_shared::http::origin;
use seckill_shared::infra::payments::Provider;
use seckill_shared::infra::sqs::{self, Queues};
use seckill_shared::protocol::buckets::Hints;
use seckill_shared::store::conn::Redis;
use seckill_shared::{Config, Context};
use sqlx::PgPool;
use std::sync::Arc;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub mod counters;
pub mod db_guards;
pub mod guards;
pub mod health;
pub mod orders;
pub mod payments;
pub mod purchase;
pub mod view;

pub use counters::FUNCTION;
pub use health::{DeepHealth, Health};
pub use orders::MyOrder;
pub use purchase::PurchaseBody;
pub use view::PublicActivity;

/// Everything a request needs, built once per container. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct EntryState {
    inner: Arc<Inner>,
}

/// The clients and what only the entry keeps per container: the queue, the guards, the view
/// cache, the counters, and the per-user guards of the database.
struct Inner {
    config: Config,
    pool: PgPool,
    redis: Redis,
    /// The orders' queue and the draw entries' (their own, or the same).
    queues: Queues,
    sold_out: guards::SoldOutCache,
    /// Donors of bucketed sales seen empty a moment ago, and sales a sale-wide check found
    /// sold out (off with the sold-out memory, `SOLD_OUT_CACHE_MS=0`).
    bucket_hints: Hints,
    bucket_counts: guards::BucketCounts,
    unloaded: guards::UnloadedCache,
    known_max: guards::KnownMax,
    deep: health::DeepCache,
    breaker: guards::Breaker,
    skew: guards::ClockSkew,
    view: view::ViewCache,
    counters: counters::Counters,
    user_rate: db_guards::UserRate,
    no_order: db_guards::NoOrderCache,
    /// The payment provider (`None`: paying answers 503).
    payments: Option<Arc<dyn Provider>>,
}

impl EntryState {
    pub fn new(context: Context, queues: Queues) -> Self {
        let Context {
            config,
            pool,
            redis,
        } = context;
        Self {
            inner: Arc::new(Inner {
                sold_out: guards::SoldOutCache::new(config.sold_out_cache_ttl),
                bucket_hints: if config.sold_out_cache_ttl.is_zero() {
                    Hints::none()
                } else {
                    Hints::new()
                },
                bucket_counts: guards::BucketCounts::default(),
                unloaded: guards::UnloadedCache::default(),
                known_max: guards::KnownMax::default(),
                deep: health::DeepCache::default(),
                breaker: guards::Breaker::new(config.redis_timeout),
                skew: guards::ClockSkew::default(),
                view: view::ViewCache::new(config.public_view_cache_ttl),
                counters: counters::Counters::default(),
                user_rate: db_guards::UserRate::new(config.user_db_rate_per_sec),
                no_order: db_guards::NoOrderCache::new(),
                payments: config.payments.provider(),
                config,
                pool,
                redis,
                queues,
            }),
        }
    }

    /// Builds the clients a cold start needs: Redis (connected, bounded), a lazy pool (the hot
    /// path never touches the database) and the SQS client from the AWS environment.
    pub async fn connect(config: Config) -> anyhow::Result<Self> {
        let context = Context::connect(config).await?;
        let client = sqs::sqs_client().await;
        let queues = Queues::new(client, &context.config);
        Ok(Self::new(context, queues))
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    pub fn redis(&self) -> &Redis {
        &self.inner.redis
    }

    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }
}

/// The schemas a handler names by reference rather than by type.
#[derive(utoipa::OpenApi)]
#[openapi(components(schemas(PurchaseBody)))]
struct Schemas;

/// The function's HTTP API (paths as API Gateway routes them). Unknown routes answer 404 and
/// wrong methods 405, both as error JSON; with the edge on, a request without the origin
/// secret answers 403 before any of them.
pub fn router(state: EntryState) -> Router {
    let (routes, _) = api().split_for_parts();
    let origin = state.config().edge_origin.clone();
    origin::guard(with_fallbacks(routes).with_state(state), &origin)
}

/// The routes of [`router`] with their OpenAPI description (`docs/openapi.json`).
pub fn api() -> OpenApiRouter<EntryState> {
    OpenApiRouter::with_openapi(<Schemas as utoipa::OpenApi>::openapi())
        .routes(routes!(purchase::purchase))
        .routes(routes!(orders::my_order))
        .routes(routes!(view::public_activity))
        .routes(routes!(payments::pay))
        .routes(routes!(payments::webhook))
        .routes(routes!(orders::cancel))
        .routes(routes!(health::health))
        .routes(routes!(health::deep_health))
}
