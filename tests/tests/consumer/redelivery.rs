//! Idempotency: a message delivered N times (in a row, at once, while the first transaction waits,
//! after a batch ran out of time) yields one order and no compensation.

use crate::{count_status, event_of, no_compensation, open_activity, rows};
use seckill_shared::domain::status::OrderStatus;
use seckill_shared::protocol::consume::Decision;
use sqlx::{Connection, PgConnection, PgPool};
use std::time::{Duration, Instant};
use testkit::on_every_redis;
use testkit::RedisKind;
use testkit::TestEnv;
use testkit::{db_remaining, is_participant, reserve, snapshot};

on_every_redis!(
    message_delivered_three_times_creates_one_order_and_no_compensation,
    message_delivered_twice_at_once_creates_one_order_and_no_compensation,
    redelivery_while_the_first_transaction_waits_creates_one_order,
);

async fn message_delivered_three_times_creates_one_order_and_no_compensation(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = open_activity(&env, 10, 1).await;
    let m = reserve(&env, a.id, "alice", 1).await;
    let c = env.consumer();

    let first = c.handle_message(&m).await?;
    let after_first = snapshot(&env, a.id).await;
    let second = c.handle_message(&m).await?;
    let third = c.handle_batch(event_of(std::slice::from_ref(&m))).await;

    assert_eq!(first, no_compensation(Decision::Committed));
    assert_eq!(second, no_compensation(Decision::Duplicate));
    assert!(third.batch_item_failures.is_empty());
    let rows = rows(&env, a.id).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].status, OrderStatus::Confirmed);
    assert_eq!(db_remaining(&env, a.id).await, 9);
    assert_eq!(snapshot(&env, a.id).await, after_first);
    assert_eq!(after_first.stock, Some(9));
    assert!(is_participant(&env, a.id, "alice").await);
    Ok(())
}

async fn message_delivered_twice_at_once_creates_one_order_and_no_compensation(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = open_activity(&env, 10, 1).await;
    let m = reserve(&env, a.id, "alice", 1).await;
    let n = reserve(&env, a.id, "bob", 1).await;
    let c = env.consumer();

    // alice: two concurrent batches; bob: the same message twice inside one batch.
    let (r1, r2, r3) = tokio::join!(
        c.handle_batch(event_of(std::slice::from_ref(&m))),
        c.handle_batch(event_of(std::slice::from_ref(&m))),
        c.handle_batch(event_of(&[n.clone(), n.clone()])),
    );

    for r in [r1, r2, r3] {
        assert!(r.batch_item_failures.is_empty());
    }
    let rows = rows(&env, a.id).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(count_status(&rows, OrderStatus::Confirmed), 2);
    assert_eq!(db_remaining(&env, a.id).await, 8);
    let snap = snapshot(&env, a.id).await;
    assert_eq!(snap.stock, Some(8), "no unit handed back");
    assert_eq!(snap.participants, 2);
    assert!(snap.ledger.is_empty());
    Ok(())
}

