//! The buyer's path on the roles of its functions: the entry as `seckill_entry` (and no more than
//! its path), the consumer as `seckill_consumer`.

use crate::{consume_queue_as_consumer, login_as, new_env, pool_as, refused};
use axum::http::StatusCode;
use seckill_shared::domain::order;
use seckill_shared::domain::purchase::OrderMessage;
use seckill_shared::domain::status::{FailureReason, OrderStatus};
use seckill_shared::infra::sqs::{OrderQueue, Queues};
use std::time::Duration;
use testkit::call;
use testkit::request;
use testkit::{consume, db_remaining, reserve, set_db_stock_by_hand};

/// The entry (internet-facing) as `seckill_entry`: a purchase, the buyer's order, a pay, a
/// cancel, the public view, and the `failed` claim after a send that failed; the consumer as
/// `seckill_consumer` confirms the orders in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_entry_role_runs_a_buyers_whole_path() -> anyhow::Result<()> {
    let env = new_env().await;
    let a = env.open_activity(10, 2).await?;
    let login = login_as(&env, "seckill_entry").await;
    let entry = env.entry_router_with(|c| login.on(c));
    let buy = |user: &'static str| {
        let path = format!("/activities/{}/orders", a.id);
        let entry = entry.clone();
        async move {
            call(
                &entry,
                request("POST", &path, Some((user, "")), Some(r#"{"quantity":1}"#)),
            )
            .await
        }
    };

    for user in ["alice", "bob", "dave"] {
        let (status, body) = buy(user).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    }
    assert_eq!(consume_queue_as_consumer(&env).await.0, 3);
    let me = format!("/activities/{}/orders/me", a.id);
    let mine = |user: &'static str| call(&entry, request("GET", &me, Some((user, "")), None));
    let (status, alice) = mine("alice").await;
    assert_eq!(
        (status, alice["status"].as_str()),
        (StatusCode::OK, Some("confirmed")),
        "{alice}"
    );
    let (_, bob) = mine("bob").await;

    let alice_order = alice["orderId"].as_i64().unwrap();
    let (status, paid) =
        testkit::pay_through_provider(&entry, &env.config, alice_order, "alice").await;
    assert_eq!(
        (status, paid["outcome"].as_str()),
        (StatusCode::OK, Some("paid")),
        "{paid}"
    );
    let cancel = format!("/orders/{}/cancel", bob["orderId"]);
    let (status, cancelled) = call(&entry, request("POST", &cancel, Some(("bob", "")), None)).await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    assert_eq!(cancelled["releasedQuantity"], 1);
    assert_eq!(db_remaining(&env, a.id).await, 8, "bob's unit is back");
    // A cancel whose buyer's field Redis lost restores it first.
    let (_, dave) = mine("dave").await;
    assert!(testkit::lose_field(&env.redis, a.id, "dave").await?);
    let cancel = format!("/orders/{}/cancel", dave["orderId"]);
    let (status, cancelled) =
        call(&entry, request("POST", &cancel, Some(("dave", "")), None)).await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    assert_eq!(cancelled["releasedQuantity"], 1);
    assert_eq!(db_remaining(&env, a.id).await, 9, "dave's unit is back");
    let (status, view) = call(
        &entry,
        request("GET", &format!("/activities/{}", a.id), None, None),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{view}");

    // A send that fails: the entry claims the request with a `failed` row of its own.
    let dead = env
        .sqs
        .config()
        .to_builder()
        .endpoint_url("http://127.0.0.1:9")
        .build();
    let dead = OrderQueue::new(
        aws_sdk_sqs::Client::from_conf(dead),
        env.queue.url.clone(),
        Duration::from_secs(1),
    );
    let broken = env.entry_router_on(Queues::one(dead), |c| login.on(c));
    let (status, body) = call(
        &broken,
        request(
            "POST",
            &format!("/activities/{}/orders", a.id),
            Some(("carol", "")),
            Some(r#"{"quantity":1}"#),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let carol = order::latest_for_user(&env.pool, a.id, "carol")
        .await?
        .unwrap();
    assert_eq!(
        (carol.status.as_str(), carol.failure_reason),
        ("failed", Some(FailureReason::SendFailed))
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_entry_role_may_write_no_more_than_its_path() -> anyhow::Result<()> {
    let env = new_env().await;
    let a = env.open_activity(10, 2).await?;
    let paid = reserve(&env, a.id, "alice", 1).await.attempt.request_id;
    let paid = consume(&env, a.id, "alice", paid, 1).await?;
    testkit::pay(&env, paid, env.config.payment_timeout)
        .await?
        .map_err(anyhow::Error::msg)?;
    let rid = reserve(&env, a.id, "bob", 1).await.attempt.request_id;
    consume(&env, a.id, "bob", rid, 1).await?;
    let entry = pool_as(&env, "seckill_entry").await;

    refused(&entry, "update activities set title = 'mine'").await;
    refused(
        &entry,
        "update activities set total_stock = total_stock + 100",
    )
    .await;
    refused(&entry, "update activities set last_fence_token = 1 << 40").await;
    // Units go back only through a cancel of a confirmed order (cancel_confirmed_order).
    refused(
        &entry,
        "update activities set remaining_stock = remaining_stock + 100",
    )
    .await;
    refused(
        &entry,
        "insert into activities (title, total_stock, remaining_stock, per_order_limit, \
             start_at, end_at) values ('x', 1, 1, 1, now(), now() + interval '1 hour')",
    )
    .await;
    refused(&entry, "update orders set quantity = 5").await;
    refused(&entry, "update orders set user_id = 'mallory'").await;
    refused(&entry, "select * from activity_stats").await;
    // Row-level security: no order but a `failed` claim; no order row changed but through
    // the database functions of a cancel and of a provider's payment (a paid order is not the
    // entry's to change, nor a confirmed one its to mark paid).
    refused(
        &entry,
        "insert into orders (request_id, activity_id, user_id, quantity, status) \
         select gen_random_uuid(), id, 'mallory', 1, 'confirmed' from activities",
    )
    .await;
    refused(
        &entry,
        "update orders set status = 'failed' where status = 'confirmed'",
    )
    .await;
    refused(
        &entry,
        "update orders set status = 'confirmed' where status = 'paid'",
    )
    .await;
    refused(
        &entry,
        "update orders set status = 'paid' where status = 'confirmed'",
    )
    .await;
    refused(&entry, "select * from orders for update").await;
    let unpaid: i64 = sqlx::query_scalar("select id from orders where user_id = 'bob'")
        .fetch_one(&env.pool)
        .await?;
    let marked: bool =
        sqlx::query_scalar("select pay_confirmed_order($1, 'local', 'no such payment', now())")
            .bind(unpaid)
            .fetch_one(&entry)
            .await?;
    assert!(!marked, "an order with no payment under way is not paid");
    assert_eq!(
        order::get(&env.pool, paid).await?.unwrap().status,
        OrderStatus::Paid
    );
    Ok(())
}

/// The consumer as `seckill_consumer`: orders confirmed (the batched insert and stock
/// decrement), and a refusal recorded as `failed` with its units given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_consumer_role_confirms_orders_and_records_refusals() -> anyhow::Result<()> {
    let env = new_env().await;
    let a = env.open_activity(3, 1).await?;
    let messages: Vec<OrderMessage> =
        futures::future::join_all(["alice", "bob", "carol"].map(|u| reserve(&env, a.id, u, 1)))
            .await;
    // The database has one unit fewer than Redis: the third order is refused there.
    set_db_stock_by_hand(&env, a.id, 2).await;
    for m in &messages {
        env.queue.send(m, m.attempt.activity_id).await?;
    }

    assert_eq!(consume_queue_as_consumer(&env).await.0, 3);

    let tally = order::tally(&env.pool, a.id).await?;
    assert_eq!((tally.confirmed, tally.failed), (2, 1), "{tally:?}");

    // Two orders of one sale that both fit go through the batch path, which reads their
    // ledger entries in one HMGET: a user without it would fall back one by one, silently.
    let b = env.open_activity(2, 1).await?;
    for user in ["dave", "erin"] {
        let m = reserve(&env, b.id, user, 1).await;
        env.queue.send(&m, b.id).await?;
    }
    assert_eq!(consume_queue_as_consumer(&env).await, (2, 2));
    assert_eq!(db_remaining(&env, a.id).await, 0);
    let consumer = pool_as(&env, "seckill_consumer").await;
    refused(&consumer, "update orders set status = 'paid'").await;
    refused(&consumer, "update activities set total_stock = 1000").await;
    refused(
        &consumer,
        "insert into activities (title, total_stock, remaining_stock, per_order_limit, \
             start_at, end_at) values ('x', 1, 1, 1, now(), now() + interval '1 hour')",
    )
    .await;
    refused(
        &consumer,
        "insert into activity_stats (activity_id, participants, sold, \
             db_remaining, pending_qty, drift) values (1, 0, 0, 0, 0, 0)",
    )
    .await;
    Ok(())
}
