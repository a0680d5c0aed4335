//! An order after confirmation: pay and cancel through the entry router and
//! `seckill_shared::protocol::cancel`, against real Redis (standalone and cluster) and PostgreSQL.
//! Confirmed orders are written here the way the order consumer writes them.

use axum::http::StatusCode;
use axum::Router;
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::order;
use seckill_shared::domain::order::reason;
use seckill_shared::domain::purchase::{Attempt, MessageKind, OrderMessage};
use seckill_shared::protocol;
use seckill_shared::protocol::cancel::CancelOutcome;
use seckill_shared::store;
use seckill_shared::store::ledger;
use seckill_shared::store::ledger::Snapshot;
use seckill_shared::store::purchase;
use serde_json::Value;
use testkit::call;
use testkit::on_both_redis;
use testkit::request;
use testkit::RedisKind;
use testkit::TestEnv;
use uuid::Uuid;

use testkit::{commit_order, db_remaining, end_sale_in_db, snapshot};

struct World {
    env: TestEnv,
    app: Router,
    sale: Activity,
}

async fn world(kind: RedisKind, stock: i64) -> World {
    let env = TestEnv::new(kind).await.unwrap();
    let sale = env.open_sale(stock, 5).await.unwrap();
    let app = env.entry_router();
    World { env, app, sale }
}

impl World {
    /// A purchase the consumer has confirmed: the script's reservation, then what the consumer
    /// does (order row, DB stock down in one transaction, ledger entry dropped after commit).
    async fn confirmed(&self, user: &str, qty: i64) -> i64 {
        let request_id = self.reserve(user, qty).await;
        let id = self.commit(user, qty, request_id).await;
        assert!(
            ledger::settle(&self.env.redis, self.sale.id, user, &request_id.to_string())
                .await
                .unwrap()
        );
        id
    }

    async fn reserve(&self, user: &str, qty: i64) -> Uuid {
        let request_id = Uuid::new_v4();
        let d = testkit::purchase(
            &self.env.redis,
            self.sale.id,
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
        commit_order(&self.env, self.sale.id, user, request_id, qty)
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
        self.post(&format!("/activities/{}/orders", self.sale.id), user)
            .await
    }

    async fn me(&self, user: &str) -> Value {
        let path = format!("/activities/{}/orders/me", self.sale.id);
        let (status, body) = call(&self.app, request("GET", &path, Some((user, "")), None)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }

    async fn redis(&self) -> Snapshot {
        snapshot(&self.env, self.sale.id).await
    }

    async fn db_stock(&self) -> i64 {
        db_remaining(&self.env, self.sale.id).await
    }

    async fn status(&self, order_id: i64) -> String {
        order::get(&self.env.pool, order_id)
            .await
            .unwrap()
            .unwrap()
            .status
    }
}

async fn owner_pays_once_and_paying_again_is_idempotent(kind: RedisKind) -> anyhow::Result<()> {
    let w = world(kind, 10).await;
    let id = w.confirmed("alice", 1).await;

    let (status, body) = w.pay(id, "mallory").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let (status, body) = w.pay(987_654_321, "alice").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    assert_eq!(w.status(id).await, "confirmed", "others cannot pay it");

    // Starting the payment pays nothing: only the provider's event does.
    let (status, started) = w.start_pay(id, "alice").await;
    assert_eq!(status, StatusCode::OK, "{started}");
    assert_eq!(
        (started["status"].as_str(), started["amountMinor"].as_i64()),
        (Some("requires_payment"), Some(w.sale.price_minor))
    );
    let (_, again) = w.start_pay(id, "alice").await;
    assert_eq!(
        again["paymentId"], started["paymentId"],
        "one payment per order"
    );
    assert_eq!(
        w.status(id).await,
        "confirmed",
        "a buyer's say-so pays nothing"
    );

    let (status, first) = w.pay(id, "alice").await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(
        (first["outcome"].as_str(), first["replayed"].as_bool()),
        (Some("paid"), Some(false))
    );
    let paid_at = order::get(&w.env.pool, id).await?.unwrap().paid_at;
    let (status, second) = w.pay(id, "alice").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        second["outcome"], "already_paid",
        "a second payment event pays nothing more"
    );
    assert_eq!(order::get(&w.env.pool, id).await?.unwrap().paid_at, paid_at);
    let (_, after) = w.start_pay(id, "alice").await;
    assert_eq!(
        (after["status"].as_str(), &after["paymentId"]),
        (Some("succeeded"), &started["paymentId"])
    );
    assert_eq!(w.me("alice").await["status"], "paid");
    Ok(())
}
on_both_redis!(owner_pays_once_and_paying_again_is_idempotent);

async fn a_paid_order_cannot_be_cancelled(kind: RedisKind) -> anyhow::Result<()> {
    let w = world(kind, 10).await;
    let id = w.confirmed("alice", 2).await;
    assert_eq!(w.pay(id, "alice").await.0, StatusCode::OK);

    let (status, body) = w.cancel(id, "alice").await;

    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("conflict"))
    );
    assert_eq!(w.status(id).await, "paid");
    assert_eq!((w.db_stock().await, w.redis().await.stock), (8, Some(8)));
    assert!(
        w.redis().await.ledger.is_empty(),
        "the cancel announcement was dropped"
    );
    Ok(())
}
on_both_redis!(a_paid_order_cannot_be_cancelled);

