//! An order after confirmation: pay and cancel through the entry router and
//! `seckill_shared::protocol::cancel`, against real Redis (standalone and cluster) and PostgreSQL.
//! Confirmed orders are written here the way the order consumer writes them.
//!
//! Here the [`World`] of a sale with its buyers; the buyer's [`orders`] (pay, status, lookup), and
//! [`cancels`].

mod cancels;
mod orders;

use axum::http::StatusCode;
use axum::Router;
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::order;
use seckill_shared::domain::status::OrderStatus;
use seckill_shared::store::ledger;
use seckill_shared::store::ledger::Snapshot;
use seckill_shared::store::purchase;
use serde_json::Value;
use testkit::call;
use testkit::request;
use testkit::RedisKind;
use testkit::TestEnv;
use testkit::{commit_order, db_remaining, snapshot};
use uuid::Uuid;

struct World {
    env: TestEnv,
    app: Router,
    activity: Activity,
}

async fn world(kind: RedisKind, stock: i64) -> World {
    let env = TestEnv::new(kind).await.unwrap();
    let activity = env.open_activity(stock, 5).await.unwrap();
    let app = env.entry_router();
    World { env, app, activity }
}

impl World {
    /// A purchase the consumer has confirmed: the script's reservation, then what the consumer
    /// does (order row, DB stock down in one transaction, ledger entry dropped after commit).
    async fn confirmed(&self, user: &str, qty: i64) -> i64 {
        let request_id = self.reserve(user, qty).await;
        let id = self.commit(user, qty, request_id).await;
        assert!(ledger::settle(
            &self.env.redis,
            self.activity.id,
            user,
            &request_id.to_string()
        )
        .await
        .unwrap());
        id
    }

    async fn reserve(&self, user: &str, qty: i64) -> Uuid {
        let request_id = Uuid::new_v4();
        let d = testkit::purchase(
            &self.env.redis,
            self.activity.id,
            user,
            qty,
            request_id,
            purchase::far_deadline(),
        )
        .await
        .unwrap();
        assert!(d.is_ok(), "{d:?}");
        request_id
    }

    async fn commit(&self, user: &str, qty: i64, request_id: Uuid) -> i64 {
        commit_order(&self.env, self.activity.id, user, request_id, qty)
            .await
            .unwrap()
    }

    async fn post(&self, path: &str, user: &str) -> (StatusCode, Value) {
        call(&self.app, request("POST", path, Some((user, "")), None)).await
    }

    /// `POST …/pay`: starts the payment at the provider, pays nothing.
    async fn start_pay(&self, order_id: i64, user: &str) -> (StatusCode, Value) {
        self.post(&format!("/orders/{order_id}/pay"), user).await
    }

    /// The buyer starts the payment and completes it: the provider's signed event reaches the
    /// webhook. Answers the webhook's answer (or the start's refusal).
    async fn pay(&self, order_id: i64, user: &str) -> (StatusCode, Value) {
        testkit::pay_through_provider(&self.app, &self.env.config, order_id, user).await
    }

    async fn cancel(&self, order_id: i64, user: &str) -> (StatusCode, Value) {
        self.post(&format!("/orders/{order_id}/cancel"), user).await
    }

    async fn buy(&self, user: &str) -> (StatusCode, Value) {
        self.post(&format!("/activities/{}/orders", self.activity.id), user)
            .await
    }

    async fn me(&self, user: &str) -> Value {
        let path = format!("/activities/{}/orders/me", self.activity.id);
        let (status, body) = call(&self.app, request("GET", &path, Some((user, "")), None)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }

    async fn redis(&self) -> Snapshot {
        snapshot(&self.env, self.activity.id).await
    }

    async fn db_stock(&self) -> i64 {
        db_remaining(&self.env, self.activity.id).await
    }

    async fn status(&self, order_id: i64) -> OrderStatus {
        order::get(&self.env.pool, order_id)
            .await
            .unwrap()
            .unwrap()
            .status
    }
}
