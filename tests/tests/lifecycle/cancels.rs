//! A cancel: the stock back to the database and Redis exactly once (concurrent cancels too), the
//! buyer free to buy again, a cancel right after the commit, a retried cancel after a crash, a
//! cancel after the sale left Redis, of a sale reloaded meanwhile, of an order whose field Redis
//! lost.

use crate::world;
use axum::http::StatusCode;
use seckill_shared::domain::order;
use seckill_shared::domain::status::OrderStatus;
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol;
use seckill_shared::protocol::cancel::CancelOutcome;
use seckill_shared::store;
use testkit::end_activity_by_hand;
use testkit::on_every_redis;
use testkit::RedisKind;
use uuid::Uuid;

on_every_redis!(
    cancel_gives_stock_back_to_db_and_redis_exactly_once,
    a_user_who_cancelled_can_buy_again,
    concurrent_cancels_of_one_order_give_stock_back_once,
    a_cancel_that_read_the_order_before_another_finished_it_gives_no_quota_back,
    cancel_right_after_commit_before_settle_still_cancels,
    a_retried_cancel_finishes_what_a_crash_left_half_done,
    cancel_after_the_sale_left_redis_changes_only_the_database,
    a_cancel_whose_sale_was_reloaded_meanwhile_changes_nothing,
    a_cancel_of_an_order_whose_field_redis_lost_completes,
);

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
    assert_eq!(w.status(id).await, OrderStatus::Cancelled);

    let (status, again) = w.cancel(id, "alice").await;
    assert_eq!(status, StatusCode::OK, "a double cancel is a no-op");
    assert_eq!(again["releasedQuantity"], 0);
    assert_eq!((w.db_stock().await, w.redis().await.stock), (10, Some(10)));
    assert_eq!(w.me("alice").await["status"], "cancelled");
    Ok(())
}

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

/// The payment-timeout path (reconcile) and the owner may cancel at the same moment, and a
/// client may retry: however many run at once, the units come back once.
async fn concurrent_cancels_of_one_order_give_stock_back_once(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await;
    let id = w.confirmed("alice", 4).await;
    let order = order::get(&w.env.pool, id).await.unwrap().unwrap();

    let outcomes = futures::future::join_all((0..20).map(|_| {
        let ((pool, redis), order) = (w.env.login(Function::Entry), order.clone());
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
    let (pool, redis) = w.env.login(Function::Entry);
    let (pool, redis) = (&pool, &redis);
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
        activity_id: w.activity.id,
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

async fn cancel_after_the_sale_left_redis_changes_only_the_database(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await;
    let id = w.confirmed("alice", 2).await;
    testkit::lose_activity(&w.env.redis, w.activity.id).await?;

    // While the sale runs, Redis lost it and a reload is due: the cancel waits for it.
    let (status, body) = w.cancel(id, "alice").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("busy"))
    );
    assert_eq!(w.db_stock().await, 8);

    // Ended: no loader loads it again, and the database alone changes.
    end_activity_by_hand(&w.env, w.activity.id).await;
    let (status, body) = w.cancel(id, "alice").await;

    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["releasedQuantity"], 2);
    assert_eq!(w.db_stock().await, 10);
    assert!(!w.redis().await.loaded, "nothing recreated in Redis");
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

    let paused = seckill_shared::infra::pause::arm("cancel.after_begin", w.activity.id);
    let ((pool, redis), o) = (w.env.login(Function::Entry), order.clone());
    let canceller = tokio::spawn(async move {
        protocol::cancel::cancel_order(&pool, &redis, &o, chrono::Utc::now()).await
    });
    tokio::time::timeout(std::time::Duration::from_secs(30), paused.reached()).await?;
    let mut conn = w.env.pool.acquire().await?;
    seckill_shared::domain::activity::bump_load_epoch(&mut conn, w.activity.id).await?;
    drop(conn);
    paused.resume();
    let outcome = canceller.await??;

    assert_eq!(outcome, CancelOutcome::Busy);
    assert_eq!(
        w.status(id).await,
        OrderStatus::Confirmed,
        "the order's update was rolled back"
    );
    assert_eq!(
        w.db_stock().await,
        stock,
        "no unit came back in the database"
    );
    Ok(())
}

/// Redis lost the buyer's field in `users` after her order was confirmed (a failover that
/// dropped the last writes) while the sale stayed loaded. Her cancel completes: the order is
/// cancelled, the units go back to the database and to Redis once, and she may buy again.
async fn a_cancel_of_an_order_whose_field_redis_lost_completes(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await;
    let id = w.confirmed("alice", 2).await;
    assert!(testkit::lose_field(&w.env.redis, w.activity.id, "alice").await?);

    let (status, body) = w.cancel(id, "alice").await;

    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["releasedQuantity"], 2);
    assert_eq!(w.status(id).await, OrderStatus::Cancelled);
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