async fn cancel_gives_stock_back_to_db_and_redis_exactly_once(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await;
    let id = w.confirmed("alice", 3).await;
    assert_eq!((w.db_stock().await, w.redis().await.stock), (7, Some(7)));

    let (status, body) = w.cancel(id, "alice").await;

    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "cancelled");
    assert_eq!(body["releasedQuantity"], 3);
    let snap = w.redis().await;
    assert_eq!((w.db_stock().await, snap.stock), (10, Some(10)));
    assert_eq!(snap.participants, 0, "quota freed");
    assert!(snap.ledger.is_empty());
    assert_eq!(w.status(id).await, "cancelled");

    let (status, again) = w.cancel(id, "alice").await;
    assert_eq!(status, StatusCode::OK, "a double cancel is a no-op");
    assert_eq!(again["releasedQuantity"], 0);
    assert_eq!((w.db_stock().await, w.redis().await.stock), (10, Some(10)));
    assert_eq!(w.me("alice").await["status"], "cancelled");
    Ok(())
}
on_both_redis!(cancel_gives_stock_back_to_db_and_redis_exactly_once);

async fn a_user_who_cancelled_can_buy_again(kind: RedisKind) -> anyhow::Result<()> {
    let w = world(kind, 10).await;
    let id = w.confirmed("alice", 1).await;
    assert_eq!(
        w.buy("alice").await.0,
        StatusCode::CONFLICT,
        "one order per user"
    );
    assert_eq!(w.cancel(id, "alice").await.0, StatusCode::OK);

    let (status, body) = w.buy("alice").await;

    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let me = w.me("alice").await;
    assert_eq!(me["status"], "pending");
    assert_eq!(me["requestId"], body["requestId"]);
    Ok(())
}
on_both_redis!(a_user_who_cancelled_can_buy_again);

async fn pay_after_cancel_is_refused(kind: RedisKind) -> anyhow::Result<()> {
    let w = world(kind, 10).await;
    let id = w.confirmed("alice", 1).await;
    assert_eq!(w.cancel(id, "alice").await.0, StatusCode::OK);

    let (status, body) = w.pay(id, "alice").await;

    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("conflict"))
    );
    assert_eq!(w.status(id).await, "cancelled");
    Ok(())
}
on_both_redis!(pay_after_cancel_is_refused);

async fn someone_elses_order_is_not_found_and_stays_untouched(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await;
    let id = w.confirmed("alice", 2).await;

    let (status, body) = w.cancel(id, "mallory").await;

    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    assert_eq!(w.status(id).await, "confirmed");
    assert_eq!((w.db_stock().await, w.redis().await.stock), (8, Some(8)));
    let (status, _) = w.cancel(987_654_321, "alice").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    Ok(())
}
on_both_redis!(someone_elses_order_is_not_found_and_stays_untouched);

