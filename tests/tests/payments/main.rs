//! Payment through the provider: `POST /orders/{id}/pay` starts a payment and pays nothing;
//! `POST /payments/webhook` takes the provider's signed events, decides each event id once,
//! and pays only the payment's exact amount for a live order. Through the entry router, against
//! real Redis and PostgreSQL, with the races against a cancel made to happen on purpose.
//!
//! Here the [`World`] of a sale with confirmed orders; the [`webhook`], the [`races`] of a payment
//! with a cancel or the timeout, [`stripe`], the payment's [`closing`] at a stateful fake of
//! Stripe before its order's unit comes back, the events that fake [`delivered`] itself, and the
//! [`refunds`] of money owed back.

mod closing;
mod delivered;
mod races;
mod refunds;
mod stripe;
mod webhook;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use chrono::Utc;
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::order;
use seckill_shared::domain::status::OrderStatus;
use seckill_shared::infra::secret::ExposeSecret;
use serde_json::Value;
use testkit::{self, call, request, RedisKind, TestEnv};
use testkit::{consume, db_remaining, redis_stock, reserve};

struct World {
    env: TestEnv,
    app: Router,
    activity: Activity,
}

async fn world() -> World {
    let env = TestEnv::new(RedisKind::Standalone).await.unwrap();
    let activity = env.open_activity(10, 5).await.unwrap();
    let app = env.entry_router();
    World { env, app, activity }
}

impl World {
    /// An order the consumer confirmed for `user`, `qty` units.
    async fn confirmed(&self, user: &str, qty: i64) -> i64 {
        let rid = reserve(&self.env, self.activity.id, user, qty)
            .await
            .attempt
            .request_id;
        consume(&self.env, self.activity.id, user, rid, qty)
            .await
            .unwrap()
    }

    /// `POST /orders/{id}/pay` as `user`.
    async fn start_pay(&self, order_id: i64, user: &str) -> (StatusCode, Value) {
        let path = format!("/orders/{order_id}/pay");
        call(&self.app, request("POST", &path, Some((user, "")), None)).await
    }

    fn secret(&self) -> String {
        let secret = self.env.config.payments.webhook_secret.as_ref().unwrap();
        secret.expose_secret().to_string()
    }

    /// The provider's event `event_id` for the payment `started`, of `amount`, signed now.
    fn event(&self, event_id: &str, started: &Value, amount: i64) -> Request<Body> {
        let now = Utc::now().timestamp();
        testkit::provider_event(&self.secret(), event_id, started, amount, now)
    }

    async fn deliver(&self, req: Request<Body>) -> (StatusCode, Value) {
        call(&self.app, req).await
    }

    async fn status(&self, order_id: i64) -> OrderStatus {
        order::get(&self.env.pool, order_id)
            .await
            .unwrap()
            .unwrap()
            .status
    }

    async fn events(&self) -> i64 {
        sqlx::query_scalar!(r#"select count(*) as "n!" from payment_events"#)
            .fetch_one(&self.env.pool)
            .await
            .unwrap()
    }

    async fn stocks(&self) -> (i64, Option<i64>) {
        (
            db_remaining(&self.env, self.activity.id).await,
            redis_stock(&self.env, self.activity.id).await,
        )
    }
}
fn amount(started: &Value) -> i64 {
    started["amountMinor"].as_i64().unwrap()
}
