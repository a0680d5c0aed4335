//! The give-back protocol under interleavings that real concurrency hits only by luck.
//!
//! Each test stops one actor at a named pause point (`seckill_shared::infra::pause`) between two of
//! its steps, runs another actor to the end, resumes the first, and then checks what
//! `docs/invariants.md` promises: every unit has one fate, decided once by the database
//! (an order, or a `failed` row whose units went back to Redis exactly once), a 503 means
//! nothing was sold, and Redis stock written from outside the purchase and give-back scripts
//! never erases a move it did not see.
//!
//! Here the [`World`] every test stands on (one sale and each actor that can touch it); the tests
//! by the actor that is stopped: [`cancels`], [`messages`] (a purchase between its reservation and
//! its order), [`admin_changes`], [`loads`], [`repairs`] (reconcile's) and [`restores`] (of a lost
//! field).

mod admin_changes;
mod cancels;
mod loads;
mod messages;
mod repairs;
mod restores;

use axum::http::StatusCode;
use axum::Router;
use chrono::Utc;
use order_consumer::Consumer;
use preheat::Preheat;
use reconcile::Reconcile;
use seckill_shared::domain::activity;
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::order;
use seckill_shared::domain::order::Order;
use seckill_shared::domain::purchase::OrderMessage;
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol::cancel;
use seckill_shared::protocol::cancel::{CancelError, CancelOutcome};
use seckill_shared::protocol::consume::Decision;
use seckill_shared::store::keys::SENTINEL;
use serde_json::Value;
use std::collections::BTreeSet;
use std::time::Duration;
use testkit::call;
use testkit::invariants::{self, Books};
use testkit::request;
use testkit::RedisKind;
use testkit::TestEnv;
use uuid::Uuid;

const GRACE: Duration = Duration::from_secs(5);

/// One sale and every actor that can touch it.
struct World {
    env: TestEnv,
    app: Router,
    activity: Activity,
}

async fn world(kind: RedisKind, stock: i64) -> anyhow::Result<World> {
    let mut env = TestEnv::new(kind).await?;
    env.config.reconcile_grace = GRACE;
    let activity = env.open_activity(stock, 5).await?;
    Ok(World::new(env, activity))
}

impl World {
    fn new(env: TestEnv, activity: Activity) -> Self {
        let app = env.entry_router();
        Self { env, app, activity }
    }

    fn id(&self) -> i64 {
        self.activity.id
    }

    fn consumer(&self) -> Consumer {
        self.env.consumer()
    }

    fn reconcile(&self) -> Reconcile {
        self.env.reconcile()
    }

    fn preheat(&self) -> Preheat {
        self.env.preheat()
    }

    fn admin(&self) -> admin::AdminState {
        self.env.admin_state()
    }

