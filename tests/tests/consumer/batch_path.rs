//! The batch fast path gives the same results as the per-message path, falls back when the
//! database cannot cover the whole batch or a user would hold two orders, leaves a request
//! claimed meanwhile to its claim, and is measured against the per-message baseline. Its one
//! statement (`confirm_orders`) keeps no row of a group it refuses.

use crate::{event, event_of, open_activity, record, record_of, rows};
use aws_lambda_events::event::sqs::SqsMessage;
use futures::StreamExt;
use seckill_shared::domain::purchase::OrderMessage;
use seckill_shared::domain::status::FailureReason;
use seckill_shared::domain::status::OrderStatus;
use seckill_shared::domain::{activity, order};
use seckill_shared::infra::pause;
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol::giveback;
use std::time::Instant;
use testkit::RedisKind;
use testkit::TestEnv;
use testkit::{db_remaining, reserve, set_db_stock_by_hand, snapshot};
use uuid::Uuid;

/// What a scenario leaves behind, without the random request ids: the rows as
/// (user, quantity, status, reason), DB remaining stock, Redis stock, participants, ledger size.
#[derive(Debug, PartialEq, Eq)]
struct Final {
    rows: Vec<(String, i64, OrderStatus, Option<FailureReason>)>,
    db_remaining: i64,
    redis_stock: Option<i64>,
    participants: i64,
    pending: usize,
}

async fn final_state(env: &TestEnv, activity_id: i64) -> Final {
    let mut rows: Vec<_> = rows(env, activity_id)
        .await
        .into_iter()
        .map(|r| (r.user_id, r.quantity, r.status, r.reason))
        .collect();
    rows.sort();
    let snap = snapshot(env, activity_id).await;
    Final {
        rows,
        db_remaining: db_remaining(env, activity_id).await,
        redis_stock: snap.stock,
        participants: snap.participants,
        pending: snap.ledger.len(),
    }
}

/// A mixed batch: fresh reservations of several quantities, a redelivery of a committed
/// message, a reservation reconcile already gave back, and a poison message.
async fn mixed_batch(batch_writes: bool) -> (Final, order_consumer::BatchStats) {
    let env = TestEnv::new(RedisKind::Standalone).await.unwrap();
    let a = open_activity(&env, 100, 3).await;
    let c = env.consumer().with_batch_writes(batch_writes);
    let mut messages = Vec::new();
    for i in 0..10 {
        messages.push(reserve(&env, a.id, &format!("u{i:02}"), 1 + i % 3).await);
    }
    c.clone()
        .with_batch_writes(false)
        .handle_message(&messages[0])
        .await
        .unwrap();
    let gone = &messages[1];
    giveback::give_back(
        &env.login(Function::Reconcile).0,
        &env.login(Function::Reconcile).1,
        &gone.attempt,
        FailureReason::ReservationExpired,
    )
    .await
    .unwrap();
    let mut records: Vec<SqsMessage> = messages.iter().map(record_of).collect();
    records.push(record("{poison"));

    let (resp, stats) = c.handle_batch_with_stats(event(records)).await;

    assert_eq!(resp.batch_item_failures.len(), 1);
    (final_state(&env, a.id).await, stats)
}

#[tokio::test]
async fn batch_path_commits_a_mixed_batch_exactly_like_the_per_message_path() -> anyhow::Result<()>
{
    let ((fast, fast_stats), (slow, slow_stats)) =
        tokio::join!(mixed_batch(true), mixed_batch(false));

    assert_eq!(fast, slow);
    assert_eq!(fast_stats.batched, 8, "{fast_stats:?}");
    assert_eq!(slow_stats.batched, 0);
    for s in [fast_stats, slow_stats] {
        assert_eq!(
            (
                s.committed,
                s.duplicates,
                s.failed,
                s.malformed,
                s.compensations,
                s.retried
            ),
            (8, 2, 0, 1, 0, 0),
            "{s:?}"
        );
    }
    assert_eq!(fast.pending, 0);
    assert_eq!(
        fast.db_remaining,
        100 - fast
            .rows
            .iter()
            .filter(|r| r.2 == OrderStatus::Confirmed)
            .map(|r| r.1)
            .sum::<i64>()
    );
    Ok(())
}

/// Six reservations, but the database has only four units left.
async fn short_database(batch_writes: bool) -> (Final, order_consumer::BatchStats) {
    let env = TestEnv::new(RedisKind::Standalone).await.unwrap();
    let a = open_activity(&env, 10, 1).await;
    let mut messages = Vec::new();
    for i in 0..6 {
        messages.push(reserve(&env, a.id, &format!("s{i}"), 1).await);
    }
    set_db_stock_by_hand(&env, a.id, 4).await;
    let c = env.consumer().with_batch_writes(batch_writes);

    let (resp, stats) = c.handle_batch_with_stats(event_of(&messages)).await;

    assert!(resp.batch_item_failures.is_empty());
    (final_state(&env, a.id).await, stats)
}

