//! `GET /activities/{id}`: the public view of a sale, the page every visitor refreshes while
//! waiting for the start, so the one read of the API that must scale with the crowd.
//!
//! While the sale is loaded the view comes from Redis alone ([`view::view`]: the meta's title
//! and window and the live stock in one round trip), never from the database. Before preheat,
//! after the keys expired, or while Redis is out of reach, the database row answers instead
//! (its remaining stock lags the pending reservations, the best there is then). Either answer,
//! and a 404 for an unknown or draft id, is kept per container for `public_view_cache_ttl`
//! (at most 250 ms): a hit costs no I/O, concurrent misses of one id share one backend read,
//! and a flood for an unknown id costs one database read per id and period. An id above the
//! highest one the database has (read at most once a second) is 404 with no read at all, and
//! an id spelled otherwise than canonically (`+7`, `007`) with no I/O. The cache holds a
//! bounded number of ids, so random ids cannot grow it without limit.
//!
//! The answer also tells browsers and a CDN how long they may reuse it (`Cache-Control`).

use crate::guards::KnownMax;
use crate::EntryState;
use axum::extract::State;
use axum::http::header::CACHE_CONTROL;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, SubsecRound, Utc};
use seckill_shared::domain::activity::{self, Phase};
use seckill_shared::domain::settings::Admission;
use seckill_shared::domain::status::ActivityState;
use seckill_shared::http::error::ErrorBody;
use seckill_shared::http::extract::ActivityId;
use seckill_shared::store::conn::Redis;
use seckill_shared::store::view::{self, ActivityView};
use seckill_shared::ApiError;
use serde::Serialize;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;

/// `Cache-Control` of a 200. A second of reuse is what the view's figures can bear: the stock
/// moves with every purchase. `stale-while-revalidate=2` lets a CDN or browser answer from the
/// lapsed copy while one background request refreshes it, so a hot view's origin traffic stays
/// at one request per cache per second even at the moment the copy lapses (no refetch
/// stampede), while no visitor sees a copy older than 3 s (a busy view is refreshed within one
/// round trip of lapsing; only a quiet one shows the longer-stale copy, once).
pub const CACHE_SHOWN: &str = "public, max-age=1, stale-while-revalidate=2";
/// `Cache-Control` of a 404: briefly, since the id may be created any moment.
pub const CACHE_NOT_FOUND: &str = "public, max-age=1";
/// `Cache-Control` of an error answer (5xx): never reused, the next request may succeed.
pub const CACHE_ERROR: &str = "no-store";

/// How many ids one container remembers at most; beyond it the least useful go first.
const CAPACITY: u64 = 10_000;

/// `GET /activities/{id}`: what anyone may see of a sale.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PublicActivity {
    pub id: i64,
    pub title: String,
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    pub remaining_stock: i64,
    /// `upcoming`, `running` or `ended`.
    #[schema(example = "running")]
    pub state: &'static str,
    /// The most units one order may take.
    pub per_order_limit: i64,
    /// A unit's price in the currency's minor units (1999 is 19.99 USD).
    #[schema(example = 1999)]
    pub price_minor: i64,
    /// ISO 4217, lowercase.
    #[schema(example = "usd")]
    pub currency: String,
    /// A draw sale's draw, as anyone may check it; absent for a first-come sale.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draw: Option<PublicDraw>,
}

/// A draw sale's tickets are HMAC-SHA1(secret, user id), first 52 bits; the draw takes the
/// lowest first. Before the draw only the secret's SHA-256 is public; after it the secret and
/// the last ticket the draw looked at are, so any entrant can recompute their ticket
/// (`scripts/draw_verify.py`) and see it against the cutoff.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PublicDraw {
    /// SHA-256 of the ticket secret, hex: public from the sale's creation.
    #[schema(example = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08")]
    pub commitment: String,
    /// The ticket secret, hex, once the draw is done.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// The last ticket the draw looked at, once it is done: every higher ticket lost, and every
    /// lower one won (with a per-order limit of 1, unless its user held an order already) but
    /// for the late entries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cutoff: Option<i64>,
    /// Once the draw is done: entries answered `queued` that reached the pool again only after
    /// the draw had begun (Redis lost the sale meanwhile), which the draw could not look at;
    /// each reads `entered_late`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub late_entries: Option<i64>,
}

/// What the cache keeps for an id: the view without its state (computed from the window at
/// each answer), or `None` for no such public activity.
type Shown = Option<Arc<Fields>>;

#[derive(Debug)]
struct Fields {
    title: String,
    start_at: DateTime<Utc>,
    end_at: DateTime<Utc>,
    remaining_stock: i64,
    per_order_limit: i64,
    price_minor: i64,
    currency: String,
    draw: Option<PublicDraw>,
}

impl Fields {
    fn answer(&self, id: i64, now: DateTime<Utc>) -> PublicActivity {
        PublicActivity {
            id,
            title: self.title.clone(),
            start_at: self.start_at,
            end_at: self.end_at,
            remaining_stock: self.remaining_stock,
            state: Phase::of(self.start_at, self.end_at, now).as_str(),
            per_order_limit: self.per_order_limit,
            price_minor: self.price_minor,
            currency: self.currency.clone(),
            draw: self.draw.clone(),
        }
    }
}