/// The payment-timeout path (reconcile) and the owner may cancel at the same moment, and a
/// client may retry: however many run at once, the units come back once.
async fn concurrent_cancels_of_one_order_give_stock_back_once(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await;
    let id = w.confirmed("alice", 4).await;
    let order = order::get(&w.env.pool, id).await.unwrap().unwrap();

    let outcomes = futures::future::join_all((0..20).map(|_| {
        let (pool, redis, order) = (w.env.pool.clone(), w.env.redis.clone(), order.clone());
        tokio::spawn(async move {
            protocol::cancel::cancel_order(&pool, &redis, &order, chrono::Utc::now())
                .await
                .unwrap()
        })
    }))
    .await;

    let outcomes: Vec<_> = outcomes.into_iter().map(Result::unwrap).collect();
    let cancelled = outcomes
        .iter()
        .filter(|o| matches!(o, CancelOutcome::Cancelled { quantity: 4 }))
        .count();
    assert_eq!(cancelled, 1, "{outcomes:?}");
    assert!(outcomes.iter().all(|o| matches!(
        o,
        CancelOutcome::Cancelled { .. } | CancelOutcome::AlreadyCancelled
    )));
    let snap = w.redis().await;
    assert_eq!((w.db_stock().await, snap.stock), (10, Some(10)));
    assert!(snap.ledger.is_empty(), "{:?}", snap.ledger);
    assert_eq!(snap.participants, 0);
    Ok(())
}
on_both_redis!(concurrent_cancels_of_one_order_give_stock_back_once);

/// A second cancel read the order while it was still confirmed (a double click, the payment
/// timeout) and only runs once the first has committed and finished: Redis holds nothing for
/// the order any more, so it answers as a repeated cancel, writes nothing, and the user, who
/// got the quota back, can buy again.
async fn a_cancel_that_read_the_order_before_another_finished_it_gives_no_quota_back(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await;
    let id = w.confirmed("alice", 4).await;
    let stale = order::get(&w.env.pool, id).await?.expect("the order");
    let (pool, redis) = (&w.env.pool, &w.env.redis);
    let now = chrono::Utc::now();

    let first = protocol::cancel::cancel_order(pool, redis, &stale, now).await?;
    assert_eq!(first, CancelOutcome::Cancelled { quantity: 4 });
    let second = protocol::cancel::cancel_order(pool, redis, &stale, now).await?;
    assert_eq!(second, CancelOutcome::AlreadyCancelled);

    let snap = w.redis().await;
    assert_eq!((w.db_stock().await, snap.stock), (10, Some(10)));
    assert!(snap.ledger.is_empty(), "{:?}", snap.ledger);
    assert_eq!(
        snap.participants, 0,
        "the second cancel gave alice a quota back"
    );
    w.reserve("alice", 1).await;
    Ok(())
}
on_both_redis!(a_cancel_that_read_the_order_before_another_finished_it_gives_no_quota_back);

/// The consumer committed the order but had not yet dropped its ledger entry when the cancel
/// came: the order row proves the commit, so the cancel settles the entry and proceeds.
async fn cancel_right_after_commit_before_settle_still_cancels(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await;
    let request_id = w.reserve("alice", 2).await;
    let id = w.commit("alice", 2, request_id).await;

    let (status, body) = w.cancel(id, "alice").await;

    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["releasedQuantity"], 2);
    let snap = w.redis().await;
    assert_eq!((w.db_stock().await, snap.stock), (10, Some(10)));
    assert!(snap.ledger.is_empty());
    Ok(())
}
on_both_redis!(cancel_right_after_commit_before_settle_still_cancels);

/// A crash after the DB commit left the `c` entry behind; cancelling again finishes the Redis
/// half instead of leaving it (or doing it twice).
async fn a_retried_cancel_finishes_what_a_crash_left_half_done(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await;
    let id = w.confirmed("alice", 3).await;
    let now = chrono::Utc::now();
    // Steps 1 and 2 of a cancel, then the "crash": no cancel_finish.
    let order = order::get(&w.env.pool, id).await.unwrap().unwrap();
    let cancel_id = Uuid::now_v7();
    let attempt = store::cancel::CancelAttempt {
        activity_id: w.sale.id,
        user_id: "alice",
        order_id: id,
        request_id: order.request_id,
        quantity: 3,
        cancel_id,
        buckets: 1,
    };
    store::cancel::begin(&w.env.redis, &attempt, now.timestamp_millis())
        .await
        .unwrap();
    let committed = protocol::cancel::commit_cancel(&w.env.pool, id, cancel_id, None, now)
        .await
        .unwrap();
    assert_eq!(committed, protocol::cancel::Committed::Cancelled(3));
    assert_eq!(w.redis().await.stock, Some(7), "Redis half not done yet");

    let (status, body) = w.cancel(id, "alice").await;
    let (status2, _) = w.cancel(id, "alice").await;

    assert_eq!(
        (status, status2),
        (StatusCode::OK, StatusCode::OK),
        "{body}"
    );
    let snap = w.redis().await;
    assert_eq!((w.db_stock().await, snap.stock), (10, Some(10)));
    assert!(snap.ledger.is_empty());
    assert_eq!(snap.participants, 0);
    Ok(())
}
on_both_redis!(a_retried_cancel_finishes_what_a_crash_left_half_done);