    /// A purchase through the entry router.
    async fn buy(&self, user: &str, qty: i64) -> (StatusCode, Value) {
        let body = format!(r#"{{"quantity":{qty}}}"#);
        let path = format!("/activities/{}/orders", self.id());
        call(
            &self.app,
            request("POST", &path, Some((user, "")), Some(&body)),
        )
        .await
    }

    /// The order messages on the queue, in order (they are received, not deleted).
    async fn messages(&self) -> anyhow::Result<Vec<OrderMessage>> {
        let mut out = Vec::new();
        for m in self.env.drain_messages(100).await? {
            out.push(serde_json::from_str(m.body().unwrap_or_default())?);
        }
        Ok(out)
    }

    /// An accepted purchase whose message is on the queue, not consumed.
    async fn pending(&self, user: &str, qty: i64) -> anyhow::Result<OrderMessage> {
        let (status, body) = self.buy(user, qty).await;
        anyhow::ensure!(status == StatusCode::ACCEPTED, "{user}: {status} {body}");
        let request_id: Uuid = body["requestId"].as_str().unwrap_or_default().parse()?;
        self.messages()
            .await?
            .into_iter()
            .find(|m| m.attempt.request_id == request_id)
            .ok_or_else(|| anyhow::anyhow!("message of {request_id} not on the queue"))
    }

    /// A purchase the consumer has confirmed (order row, DB stock, ledger entry dropped).
    async fn confirmed(&self, user: &str, qty: i64) -> anyhow::Result<Order> {
        let message = self.pending(user, qty).await?;
        let request_id = message.attempt.request_id;
        let done = self.consumer().handle_message(&message).await?;
        anyhow::ensure!(done.decision == Decision::Committed, "{done:?}");
        self.order_of(request_id)
            .await?
            .ok_or_else(|| anyhow::anyhow!("no order for {request_id}"))
    }

    async fn order_of(&self, request_id: Uuid) -> anyhow::Result<Option<Order>> {
        Ok(order::by_request(&self.env.pool, request_id).await?)
    }

    /// A cancel of `order` (as read then), running on its own task.
    fn spawn_cancel(
        &self,
        order: &Order,
    ) -> tokio::task::JoinHandle<Result<CancelOutcome, CancelError>> {
        let ((pool, redis), order) = (self.env.login(Function::Entry), order.clone());
        tokio::spawn(async move { cancel::cancel_order(&pool, &redis, &order, Utc::now()).await })
    }

    async fn cancel(&self, order_id: i64) -> anyhow::Result<CancelOutcome> {
        let order = order::get(&self.env.pool, order_id)
            .await?
            .ok_or_else(|| anyhow::anyhow!("no order {order_id}"))?;
        let (pool, redis) = self.env.login(Function::Entry);
        Ok(cancel::cancel_order(&pool, &redis, &order, Utc::now()).await?)
    }

    /// The users `users` holds (the sentinel field not counted).
    async fn users(&self) -> anyhow::Result<BTreeSet<String>> {
        let keys = self.env.redis.keys(self.id());
        let users: Vec<String> = self
            .env
            .redis
            .cmd(redis::cmd("HKEYS").arg(&keys.users))
            .await?;
        Ok(users.into_iter().filter(|u| u != SENTINEL).collect())
    }

    /// Users holding a live (confirmed or paid) order.
    async fn holders(&self) -> anyhow::Result<BTreeSet<String>> {
        let holders = order::live_holders(&self.env.pool, self.id()).await?;
        Ok(holders.into_iter().map(|(user, _)| user).collect())
    }

    /// A user in `users` with nothing behind them (no entry, no order): what a crash can leave.
    async fn orphan(&self, user: &str) -> anyhow::Result<()> {
        let keys = self.env.redis.keys(self.id());
        let _: i64 = self
            .env
            .redis
            .cmd(
                redis::cmd("HSET")
                    .arg(&keys.users)
                    .arg(user)
                    .arg(Uuid::new_v4().to_string()),
            )
            .await?;
        Ok(())
    }

    /// Drift by hand: Redis stock set behind every script's back.
    async fn set_stock(&self, stock: i64) -> anyhow::Result<()> {
        let keys = self.env.redis.keys(self.id());
        let _: i64 = self
            .env
            .redis
            .cmd(redis::cmd("HSET").arg(&keys.meta).arg("stock").arg(stock))
            .await?;
        Ok(())
    }

    /// Redis loses the sale, as after a restart with no data.
    async fn unload(&self) -> anyhow::Result<()> {
        testkit::lose_activity(&self.env.redis, self.id()).await
    }

    async fn db_row(&self) -> anyhow::Result<Activity> {
        activity::get(&self.env.pool, self.id())
            .await?
            .ok_or_else(|| anyhow::anyhow!("activity gone"))
    }

    /// With traffic (a young reservation) reconcile cannot correct the stock: whatever drift
    /// is left now stays for the rest of the sale.
    async fn drift_under_traffic(&self) -> anyhow::Result<Option<String>> {
        self.pending("bob", 1).await?;
        let report = self.reconcile().run(Utc::now()).await?;
        let r = report
            .activity(self.id())
            .ok_or_else(|| anyhow::anyhow!("not reconciled"))?;
        Ok((r.drift != 0).then(|| {
            format!(
                "next reconcile with traffic: {:?}, drift {} stays",
                r.stock_check, r.drift
            )
        }))
    }

    /// What docs/invariants.md promises of the sale at a quiet moment: the kit's checker.
    async fn assert_conserved(&self) -> anyhow::Result<()> {
        invariants::check(&self.env, self.id()).await
    }

    /// The kit's checker's violations, for a test that adds findings of its own.
    async fn violations(&self) -> anyhow::Result<Vec<String>> {
        let books = Books::read(&self.env.redis, &self.env.pool, self.id()).await?;
        Ok(books.violations().iter().map(ToString::to_string).collect())
    }
}
async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> anyhow::Result<T> {
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .map_err(|_| anyhow::anyhow!("{what} did not finish"))
}

/// Awaits a spawned actor and its result.
async fn joined<T, E: std::fmt::Debug>(
    what: &str,
    task: tokio::task::JoinHandle<Result<T, E>>,
) -> anyhow::Result<T> {
    within(what, task)
        .await??
        .map_err(|e| anyhow::anyhow!("{what} failed: {e:?}"))
}