/// The per-container cache of views; `None` when the configured time to live is 0.
pub(crate) struct ViewCache {
    cache: Option<moka::future::Cache<i64, Shown>>,
}

impl ViewCache {
    pub(crate) fn new(ttl: Duration) -> Self {
        let cache = (!ttl.is_zero()).then(|| {
            moka::future::Cache::builder()
                .max_capacity(CAPACITY)
                .time_to_live(ttl)
                .build()
        });
        Self { cache }
    }

    /// The view of `id`, from memory while fresh, else from [`read`] (once for all the
    /// requests waiting on the same id). Failures are not kept.
    async fn get(
        &self,
        redis: &Redis,
        pool: &PgPool,
        known_max: &KnownMax,
        id: i64,
    ) -> Result<Shown, ApiError> {
        match &self.cache {
            None => read(redis, pool, known_max, id).await,
            Some(cache) => cache
                .try_get_with(id, read(redis, pool, known_max, id))
                .await
                .map_err(shared),
        }
    }
}

/// Redis while it holds the sale, else the database row (drafts are nobody's to see), unless
/// the id lies above the highest one the database has.
async fn read(
    redis: &Redis,
    pool: &PgPool,
    known_max: &KnownMax,
    id: i64,
) -> Result<Shown, ApiError> {
    match view::view(redis, id).await {
        Ok(Some(view)) => return Ok(Some(Arc::new(from_redis(view)))),
        Ok(None) => {}
        Err(e) => tracing::warn!(activity_id = id, error = %e,
            "redis view unavailable; answering the database's"),
    }
    if !known_max.may_exist(pool, id).await {
        return Ok(None);
    }
    let row = activity::get(pool, id).await?;
    Ok(row.filter(|a| a.state != ActivityState::Draft).map(|a| {
        Arc::new(Fields {
            title: a.title,
            // Milliseconds, as Redis holds the window: the view reads the same either way.
            start_at: a.start_at.trunc_subsecs(3),
            end_at: a.end_at.trunc_subsecs(3),
            remaining_stock: a.remaining_stock.max(0),
            per_order_limit: a.per_order_limit,
            price_minor: a.price_minor,
            // The database knows the secret but not whether the draw is done: only the
            // commitment.
            draw: (a.admission == Admission::Draw).then(|| PublicDraw {
                commitment: a.draw_secret.commitment(),
                secret: None,
                cutoff: None,
                late_entries: None,
            }),
            currency: a.currency,
        })
    }))
}

fn from_redis(view: ActivityView) -> Fields {
    Fields {
        title: view.title,
        start_at: view.start_at,
        end_at: view.end_at,
        remaining_stock: view.stock,
        per_order_limit: view.per_order_limit,
        price_minor: view.price_minor,
        currency: view.currency,
        draw: view.draw.map(|d| PublicDraw {
            commitment: d.commitment,
            secret: d.secret,
            cutoff: d.cutoff,
            late_entries: d.late_entries,
        }),
    }
}

/// The error every request that waited on one failed read answers: the same status and
/// message (the cause was logged once, by the read).
fn shared(e: Arc<ApiError>) -> ApiError {
    Arc::try_unwrap(e).unwrap_or_else(|e| match e.status().as_u16() {
        503 => ApiError::Unavailable(e.to_string()),
        _ => ApiError::Internal(anyhow::anyhow!("{e}")),
    })
}

#[utoipa::path(
    get,
    path = "/activities/{activityId}",
    tag = "purchase",
    operation_id = "publicActivity",
    summary = "The public view of a sale (no token needed; from Redis while the sale is loaded)",
    params(ActivityId),
    responses(
        (status = 200, description = "The sale, with the live remaining stock; `Cache-Control: public, max-age=1, stale-while-revalidate=2`", body = PublicActivity),
        (status = 400, description = "Bad id (`bad_request`)", body = ErrorBody),
        (status = 404, description = "No such activity, or a draft; `Cache-Control: public, max-age=1`", body = ErrorBody),
        (status = 503, description = "Neither Redis nor the database holds an answer within reach; `Cache-Control: no-store`", body = ErrorBody),
        (status = 500, description = "Unexpected; logged", body = ErrorBody),
    )
)]
pub(crate) async fn public_activity(
    State(state): State<EntryState>,
    ActivityId(id): ActivityId,
) -> Response {
    let s = &state.inner;
    let (response, cache_control) = match s.view.get(&s.redis, &s.pool, &s.known_max, id).await {
        Ok(Some(fields)) => (
            Json(fields.answer(id, Utc::now())).into_response(),
            CACHE_SHOWN,
        ),
        Ok(None) => (
            ApiError::NotFound(format!("activity {id} not found")).into_response(),
            CACHE_NOT_FOUND,
        ),
        Err(e) => (e.into_response(), CACHE_ERROR),
    };
    let mut response = response;
    response
        .headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static(cache_control));
    response
}