async fn cancel_after_the_sale_left_redis_changes_only_the_database(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await;
    let id = w.confirmed("alice", 2).await;
    testkit::lose_sale(&w.env.redis, w.sale.id).await?;

    // While the sale runs, Redis lost it and a reload is due: the cancel waits for it.
    let (status, body) = w.cancel(id, "alice").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("busy"))
    );
    assert_eq!(w.db_stock().await, 8);

    // Ended: no loader loads it again, and the database alone changes.
    end_sale_in_db(&w.env, w.sale.id).await;
    let (status, body) = w.cancel(id, "alice").await;

    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["releasedQuantity"], 2);
    assert_eq!(w.db_stock().await, 10);
    assert!(!w.redis().await.loaded, "nothing recreated in Redis");
    Ok(())
}
on_both_redis!(cancel_after_the_sale_left_redis_changes_only_the_database);

async fn my_order_follows_a_purchase_from_none_to_paid(kind: RedisKind) -> anyhow::Result<()> {
    let w = world(kind, 10).await;
    assert_eq!(w.me("alice").await, serde_json::json!({"status": "none"}));

    let request_id = w.reserve("alice", 2).await;
    let me = w.me("alice").await;
    assert_eq!(me["status"], "pending");
    assert_eq!(me["requestId"], request_id.to_string());

    let id = w.commit("alice", 2, request_id).await;
    ledger::settle(&w.env.redis, w.sale.id, "alice", &request_id.to_string()).await?;
    // The reservation was made as another container makes it: this container's first "none"
    // may be answered from its memory for a second (docs/invariants.md, the status read).
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let me = w.me("alice").await;
    assert_eq!(
        (
            me["status"].as_str(),
            me["orderId"].as_i64(),
            me["quantity"].as_i64()
        ),
        (Some("confirmed"), Some(id), Some(2))
    );
    assert!(me.get("reason").is_none());

    assert_eq!(w.pay(id, "alice").await.0, StatusCode::OK);
    assert_eq!(w.me("alice").await["status"], "paid");

    // A request the database refused shows as failed, with its reason.
    let refused = OrderMessage {
        attempt: Attempt {
            request_id: Uuid::new_v4(),
            activity_id: w.sale.id,
            user_id: "bob".into(),
            quantity: 1,
            buckets: 1,
        },
        reserved_at_ms: 0,
        load_epoch: None,
        kind: MessageKind::Order,
    };
    assert!(order::insert_failed(&w.env.pool, &refused.attempt, reason::SOLD_OUT).await?);
    let me = w.me("bob").await;
    assert_eq!(
        (me["status"].as_str(), me["reason"].as_str()),
        (Some("failed"), Some("sold_out"))
    );
    Ok(())
}
on_both_redis!(my_order_follows_a_purchase_from_none_to_paid);

/// The production statement of `order::latest_for_user`, as the compiler checked it: read from
/// the offline query data in `.sqlx/`, so the plan below is the plan of the shipped query.
fn latest_for_user_statement() -> anyhow::Result<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.sqlx");
    for entry in std::fs::read_dir(&dir)? {
        let data: Value = serde_json::from_str(&std::fs::read_to_string(entry?.path())?)?;
        let query = data["query"].as_str().unwrap_or_default();
        if query.contains("from orders where activity_id = $1 and user_id = $2")
            && query.contains("order by (status in ('confirmed', 'paid')) desc")
        {
            return Ok(query.to_string());
        }
    }
    anyhow::bail!(
        "order::latest_for_user's statement is not in {}",
        dir.display()
    )
}

