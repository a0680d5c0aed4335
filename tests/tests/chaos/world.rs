//! What one seed's actors share: the sale(s), the two views of the services (the entry's, and the
//! patient one of every other actor), the clicks and their answers, the findings; and the seed's
//! services set up.

use crate::buyers::{buyer, lost_replies};
use crate::consumers::consumer;
use crate::faults::{draw_key_loss, key_loss, lost_fields, redis_pauses};
use crate::jobs::{preheats, reconciles};
use crate::orders::{admin_changes, order_clicks};
use crate::quiescence::delete_queue;
use crate::report::Report;
use crate::watcher::watcher;
use crate::{
    Variant, ACTOR_STOP_LIMIT, BUYERS, CONSUMERS, ENTRY_REDIS_TIMEOUT_CLUSTER,
    ENTRY_REDIS_TIMEOUT_STANDALONE, MAX_RECEIVE_COUNT, PATIENT_REDIS_TIMEOUT, PER_ORDER_LIMIT,
    SOLD_OUT_CACHE_TTL, VISIBILITY_TIMEOUT_SECS,
};
use anyhow::Context as _;
use chrono::{Duration as ChronoDuration, Utc};
use order_consumer::Consumer;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use seckill_shared::infra::sqs::OrderQueue;
use seckill_shared::store::buckets;
use seckill_shared::store::keys::Bucket;
use seckill_shared::store::ledger;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use testkit::invariants::Violation;
use testkit::PrivateRedis;
use testkit::RedisKind;
use testkit::TestEnv;
use tokio::task::JoinHandle;
use uuid::Uuid;

/// What one seed's actors share.
pub struct Chaos {
    pub seed: u64,
    pub variant: Variant,
    pub env: TestEnv,
    /// The services as every actor but the entry sees them: its Redis handle waits out a
    /// pause, and with reconcile on its grace is short.
    pub patient: TestEnv,
    pub private: Option<PrivateRedis>,
    pub router: axum::Router,
    pub activities: Vec<i64>,
    /// Each sale's bucket count (1: one bucket).
    buckets: HashMap<i64, u32>,
    /// The draw sales and their draw window.
    pub draws: HashMap<i64, Duration>,
    stocks: Vec<i64>,
    pub users: Vec<String>,
    attempts_budget: u64,
    pub stop: AtomicBool,
    pub attempts: Mutex<Vec<Attempt>>,
    pub report: Mutex<Report>,
    findings: Mutex<Vec<Finding>>,
    /// Each payment started, (order id, PaymentIntent id), for the check at quiescence.
    pub payments: Mutex<Vec<(i64, String)>>,
    /// The Stripe provider at localstripe, as the entry and reconcile hold it.
    pub stripe: Arc<dyn seckill_shared::infra::payments::Provider>,
}

/// One purchase click and its answer.
#[derive(Clone, Debug)]
pub struct Attempt {
    pub activity_id: i64,
    pub user: String,
    pub quantity: i64,
    /// 0: no answer within [`REQUEST_LIMIT`].
    pub status: u16,
    /// A 202 `queued`: in a draw sale's pool.
    pub queued: bool,
    pub request_id: Option<Uuid>,
    pub code: Option<String>,
}

