//! Business refusals: compensate first, then record, then ack (the database sold out, a user who
//! already holds an order, a reservation reconcile gave back).

use crate::{count_status, event_of, no_compensation, open_activity, rows, Row};
use seckill_shared::domain::status::{FailureReason, OrderStatus};
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol::consume::Decision;
use seckill_shared::protocol::giveback;
use testkit::on_every_redis;
use testkit::RedisKind;
use testkit::TestEnv;
use testkit::{db_remaining, is_participant, reserve, set_db_stock_by_hand, snapshot};

on_every_redis!(
    database_sold_out_compensates_redis_in_full_and_records_the_failure,
    user_who_already_holds_an_order_gets_the_stock_back_but_keeps_the_order,
    reservation_given_back_by_reconcile_is_never_committed_nor_given_back_again,
);

async fn database_sold_out_compensates_redis_in_full_and_records_the_failure(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = open_activity(&env, 5, 1).await;
    let messages = vec![
        reserve(&env, a.id, "ann", 1).await,
        reserve(&env, a.id, "ben", 1).await,
        reserve(&env, a.id, "cat", 1).await,
    ];
    // Redis drifted: it believes in 5 units, the database has 1 left.
    set_db_stock_by_hand(&env, a.id, 1).await;
    let c = env.consumer();

    let resp = c.handle_batch(event_of(&messages)).await;

    assert!(resp.batch_item_failures.is_empty());
    let rows = rows(&env, a.id).await;
    assert_eq!(count_status(&rows, OrderStatus::Confirmed), 1);
    let failed: Vec<&Row> = rows
        .iter()
        .filter(|r| r.status == OrderStatus::Failed)
        .collect();
    assert_eq!(failed.len(), 2);
    assert!(failed
        .iter()
        .all(|r| r.reason == Some(FailureReason::SoldOut)));
    assert_eq!(db_remaining(&env, a.id).await, 0);
    let winner = &rows
        .iter()
        .find(|r| r.status == OrderStatus::Confirmed)
        .unwrap()
        .user_id;
    let snap = snapshot(&env, a.id).await;
    assert_eq!(snap.stock, Some(5 - 3 + 2), "two units back in Redis");
    assert_eq!(snap.participants, 1);
    assert!(is_participant(&env, a.id, winner).await);
    for r in &failed {
        assert!(
            !is_participant(&env, a.id, &r.user_id).await,
            "user removed"
        );
    }
    assert!(snap.ledger.is_empty());

    // Redeliveries change nothing more.
    let again = c.handle_batch(event_of(&messages)).await;

    assert!(again.batch_item_failures.is_empty());
    assert_eq!(snapshot(&env, a.id).await, snap);
    assert_eq!(rows_len(&env, a.id).await, 3);
    for m in &messages {
        assert_eq!(
            c.handle_message(m).await?,
            no_compensation(Decision::Duplicate)
        );
    }
    Ok(())
}

async fn rows_len(env: &TestEnv, activity_id: i64) -> usize {
    rows(env, activity_id).await.len()
}

async fn user_who_already_holds_an_order_gets_the_stock_back_but_keeps_the_order(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = open_activity(&env, 10, 1).await;
    let c = env.consumer();
    let first = reserve(&env, a.id, "alice", 1).await;
    assert_eq!(
        c.handle_message(&first).await?.decision,
        Decision::Committed
    );
    let existing = rows(&env, a.id).await;
    // Redis lost its users field (failover without persistence): alice can reserve again.
    let k = env.redis.keys(a.id);
    let _: i64 = env
        .redis
        .cmd(redis::cmd("HDEL").arg(&k.users).arg("alice"))
        .await?;
    let second = reserve(&env, a.id, "alice", 1).await;
    assert_eq!(snapshot(&env, a.id).await.stock, Some(8));

    let resp = c
        .handle_batch(event_of(std::slice::from_ref(&second)))
        .await;

    assert!(resp.batch_item_failures.is_empty());
    let rows = rows(&env, a.id).await;
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0], existing[0], "the existing order is untouched");
    assert_eq!(rows[1].request_id, second.attempt.request_id);
    assert_eq!(rows[1].status, OrderStatus::Failed);
    assert_eq!(rows[1].reason, Some(FailureReason::AlreadyPurchased));
    assert_eq!(db_remaining(&env, a.id).await, 9);
    let snap = snapshot(&env, a.id).await;
    assert_eq!(snap.stock, Some(9), "the second unit is back");
    assert!(
        is_participant(&env, a.id, "alice").await,
        "she keeps her order"
    );
    assert!(snap.ledger.is_empty());
    assert_eq!(
        c.handle_message(&second).await?,
        no_compensation(Decision::Duplicate)
    );
    assert_eq!(snapshot(&env, a.id).await, snap);
    Ok(())
}

async fn reservation_given_back_by_reconcile_is_never_committed_nor_given_back_again(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = open_activity(&env, 10, 1).await;
    let m = reserve(&env, a.id, "alice", 1).await;
    // Reconcile's give-back: the claim, then the units.
    let given = giveback::give_back(
        &env.login(Function::Reconcile).0,
        &env.login(Function::Reconcile).1,
        &m.attempt,
        FailureReason::ReservationExpired,
    )
    .await?;
    assert!(
        matches!(given, giveback::GiveBack::GivenBack(Some(1))),
        "{given:?}"
    );
    let before = snapshot(&env, a.id).await;
    assert_eq!(before.stock, Some(10));

    let resp = env
        .consumer()
        .handle_batch(event_of(std::slice::from_ref(&m)))
        .await;

    assert!(resp.batch_item_failures.is_empty());
    let rows = rows(&env, a.id).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].status, OrderStatus::Failed);
    assert_eq!(rows[0].reason, Some(FailureReason::ReservationExpired));
    assert_eq!(db_remaining(&env, a.id).await, 10);
    assert_eq!(snapshot(&env, a.id).await, before);
    assert_eq!(
        env.consumer().handle_message(&m).await?,
        no_compensation(Decision::Duplicate)
    );
    Ok(())
}
