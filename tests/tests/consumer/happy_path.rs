//! The happy path: the fixture's messages, a batch of reservations becoming confirmed orders,
//! orders sent through the real queue, and a crowd of 500 attempts through the purchase, the queue
//! and the consumer selling exactly the stock.

use crate::{count_status, drain, event_of, fixture, open_activity, queue_is_empty, rows};
use seckill_shared::domain::order;
use seckill_shared::domain::purchase::{Attempt, MessageKind, OrderMessage};
use seckill_shared::domain::status::OrderStatus;
use seckill_shared::store::purchase;
use seckill_shared::store::purchase::Reservation;
use std::time::Duration;
use testkit::on_every_redis;
use testkit::RedisKind;
use testkit::TestEnv;
use testkit::{db_remaining, reserve, snapshot};
use uuid::Uuid;

on_every_redis!(
    batch_of_reservations_becomes_confirmed_orders,
    orders_sent_through_the_real_queue_commit_and_leave_it_empty,
    crowd_of_500_attempts_sells_exactly_the_stock,
);

#[test]
fn the_fixture_event_carries_valid_order_messages() {
    for r in fixture().records {
        order_consumer::parse(r.body.as_deref()).expect("fixture body parses");
    }
}

async fn batch_of_reservations_becomes_confirmed_orders(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = open_activity(&env, 100, 2).await;
    let mut messages = Vec::new();
    for i in 0..10 {
        messages.push(reserve(&env, a.id, &format!("user-{i}"), 1 + i % 2).await);
    }
    let before = snapshot(&env, a.id).await;
    assert_eq!(before.pending_count(), 10);

    let resp = env.consumer().handle_batch(event_of(&messages)).await;

    assert!(resp.batch_item_failures.is_empty());
    let rows = rows(&env, a.id).await;
    assert_eq!(count_status(&rows, OrderStatus::Confirmed), 10);
    let units: i64 = messages.iter().map(|m| m.attempt.quantity).sum();
    assert_eq!(rows.iter().map(|r| r.quantity).sum::<i64>(), units);
    for m in &messages {
        assert!(rows.iter().any(|r| r.request_id == m.attempt.request_id
            && r.user_id == m.attempt.user_id
            && r.quantity == m.attempt.quantity));
    }
    assert_eq!(db_remaining(&env, a.id).await, 100 - units);
    let after = snapshot(&env, a.id).await;
    assert!(
        after.ledger.is_empty(),
        "ledger drained: {:?}",
        after.ledger
    );
    assert_eq!(
        after.stock, before.stock,
        "the consumer never touches Redis stock"
    );
    assert_eq!(after.participants, 10);
    Ok(())
}

async fn orders_sent_through_the_real_queue_commit_and_leave_it_empty(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = open_activity(&env, 10, 1).await;
    for i in 0..5 {
        let m = reserve(&env, a.id, &format!("q-{i}"), 1).await;
        env.queue.send(&m, m.attempt.activity_id).await?;
    }

    let acked = drain(
        &env.sqs,
        &env.queue.url,
        &env.consumer(),
        5,
        Duration::from_secs(20),
    )
    .await;

    assert_eq!(acked, 5);
    assert_eq!(
        count_status(&rows(&env, a.id).await, OrderStatus::Confirmed),
        5
    );
    assert_eq!(db_remaining(&env, a.id).await, 5);
    let snap = snapshot(&env, a.id).await;
    assert!(snap.ledger.is_empty());
    assert_eq!(snap.stock, Some(5));
    assert!(queue_is_empty(&env.sqs, &env.queue.url).await);
    Ok(())
}

async fn crowd_of_500_attempts_sells_exactly_the_stock(kind: RedisKind) -> anyhow::Result<()> {
    const STOCK: i64 = 50;
    const USERS: usize = 200;
    const ATTEMPTS: usize = 500;
    let env = TestEnv::new(kind).await.unwrap();
    let a = open_activity(&env, STOCK, 1).await;
    // The crowd's own Redis handle, patient: this test is about the consumer, and a purchase
    // that times out on a busy machine may still have run (the entry's job to handle).
    let mut patient = env.config.clone();
    patient.redis_timeout = Duration::from_secs(20);
    let crowd_redis = seckill_shared::store::conn::Redis::connect(&patient)
        .await
        .unwrap();

    let attempts = (0..ATTEMPTS).map(|i| {
        let (redis, queue) = (crowd_redis.clone(), env.queue.clone());
        let user = format!("crowd-{}", i % USERS);
        tokio::spawn(async move {
            let request_id = Uuid::new_v4();
            let decision =
                testkit::purchase(&redis, a.id, &user, 1, request_id, purchase::far_deadline())
                    .await
                    .unwrap();
            if let Ok(Reservation { now_ms, epoch, .. }) = decision {
                let m = OrderMessage {
                    attempt: Attempt {
                        request_id,
                        activity_id: a.id,
                        user_id: user,
                        quantity: 1,
                        buckets: 1,
                    },
                    reserved_at_ms: now_ms,
                    load_epoch: Some(epoch),
                    kind: MessageKind::Order,
                };
                queue.send(&m, m.attempt.activity_id).await.unwrap();
                true
            } else {
                false
            }
        })
    });
    let accepted = futures::future::join_all(attempts)
        .await
        .into_iter()
        .filter(|r| *r.as_ref().unwrap())
        .count();
    assert_eq!(accepted as i64, STOCK);

    let acked = drain(
        &env.sqs,
        &env.queue.url,
        &env.consumer(),
        accepted,
        Duration::from_secs(40),
    )
    .await;

    assert_eq!(acked, accepted);
    let tally = order::tally(&env.pool, a.id).await.unwrap();
    let sold = tally.confirmed_units;
    assert_eq!(sold, STOCK);
    let twice = tally.users_with_two_live;
    assert_eq!(twice, 0, "no user twice");
    assert_eq!(db_remaining(&env, a.id).await, 0);
    let snap = snapshot(&env, a.id).await;
    assert_eq!(snap.stock, Some(0));
    assert!(snap.ledger.is_empty());
    assert_eq!(snap.participants, STOCK);
    // Conservation: redis stock + pending + confirmed = total.
    assert_eq!(snap.stock.unwrap() + snap.pending_quantity() + sold, STOCK);
    Ok(())
}