#[tokio::test]
async fn a_buyers_order_lookup_reads_the_buyer_index_not_every_order_of_the_sale(
) -> anyhow::Result<()> {
    // Arrange: a sale with many orders of other buyers (failed requests of a sold-out crowd).
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let a = env.open_sale(10, 1).await?;
    sqlx::query(
        "insert into orders (request_id, activity_id, user_id, quantity, status, failure_reason)
         select gen_random_uuid(), $1, 'crowd-' || g, 1, 'failed', 'sold_out'
         from generate_series(1, 20000) g",
    )
    .bind(a.id)
    .execute(&env.pool)
    .await?;
    sqlx::query("analyze orders").execute(&env.pool).await?;

    // Act: the planner's plan for the buyer's lookup.
    let explain = format!("explain (format json) {}", latest_for_user_statement()?);
    let (plan,): (Value,) = sqlx::query_as(sqlx::AssertSqlSafe(explain))
        .bind(a.id)
        .bind("crowd-77")
        .fetch_one(&env.pool)
        .await?;

    // Assert: it goes through the (activity, buyer) index, not the sale's orders.
    let plan = plan.to_string();
    assert!(plan.contains("orders_by_buyer"), "{plan}");
    assert!(!plan.contains("Seq Scan"), "{plan}");
    Ok(())
}

/// A cancel announced under one load epoch, paused before its database step while the sale is
/// loaded from scratch (the epoch moves): the database step changes nothing, neither the order
/// nor the stock (the order's update is rolled back with the stock's), and the cancel answers
/// `busy`.
async fn a_cancel_whose_sale_was_reloaded_meanwhile_changes_nothing(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await;
    let id = w.confirmed("alice", 2).await;
    let order = order::get(&w.env.pool, id).await?.unwrap();
    let stock = w.db_stock().await;

    let paused = seckill_shared::infra::pause::arm("cancel.after_begin", w.sale.id);
    let (pool, redis, o) = (w.env.pool.clone(), w.env.redis.clone(), order.clone());
    let canceller = tokio::spawn(async move {
        protocol::cancel::cancel_order(&pool, &redis, &o, chrono::Utc::now()).await
    });
    tokio::time::timeout(std::time::Duration::from_secs(30), paused.reached()).await?;
    let mut conn = w.env.pool.acquire().await?;
    seckill_shared::domain::activity::bump_load_epoch(&mut conn, w.sale.id).await?;
    drop(conn);
    paused.resume();
    let outcome = canceller.await??;

    assert_eq!(outcome, CancelOutcome::Busy);
    assert_eq!(
        w.status(id).await,
        "confirmed",
        "the order's update was rolled back"
    );
    assert_eq!(
        w.db_stock().await,
        stock,
        "no unit came back in the database"
    );
    Ok(())
}
on_both_redis!(a_cancel_whose_sale_was_reloaded_meanwhile_changes_nothing);

/// Redis lost the buyer's field in `users` after her order was confirmed (a failover that
/// dropped the last writes) while the sale stayed loaded. Her cancel completes: the order is
/// cancelled, the units go back to the database and to Redis once, and she may buy again.
async fn a_cancel_of_an_order_whose_field_redis_lost_completes(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await;
    let id = w.confirmed("alice", 2).await;
    assert!(testkit::lose_field(&w.env.redis, w.sale.id, "alice").await?);

    let (status, body) = w.cancel(id, "alice").await;

    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["releasedQuantity"], 2);
    assert_eq!(w.status(id).await, "cancelled");
    let snap = w.redis().await;
    assert_eq!((w.db_stock().await, snap.stock), (10, Some(10)));
    assert!(snap.ledger.is_empty(), "{:?}", snap.ledger);
    assert_eq!(snap.participants, 0);
    let (status, again) = w.cancel(id, "alice").await;
    assert_eq!(
        (status, again["releasedQuantity"].as_i64()),
        (StatusCode::OK, Some(0)),
        "{again}"
    );
    assert_eq!((w.db_stock().await, w.redis().await.stock), (10, Some(10)));
    let (status, body) = w.buy("alice").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    Ok(())
}
on_both_redis!(a_cancel_of_an_order_whose_field_redis_lost_completes);