/// Waits until at least `n` backends of this test's database wait on a lock.
async fn wait_for_lock_waiters(pool: &PgPool, n: i64) -> bool {
    for _ in 0..100 {
        let waiting: i64 = sqlx::query_scalar(
            "select count(*) from pg_stat_activity
             where datname = current_database() and wait_event_type = 'Lock'",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if waiting >= n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

async fn redelivery_while_the_first_transaction_waits_creates_one_order(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = open_activity(&env, 10, 1).await;
    let m = reserve(&env, a.id, "alice", 1).await;
    let before = snapshot(&env, a.id).await;
    let c = env.consumer();

    // Someone else holds the activity row: the first delivery's transaction stalls mid-way,
    // long enough for the visibility timeout to pass and SQS to deliver the message again.
    let mut blocker = PgConnection::connect(env.config.database_url.expose()).await?;
    sqlx::query("begin").execute(&mut blocker).await?;
    sqlx::query("select id from activities where id = $1 for update")
        .bind(a.id)
        .execute(&mut blocker)
        .await?;
    let first = tokio::spawn({
        let (c, m) = (c.clone(), m.clone());
        async move { c.handle_batch(event_of(&[m])).await }
    });
    assert!(
        wait_for_lock_waiters(&env.pool, 1).await,
        "first delivery is stalled"
    );
    let second = tokio::spawn({
        let (c, m) = (c.clone(), m.clone());
        async move { c.handle_batch(event_of(&[m])).await }
    });
    assert!(
        wait_for_lock_waiters(&env.pool, 2).await,
        "redelivery is stalled too"
    );
    sqlx::query("commit").execute(&mut blocker).await?;

    assert!(first.await?.batch_item_failures.is_empty());
    assert!(second.await?.batch_item_failures.is_empty());
    let rows = rows(&env, a.id).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].status, OrderStatus::Confirmed);
    assert_eq!(db_remaining(&env, a.id).await, 9);
    let after = snapshot(&env, a.id).await;
    assert_eq!(after.stock, before.stock, "no compensation");
    assert_eq!(after.participants, 1);
    assert!(after.ledger.is_empty());
    Ok(())
}

/// An invocation with less time left than the consumer keeps before its deadline
/// (`STOP_BEFORE_DEADLINE`) starts nothing: every message is reported for redelivery, and the
/// redelivery commits each one once.
#[tokio::test]
async fn a_batch_out_of_time_starts_nothing_and_its_redelivery_commits_it() -> anyhow::Result<()> {
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let a = open_activity(&env, 10, 1).await;
    let mut messages = Vec::new();
    for user in ["alice", "bob", "carol"] {
        messages.push(reserve(&env, a.id, user, 1).await);
    }
    let c = env.consumer();

    let deadline = tokio::time::Instant::now() + order_consumer::STOP_BEFORE_DEADLINE / 2;
    let resp = c.handle_batch_by(event_of(&messages), deadline).await;

    assert_eq!(resp.batch_item_failures.len(), 3, "{resp:?}");
    assert!(rows(&env, a.id).await.is_empty());
    assert_eq!(snapshot(&env, a.id).await.pending_count(), 3);
    let resp = c.handle_batch(event_of(&messages)).await;
    assert!(resp.batch_item_failures.is_empty(), "{resp:?}");
    assert_eq!(
        count_status(&rows(&env, a.id).await, OrderStatus::Confirmed),
        3
    );
    assert_eq!(db_remaining(&env, a.id).await, 7);
    Ok(())
}

/// A batch whose transaction waits on the sale's row (held by someone else) past the point
/// where the consumer stops before its invocation's deadline: the batch answers at that point,
/// with every message reported for redelivery, and nothing it began is committed; once the
/// row is free the redelivery commits each order once and gives nothing back. Both on the
/// batch fast path and message by message.
#[tokio::test]
async fn a_batch_stuck_at_its_stop_answers_in_time_and_its_redelivery_commits_it_once(
) -> anyhow::Result<()> {
    for batch_writes in [true, false] {
        let env = TestEnv::new(RedisKind::Standalone).await?;
        let a = open_activity(&env, 10, 1).await;
        let mut messages = Vec::new();
        for user in ["alice", "bob", "carol"] {
            messages.push(reserve(&env, a.id, user, 1).await);
        }
        let before = snapshot(&env, a.id).await;
        let c = env.consumer().with_batch_writes(batch_writes);
        let mut blocker = PgConnection::connect(env.config.database_url.expose()).await?;
        sqlx::query("begin").execute(&mut blocker).await?;
        sqlx::query("select id from activities where id = $1 for update")
            .bind(a.id)
            .execute(&mut blocker)
            .await?;

        // Less than the consumer role's statement_timeout (1 s): the batch's stop, not the
        // server's cancel of the waiting statement, is what answers.
        let left = Duration::from_millis(500);
        let deadline = tokio::time::Instant::now() + order_consumer::STOP_BEFORE_DEADLINE + left;
        let started = Instant::now();
        let resp = c.handle_batch_by(event_of(&messages), deadline).await;
        let took = started.elapsed();

        assert!(
            took >= left && took < left + Duration::from_secs(1),
            "batch_writes={batch_writes}: answered after {took:?}, its stop was {left:?} away"
        );
        assert_eq!(resp.batch_item_failures.len(), 3, "{resp:?}");
        sqlx::query("rollback").execute(&mut blocker).await?;
        let resp = c.handle_batch(event_of(&messages)).await;
        assert!(
            resp.batch_item_failures.is_empty(),
            "batch_writes={batch_writes}: {resp:?}"
        );
        let rows = rows(&env, a.id).await;
        assert_eq!(count_status(&rows, OrderStatus::Confirmed), 3, "{rows:?}");
        assert_eq!(rows.len(), 3, "{rows:?}");
        assert_eq!(db_remaining(&env, a.id).await, 7);
        let after = snapshot(&env, a.id).await;
        assert_eq!(after.stock, before.stock, "no compensation");
        assert!(after.ledger.is_empty());
    }
    Ok(())
}