#[tokio::test]
async fn batch_path_falls_back_when_the_database_cannot_cover_the_whole_batch() -> anyhow::Result<()>
{
    let ((fast, fast_stats), (slow, slow_stats)) =
        tokio::join!(short_database(true), short_database(false));

    // Which four users win is a race in both paths: compare everything but the names.
    let strip = |f: &Final| {
        let mut rows: Vec<_> = f.rows.iter().map(|r| (r.1, r.2, r.3)).collect();
        rows.sort();
        (
            rows,
            f.db_remaining,
            f.redis_stock,
            f.participants,
            f.pending,
        )
    };
    assert_eq!(strip(&fast), strip(&slow));
    assert_eq!(fast_stats.batched, 0);
    assert_eq!(
        (
            fast_stats.committed,
            fast_stats.failed,
            fast_stats.compensations
        ),
        (4, 2, 2)
    );
    assert_eq!(
        (
            slow_stats.committed,
            slow_stats.failed,
            slow_stats.compensations
        ),
        (4, 2, 2)
    );
    assert_eq!(fast.db_remaining, 0);
    assert_eq!(fast.redis_stock, Some(10 - 6 + 2));
    Ok(())
}

/// One user of the batch already holds an order the database knows and Redis forgot.
async fn second_order_in_batch(batch_writes: bool) -> (Final, order_consumer::BatchStats) {
    let env = TestEnv::new(RedisKind::Standalone).await.unwrap();
    let a = open_activity(&env, 10, 1).await;
    let c = env.consumer().with_batch_writes(batch_writes);
    let first = reserve(&env, a.id, "p0", 1).await;
    c.handle_message(&first).await.unwrap();
    let k = env.redis.keys(a.id);
    let _: i64 = env
        .redis
        .cmd(redis::cmd("HDEL").arg(&k.users).arg("p0"))
        .await
        .unwrap();
    let mut messages = vec![reserve(&env, a.id, "p0", 1).await];
    for i in 1..5 {
        messages.push(reserve(&env, a.id, &format!("p{i}"), 1).await);
    }

    let (resp, stats) = c.handle_batch_with_stats(event_of(&messages)).await;

    assert!(resp.batch_item_failures.is_empty());
    (final_state(&env, a.id).await, stats)
}

#[tokio::test]
async fn batch_path_falls_back_on_a_one_per_user_conflict() -> anyhow::Result<()> {
    let ((fast, fast_stats), (slow, slow_stats)) =
        tokio::join!(second_order_in_batch(true), second_order_in_batch(false));

    assert_eq!(fast, slow);
    assert_eq!(fast_stats.batched, 0);
    assert_eq!(slow_stats.batched, 0);
    assert_eq!(
        (
            fast_stats.committed,
            fast_stats.failed,
            fast_stats.compensations
        ),
        (4, 1, 1)
    );
    assert!(fast.rows.contains(&(
        "p0".into(),
        1,
        OrderStatus::Failed,
        Some(FailureReason::AlreadyPurchased)
    )));
    assert_eq!(fast.db_remaining, 5);
    assert_eq!(fast.redis_stock, Some(5));
    assert_eq!(fast.pending, 0);
    Ok(())
}

/// A group as `commit_group` hands it to the statement: one unit per user, fresh request ids.
fn group_of(users: &[&str]) -> (Vec<Uuid>, Vec<String>, Vec<i64>) {
    (
        users.iter().map(|_| Uuid::now_v7()).collect(),
        users.iter().map(|u| u.to_string()).collect(),
        vec![1; users.len()],
    )
}