/// The running actors. Dropped before they were joined (a seed that failed or ran out of
/// time), they are aborted, so none of them outlives its seed and meddles with the next one
/// (whose sale has the same id in its own fresh database).
pub struct Actors(Vec<(&'static str, JoinHandle<anyhow::Result<()>>)>);

impl Drop for Actors {
    fn drop(&mut self) {
        for (_, handle) in &self.0 {
            handle.abort();
        }
    }
}
/// A broken check, with how often it was seen (the watcher sees a lasting one many times).
struct Finding {
    check: &'static str,
    activity_id: Option<i64>,
    detail: String,
    times: u64,
}

/// How a consumer treats one received batch.
#[derive(Clone, Copy, Debug)]
pub enum Delivery {
    Once,
    TwiceInARow,
    TwiceAtOnce,
    /// The consumer is killed a few milliseconds in; nothing is deleted.
    DiesMidBatch,
    /// Handled, but the consumer dies before deleting: a redelivery is a duplicate.
    NotDeleted,
}

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Chaos {
    pub async fn new(variant: Variant, seed: u64, phase: Duration) -> anyhow::Result<Self> {
        let mut rng = seeded(seed, 0);
        let (private, env) = test_env(variant.kind).await?;
        let mut config = env.config.clone();
        config.redis_timeout = PATIENT_REDIS_TIMEOUT;
        // Payments through the Stripe provider at localstripe (the fake of Stripe's API), under
        // a stack name of this seed's own: localstripe is shared by every run.
        testkit::localstripe::stripe_at(&mut config, testkit::localstripe::LOCALSTRIPE);
        config.payments.stack = format!("chaos-{seed}-{}", Uuid::new_v4().simple());
        if variant.reconcile {
            config.reconcile_grace = Duration::from_millis(rng.random_range(1000..=2000));
        }
        let patient_provider = config
            .payments
            .provider()
            .context("the Stripe provider at localstripe")?;
        let mut patient = env.clone();
        patient.config = config;
        patient.reconnect().await?;

        let mut stocks = vec![rng.random_range(20..=60)];
        if rng.random_bool(0.5) {
            stocks.push(rng.random_range(10..=40));
        }
        // Half the sales keep their stock in 2-4 buckets (their own stream: the rest of the
        // seed's scenario is drawn as before).
        let mut layout = seeded(seed, 11);
        // Some one-bucket sales admit by draw (their own stream too).
        let mut admission = seeded(seed, 12);
        let mut activities = Vec::new();
        let mut buckets = HashMap::new();
        let mut draws = HashMap::new();
        for &stock in &stocks {
            let count = if layout.random_bool(0.5) {
                layout.random_range(2..=4)
            } else {
                1
            };
            let window = (count == 1 && admission.random_bool(0.6))
                .then(|| phase.mul_f64(admission.random_range(0.25..0.6)));
            let id = match window {
                Some(window) => draw_activity(&env, stock, window).await?,
                None => {
                    env.open_activity_in_buckets(stock, PER_ORDER_LIMIT, count)
                        .await?
                        .id
                }
            };
            activities.push(id);
            buckets.insert(id, count);
            if let Some(window) = window {
                draws.insert(id, window);
            }
        }
        let users = (0..rng.random_range(15..=45))
            .map(|i| format!("user-{i}"))
            .collect();
        // 40-100 clicks a second, whatever the phase's length.
        let per_second = rng.random_range(40..=100u64) as f64;
        let clicks = (per_second * phase.as_secs_f64()) as u64;
        let attempts_budget = clicks.div_ceil(BUYERS) * BUYERS;
        let router = env.entry_router();
        Ok(Self {
            seed,
            variant,
            env,
            patient,
            private,
            router,
            activities,
            buckets,
            draws,
            stocks,
            users,
            attempts_budget,
            stop: AtomicBool::new(false),
            attempts: Mutex::new(Vec::new()),
            report: Mutex::new(Report::default()),
            findings: Mutex::new(Vec::new()),
            payments: Mutex::new(Vec::new()),
            stripe: patient_provider,
        })
    }

    pub fn announce(&self, phase: Duration) {
        let grace = if self.variant.reconcile {
            format!(
                ", reconcile grace {:?}",
                self.patient.config.reconcile_grace
            )
        } else {
            String::new()
        };
        let draws: Vec<String> = self
            .activities
            .iter()
            .filter_map(|id| {
                self.draws
                    .get(id)
                    .map(|w| format!("sale {id} draws after {w:?}"))
            })
            .collect();
        println!(
            "seed={} [{}]: sales {:?} with stock {:?} in {:?} bucket(s) (limit {PER_ORDER_LIMIT}), \
             {:?}, {} users, {} attempts, {phase:?} of actors{grace}",
            self.seed,
            self.variant,
            self.activities,
            self.stocks,
            self.activities.iter().map(|id| self.buckets[id]).collect::<Vec<_>>(),
            draws,
            self.users.len(),
            self.attempts_budget
        );
    }

    /// Every bucket of a sale.
    pub fn buckets_of(&self, id: i64) -> impl Iterator<Item = Bucket> {
        Bucket::all(id, self.buckets.get(&id).copied().unwrap_or(1))
    }

    /// Every bucket's snapshot of a sale, bucket 0 first.
    pub async fn snapshots(&self, id: i64) -> anyhow::Result<Vec<(Bucket, ledger::Snapshot)>> {
        let count = self.buckets.get(&id).copied().unwrap_or(1);
        Ok(buckets::snapshots(&self.patient.redis, id, count).await?)
    }

    /// The RNG of one actor (`stream`), derived from the seed only.
    pub fn rng(&self, stream: u64) -> StdRng {
        seeded(self.seed, stream)
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Sleeps `ms`, waking early when the actors are told to stop. False once stopped.
    pub async fn nap(&self, ms: u64) -> bool {
        let until = Instant::now() + Duration::from_millis(ms);
        while !self.stopped() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return true;
            }
            tokio::time::sleep(left.min(Duration::from_millis(50))).await;
        }
        false
    }

    /// The first sale gets most of the traffic.
    pub fn pick_activity(&self, rng: &mut StdRng) -> i64 {
        match self.activities.get(1) {
            Some(&second) if rng.random_bool(0.3) => second,
            _ => self.activities[0],
        }
    }

    pub fn count(&self, f: impl FnOnce(&mut Report)) {
        f(&mut lock(&self.report));
    }

    /// Records a broken check. The seed and variant are added when it is printed.
    pub fn violate(&self, check: &'static str, activity_id: Option<i64>, detail: String) {
        let mut findings = lock(&self.findings);
        match findings
            .iter_mut()
            .find(|f| f.check == check && f.activity_id == activity_id)
        {
            Some(f) => f.times += 1,
            None => findings.push(Finding {
                check,
                activity_id,
                detail,
                times: 1,
            }),
        }
    }

    /// Records a broken promise of the kit's invariant checker, under its name.
    pub fn broke(&self, id: i64, v: Violation) {
        self.violate(v.invariant.name(), Some(id), v.detail);
    }

    pub fn findings(&self) -> Vec<String> {
        lock(&self.findings)
            .iter()
            .map(|f| {
                let activity = f
                    .activity_id
                    .map(|id| format!(" sale {id}"))
                    .unwrap_or_default();
                let times = if f.times > 1 {
                    format!(" (seen {} times)", f.times)
                } else {
                    String::new()
                };
                format!(
                    "seed={} [{}] check {}{activity}: {}{times}",
                    self.seed, self.variant, f.check, f.detail
                )
            })
            .collect()
    }

    pub fn consumer(&self) -> Consumer {
        self.patient.consumer()
    }

    pub fn spawn_actors(self: &Arc<Self>, phase: Duration) -> Actors {
        let mut actors = Vec::new();
        let per_buyer = self.attempts_budget / BUYERS;
        // Paced so a buyer's clicks spread over the whole phase.
        let gap = phase / per_buyer.max(1) as u32;
        for i in 0..BUYERS {
            let actor = buyer(self.clone(), i, per_buyer, gap);
            actors.push(("buyer", tokio::spawn(actor)));
        }
        for i in 0..CONSUMERS {
            actors.push(("consumer", tokio::spawn(consumer(self.clone(), i))));
        }
        actors.push(("lost replies", tokio::spawn(lost_replies(self.clone()))));
        actors.push(("order clicks", tokio::spawn(order_clicks(self.clone()))));
        actors.push(("admin", tokio::spawn(admin_changes(self.clone()))));
        actors.push(("preheat", tokio::spawn(preheats(self.clone()))));
        actors.push(("watcher", tokio::spawn(watcher(self.clone()))));
        if self.private.is_some() {
            actors.push(("redis pauses", tokio::spawn(redis_pauses(self.clone()))));
        }
        if self.variant.reconcile {
            actors.push(("reconcile", tokio::spawn(reconciles(self.clone()))));
            actors.push(("key loss", tokio::spawn(key_loss(self.clone(), phase))));
            actors.push(("lost fields", tokio::spawn(lost_fields(self.clone()))));
            actors.push(("draw key loss", tokio::spawn(draw_key_loss(self.clone()))));
        }
        Actors(actors)
    }

    /// Waits for every actor, within one shared limit; a straggler is aborted and reported.
    pub async fn join(&self, mut actors: Actors) {
        let until = tokio::time::Instant::now() + ACTOR_STOP_LIMIT;
        for (name, mut handle) in std::mem::take(&mut actors.0) {
            match tokio::time::timeout_at(until, &mut handle).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => {
                    self.violate("harness", None, format!("actor {name} failed: {e:#}"))
                }
                Ok(Err(e)) => self.violate("harness", None, format!("actor {name} panicked: {e}")),
                Err(_) => {
                    handle.abort();
                    let _ = handle.await;
                    self.violate(
                        "actors_stop",
                        None,
                        format!("actor {name} still ran {ACTOR_STOP_LIMIT:?} after the stop"),
                    );
                }
            }
        }
    }

    pub fn resume_redis(&self) {
        if let Some(p) = &self.private {
            p.signal("-CONT");
        }
    }
}
/// The seed's services, as the entry sees them: its own standalone Redis (which the test may
/// pause) or the shared cluster, and a queue with a short visibility timeout, so a dead
/// consumer's batch comes back soon.
async fn test_env(kind: RedisKind) -> anyhow::Result<(Option<PrivateRedis>, TestEnv)> {
    let (private, mut env) = match kind {
        RedisKind::Standalone => {
            let private = PrivateRedis::start().await;
            let env = private
                .env(ENTRY_REDIS_TIMEOUT_STANDALONE, SOLD_OUT_CACHE_TTL)
                .await;
            (Some(private), env)
        }
        RedisKind::Cluster => {
            let mut env = TestEnv::new(RedisKind::Cluster).await?;
            env.config.redis_timeout = ENTRY_REDIS_TIMEOUT_CLUSTER;
            env.config.sold_out_cache_ttl = SOLD_OUT_CACHE_TTL;
            env.reconnect().await?;
            (None, env)
        }
        // The chaos run pauses and restarts its standalone server: it brings its own.
        RedisKind::Valkey => anyhow::bail!("the chaos run has no Valkey variant"),
    };
    let unused = env.queue.url.clone();
    let url = testkit::fresh_queue(&env.sqs, VISIBILITY_TIMEOUT_SECS, MAX_RECEIVE_COUNT).await?;
    delete_queue(&env.sqs, &unused).await;
    env.config.order_queue_url = url.clone();
    env.config.entry_queue_url = Some(testkit::entries_url(&url));
    env.queue = OrderQueue::new(env.sqs.clone(), url, env.config.sqs_timeout);
    Ok((private, env))
}

/// A draw sale opening now, its pool open for `window`, loaded into Redis.
async fn draw_activity(env: &TestEnv, stock: i64, window: Duration) -> anyhow::Result<i64> {
    let now = Utc::now();
    let a = env
        .load_new(
            &testkit::new_activity()
                .title("chaos draw")
                .stock(stock)
                .limit(PER_ORDER_LIMIT)
                .window(now, now + ChronoDuration::hours(1))
                .draw(window.as_millis().max(1) as i64)
                .build(),
        )
        .await?;
    Ok(a.id)
}

fn seeded(seed: u64, stream: u64) -> StdRng {
    StdRng::seed_from_u64(
        seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(stream),
    )
}
