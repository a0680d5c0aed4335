//! Sales for tests: [`new_activity`], a builder of the admin's [`NewActivity`], and the env's
//! ways of creating one and loading it into Redis as production does.

use crate::env::TestEnv;
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use seckill_shared::domain::activity::{self, Activity};
use seckill_shared::domain::settings::{NewActivity, MAX_DRAW_WINDOW_MS};
use seckill_shared::protocol;
use seckill_shared::store::conn::Redis;
use seckill_shared::store::meta::PreheatOutcome;
use std::time::Duration;

/// A sale as an admin creates it (`POST /admin/activities`), open now: "test sale", 10 units,
/// one a purchase, started a minute ago, ending in an hour, 19.99 USD; every optional field
/// left out (the defaults production fills in), until a setter says otherwise.
pub fn new_activity() -> ActivityBuilder {
    let now = Utc::now();
    ActivityBuilder(NewActivity {
        title: "test sale".into(),
        total_stock: 10,
        per_order_limit: 1,
        start_at: now - ChronoDuration::minutes(1),
        end_at: now + ChronoDuration::hours(1),
        buckets: None,
        admission: None,
        draw_window_ms: None,
        per_user_rate_per_sec: None,
        price_minor: 1_999,
        currency: "usd".into(),
        max_entrants: None,
    })
}

/// The fields of a [`NewActivity`], set one by one ([`new_activity`]).
#[derive(Clone, Debug)]
pub struct ActivityBuilder(NewActivity);

impl ActivityBuilder {
    pub fn title(mut self, title: impl Into<String>) -> Self {
        self.0.title = title.into();
        self
    }

    pub fn stock(mut self, total_stock: i64) -> Self {
        self.0.total_stock = total_stock;
        self
    }

    /// The per-order limit.
    pub fn limit(mut self, per_order_limit: i64) -> Self {
        self.0.per_order_limit = per_order_limit;
        self
    }

    /// The sale's window.
    pub fn window(mut self, start_at: DateTime<Utc>, end_at: DateTime<Utc>) -> Self {
        self.0.start_at = start_at;
        self.0.end_at = end_at;
        self
    }

    /// Its stock in `buckets` buckets.
    pub fn buckets(mut self, buckets: u32) -> Self {
        self.0.buckets = Some(i64::from(buckets));
        self
    }

    /// Admission by draw, the pool open for `window_ms` after the start.
    pub fn draw(mut self, window_ms: i64) -> Self {
        self.0.admission = Some("draw".into());
        self.0.draw_window_ms = Some(window_ms);
        self
    }

    /// The per-user purchase rate (0: no limit).
    pub fn rate(mut self, per_user_rate_per_sec: i64) -> Self {
        self.0.per_user_rate_per_sec = Some(per_user_rate_per_sec);
        self
    }

    /// The per-user rate as the admin sends it (`None`: left to the default).
    pub fn rate_of(mut self, per_user_rate_per_sec: Option<i64>) -> Self {
        self.0.per_user_rate_per_sec = per_user_rate_per_sec;
        self
    }

    /// The most entrants a draw sale's pool takes.
    pub fn max_entrants(mut self, max_entrants: i64) -> Self {
        self.0.max_entrants = Some(max_entrants);
        self
    }

    pub fn build(self) -> NewActivity {
        self.0
    }
}

impl TestEnv {
    /// Creates an activity in the database and preheats it into Redis.
    pub async fn activity(
        &self,
        stock: i64,
        limit: i64,
        start_at: DateTime<Utc>,
        end_at: DateTime<Utc>,
    ) -> anyhow::Result<Activity> {
        self.activity_in_buckets(stock, limit, start_at, end_at, 1)
            .await
    }

    /// [`Self::activity`] with its stock in `buckets` buckets.
    pub async fn activity_in_buckets(
        &self,
        stock: i64,
        limit: i64,
        start_at: DateTime<Utc>,
        end_at: DateTime<Utc>,
        buckets: u32,
    ) -> anyhow::Result<Activity> {
        // No rate: these sales test other rules, and a test's crowd may be one user.
        let new = new_activity()
            .stock(stock)
            .limit(limit)
            .window(start_at, end_at)
            .buckets(buckets)
            .rate(0);
        self.load_new(&new.build()).await
    }

    /// Creates the activity `new` in the database and loads it into Redis, as an admin's
    /// create of a sale inside the preheat lead does.
    pub async fn load_new(&self, new: &NewActivity) -> anyhow::Result<Activity> {
        let a = activity::insert(&self.pool, &new.settings()?).await?;
        let (_, loaded) = protocol::load::load_under_lock(
            &self.redis,
            &self.pool,
            &self.config,
            a.id,
            crate::a_minute_from_now(),
        )
        .await?;
        Ok(loaded)
    }

    /// A draw sale whose pool is open now: started a second ago, its draw window the longest
    /// (tests close it with [`crate::close_draw_window`]), ends in an hour.
    pub async fn draw_activity(&self, stock: i64, limit: i64) -> anyhow::Result<Activity> {
        let now = Utc::now();
        // No rate: these sales test other rules, and a test's crowd may be one user.
        let new = new_activity()
            .title("test draw")
            .stock(stock)
            .limit(limit)
            .window(
                now - ChronoDuration::seconds(1),
                now + ChronoDuration::hours(1),
            )
            .draw(MAX_DRAW_WINDOW_MS)
            .rate(0);
        self.load_new(&new.build()).await
    }

    /// A sale that is open now (started a minute ago, ends in an hour).
    pub async fn open_activity(&self, stock: i64, limit: i64) -> anyhow::Result<Activity> {
        self.open_activity_in_buckets(stock, limit, 1).await
    }

    /// [`Self::open_activity`] with its stock in `buckets` buckets.
    pub async fn open_activity_in_buckets(
        &self,
        stock: i64,
        limit: i64,
        buckets: u32,
    ) -> anyhow::Result<Activity> {
        let now = Utc::now();
        self.activity_in_buckets(
            stock,
            limit,
            now - ChronoDuration::minutes(1),
            now + ChronoDuration::hours(1),
            buckets,
        )
        .await
    }
}

/// Loads `activity` into Redis as preheat would, for tests and the benchmark, which may load
/// activities the database does not hold: the lock is taken directly in Redis by
/// `lua/lock_acquire.lua` with no database floor (its token fences nothing), held for the one
/// script, and released.
pub async fn load_without_db(
    redis: &Redis,
    activity: &Activity,
    buffer: Duration,
) -> anyhow::Result<PreheatOutcome> {
    let owner = uuid::Uuid::new_v4().to_string();
    let keys = redis.keys(activity.id);
    let mut inv = seckill_shared::store::scripts::LOCK_ACQUIRE.prepare_invoke();
    inv.key(&keys.lock)
        .key(&keys.fence)
        .arg(&owner)
        .arg(10_000)
        .arg(0);
    let token: i64 = redis.script(&inv).await?;
    anyhow::ensure!(token > 0, "activity {} is locked", activity.id);
    let outcome = seckill_shared::store::meta::preheat(redis, activity, buffer, &owner).await;
    protocol::lock::release_owned(redis, activity.id, &owner).await?;
    Ok(outcome?)
}