/// The batch statement, as the consumer's own role, keeps none of a group whose units the sale
/// cannot take (too little stock, or a load epoch other than the messages'): the rows it
/// inserted roll back with it, and the caller can tell the refusal from any other error.
#[tokio::test]
async fn the_batch_statement_keeps_no_row_of_a_group_the_stock_cannot_take() -> anyhow::Result<()> {
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let a = open_activity(&env, 10, 1).await;
    set_db_stock_by_hand(&env, a.id, 2).await;
    let consumer = env.login(Function::Consumer).0;
    let epoch = activity::load_epoch(&env.pool, a.id).await?;
    let (ids, users, quantities) = group_of(&["k0", "k1", "k2"]);

    let short = order::confirm_batch(&consumer, a.id, epoch, &ids, &users, &quantities).await;
    let (two_ids, two_users, two_quantities) = (&ids[..2], &users[..2], &quantities[..2]);
    let moved = epoch.map(|e| e + 1);
    let other_epoch =
        order::confirm_batch(&consumer, a.id, moved, two_ids, two_users, two_quantities).await;

    for refused in [short, other_epoch] {
        let e = refused.expect_err("the group is refused");
        assert!(order::is_short_stock(&e), "{e:?}");
    }
    assert!(rows(&env, a.id).await.is_empty());
    assert_eq!(db_remaining(&env, a.id).await, 2);

    let mut taken =
        order::confirm_batch(&consumer, a.id, epoch, two_ids, two_users, two_quantities).await?;
    taken.sort();
    assert_eq!(taken, two_ids, "v7 ids, made in order");
    assert_eq!(db_remaining(&env, a.id).await, 0);
    Ok(())
}

/// A request claimed `failed` by a give-back between the batch's ledger read and its write
/// keeps its claim: the others of the group are committed through the batch path, and the
/// claimed one is applied one by one (its units went back with the claim, once).
#[tokio::test]
async fn a_request_claimed_while_its_group_is_read_keeps_its_claim() -> anyhow::Result<()> {
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let a = open_activity(&env, 10, 1).await;
    let mut messages = Vec::new();
    for i in 0..4 {
        messages.push(reserve(&env, a.id, &format!("g{i}"), 1).await);
    }
    let claimed = messages[2].clone();
    let paused = pause::arm("consumer.batch.before_write", a.id);
    let c = env.consumer();
    let event = event_of(&messages);
    let batch = tokio::spawn(async move { c.handle_batch_with_stats(event).await });
    paused.reached().await;

    let (pool, redis) = env.login(Function::Reconcile);
    let why = FailureReason::ReservationExpired;
    giveback::give_back(&pool, &redis, &claimed.attempt, why).await?;
    paused.resume();
    let (resp, stats) = batch.await?;

    assert!(resp.batch_item_failures.is_empty(), "{resp:?}");
    assert_eq!(
        (
            stats.batched,
            stats.committed,
            stats.duplicates,
            stats.compensations
        ),
        (3, 3, 1, 0),
        "{stats:?}"
    );
    let end = final_state(&env, a.id).await;
    assert!(end
        .rows
        .contains(&("g2".into(), 1, OrderStatus::Failed, Some(why))));
    assert_eq!(count_confirmed(&end), 3);
    assert_eq!(end.db_remaining, 10 - 3);
    assert_eq!(end.redis_stock, Some(10 - 3));
    assert_eq!(end.pending, 0);
    Ok(())
}

fn count_confirmed(f: &Final) -> usize {
    f.rows
        .iter()
        .filter(|r| r.2 == OrderStatus::Confirmed)
        .count()
}

/// Committed orders per second through `handle_batch`, batch path against one transaction per
/// order, same table, same concurrency. Prints figures, asserts only correctness.
/// Run: `cargo nextest run -p seckill-tests --test consumer --run-ignored only`.
#[tokio::test]
#[ignore = "a measurement, not a check; run on demand"]
async fn batch_path_throughput_against_per_message_baseline() -> anyhow::Result<()> {
    const ORDERS: usize = 4000;
    const BATCH: usize = 10;
    const CONCURRENT_BATCHES: usize = 8;
    let mut rates = Vec::new();
    for batch_writes in [false, true] {
        let env = TestEnv::new(RedisKind::Standalone).await?;
        let a = open_activity(&env, ORDERS as i64, 1).await;
        let messages: Vec<OrderMessage> = futures::stream::iter(0..ORDERS)
            .map(|i| {
                let env = &env;
                async move { reserve(env, a.id, &format!("b{i}"), 1).await }
            })
            .buffer_unordered(64)
            .collect()
            .await;
        let c = env.consumer().with_batch_writes(batch_writes);
        let start = Instant::now();
        let failures: usize = futures::stream::iter(messages.chunks(BATCH))
            .map(|chunk| {
                let c = &c;
                async move {
                    c.handle_batch(event_of(chunk))
                        .await
                        .batch_item_failures
                        .len()
                }
            })
            .buffer_unordered(CONCURRENT_BATCHES)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .sum();
        let rate = ORDERS as f64 / start.elapsed().as_secs_f64();
        assert_eq!(failures, 0);
        assert_eq!(db_remaining(&env, a.id).await, 0);
        println!("batch_writes={batch_writes}: {rate:.0} orders/s");
        rates.push(rate);
    }
    println!(
        "batch path / per-message baseline = {:.2}x",
        rates[1] / rates[0]
    );
    Ok(())
}
