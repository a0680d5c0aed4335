//! The order consumer against the real services: PostgreSQL, Redis (standalone and cluster)
//! and the SQS emulator.
//!
//! Reservations are made with `testkit::purchase`, exactly as the entry function makes them, so
//! the ledger the consumer checks is real. Batches are built from the `events/` fixture, or
//! really travel through an emulator queue (receive, `handle_batch`, delete what was acked:
//! what the Lambda event source mapping does).

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use futures::StreamExt;
use order_consumer::{Consumer, Outcome, Processed};
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::order;
use seckill_shared::domain::order::reason;
use seckill_shared::domain::purchase::{Attempt, MessageKind, OrderMessage};
use seckill_shared::infra::sqs::OrderQueue;
use seckill_shared::protocol::giveback;
use seckill_shared::store::purchase;
use seckill_shared::store::purchase::Reservation;
use sqlx::{Connection, PgConnection, PgPool};
use std::collections::HashSet;
use std::time::{Duration, Instant};
use testkit::on_both_redis;
use testkit::RedisKind;
use testkit::TestEnv;
use uuid::Uuid;

use testkit::{db_remaining, is_participant, order_rows, reserve, set_db_stock, snapshot};

const FIXTURE: &str = include_str!("../../events/order-consumer-batch.json");

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn fixture() -> SqsEvent {
    serde_json::from_str(FIXTURE).expect("the fixture is an SQS event")
}

/// An SQS record shaped like the fixture's, with a fresh message id and the given body.
fn record(body: &str) -> SqsMessage {
    let mut r = fixture().records.remove(0);
    r.message_id = Some(Uuid::new_v4().to_string());
    r.body = Some(body.to_string());
    r
}

fn record_of(m: &OrderMessage) -> SqsMessage {
    record(&serde_json::to_string(m).unwrap())
}

fn event(records: Vec<SqsMessage>) -> SqsEvent {
    let mut e = fixture();
    e.records = records;
    e
}

fn event_of(messages: &[OrderMessage]) -> SqsEvent {
    event(messages.iter().map(record_of).collect())
}

fn failed_ids(resp: &SqsBatchResponse) -> HashSet<String> {
    resp.batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect()
}

fn no_compensation(outcome: Outcome) -> Processed {
    Processed {
        outcome,
        compensated: false,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    id: i64,
    request_id: Uuid,
    user_id: String,
    quantity: i64,
    status: String,
    reason: Option<String>,
}

async fn rows(env: &TestEnv, activity_id: i64) -> Vec<Row> {
    order_rows(env, activity_id)
        .await
        .into_iter()
        .map(|o| Row {
            id: o.id,
            request_id: o.request_id,
            user_id: o.user_id,
            quantity: o.quantity,
            status: o.status,
            reason: o.failure_reason,
        })
        .collect()
}

fn count_status(rows: &[Row], status: &str) -> usize {
    rows.iter().filter(|r| r.status == status).count()
}

/// What the event source mapping does, once: receive up to 10 messages, hand them to the
/// consumer as one batch, delete the ones it acked. Returns (received, reported failed).
async fn deliver_once(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    consumer: &Consumer,
) -> (usize, usize) {
    let resp = sqs
        .receive_message()
        .queue_url(queue_url)
        .max_number_of_messages(10)
        .wait_time_seconds(1)
        .send()
        .await
        .expect("receive");
    let messages = resp.messages.unwrap_or_default();
    if messages.is_empty() {
        return (0, 0);
    }
    let records: Vec<SqsMessage> = messages
        .iter()
        .map(|m| {
            let mut r = record(m.body().unwrap_or_default());
            r.message_id = m.message_id().map(str::to_string);
            r.receipt_handle = m.receipt_handle().map(str::to_string);
            r
        })
        .collect();
    let failed = failed_ids(&consumer.handle_batch(event(records)).await);
    for m in &messages {
        if !failed.contains(m.message_id().unwrap_or_default()) {
            sqs.delete_message()
                .queue_url(queue_url)
                .receipt_handle(m.receipt_handle().unwrap_or_default())
                .send()
                .await
                .expect("delete");
        }
    }
    (messages.len(), failed.len())
}

/// Delivers until `expected` messages were acked or the deadline passes.
async fn drain(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    consumer: &Consumer,
    expected: usize,
    deadline: Duration,
) -> usize {
    let start = Instant::now();
    let mut acked = 0;
    while acked < expected && start.elapsed() < deadline {
        let (received, failed) = deliver_once(sqs, queue_url, consumer).await;
        acked += received - failed;
    }
    acked
}

async fn queue_is_empty(sqs: &aws_sdk_sqs::Client, queue_url: &str) -> bool {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let attrs = sqs
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(A::ApproximateNumberOfMessages)
        .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .unwrap();
    let a = attrs.attributes().unwrap();
    a.get(&A::ApproximateNumberOfMessages).map(String::as_str) == Some("0")
        && a.get(&A::ApproximateNumberOfMessagesNotVisible)
            .map(String::as_str)
            == Some("0")
}

async fn open_sale(env: &TestEnv, stock: i64, limit: i64) -> Activity {
    env.open_sale(stock, limit).await.expect("sale created")
}

// ---------------------------------------------------------------------------------------------
// Happy path
// ---------------------------------------------------------------------------------------------

#[test]
fn the_fixture_event_carries_valid_order_messages() {
    for r in fixture().records {
        order_consumer::parse(r.body.as_deref()).expect("fixture body parses");
    }
}

async fn batch_of_reservations_becomes_confirmed_orders(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = open_sale(&env, 100, 2).await;
    let mut messages = Vec::new();
    for i in 0..10 {
        messages.push(reserve(&env, a.id, &format!("user-{i}"), 1 + i % 2).await);
    }
    let before = snapshot(&env, a.id).await;
    assert_eq!(before.pending_count(), 10);

    let resp = env.consumer().handle_batch(event_of(&messages)).await;

    assert!(resp.batch_item_failures.is_empty());
    let rows = rows(&env, a.id).await;
    assert_eq!(count_status(&rows, "confirmed"), 10);
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
on_both_redis!(batch_of_reservations_becomes_confirmed_orders);

async fn orders_sent_through_the_real_queue_commit_and_leave_it_empty(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = open_sale(&env, 10, 1).await;
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
    assert_eq!(count_status(&rows(&env, a.id).await, "confirmed"), 5);
    assert_eq!(db_remaining(&env, a.id).await, 5);
    let snap = snapshot(&env, a.id).await;
    assert!(snap.ledger.is_empty());
    assert_eq!(snap.stock, Some(5));
    assert!(queue_is_empty(&env.sqs, &env.queue.url).await);
    Ok(())
}
on_both_redis!(orders_sent_through_the_real_queue_commit_and_leave_it_empty);

// ---------------------------------------------------------------------------------------------
// Idempotency: a message delivered N times yields one order
// ---------------------------------------------------------------------------------------------

async fn message_delivered_three_times_creates_one_order_and_no_compensation(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = open_sale(&env, 10, 1).await;
    let m = reserve(&env, a.id, "alice", 1).await;
    let c = env.consumer();

    let first = c.handle_message(&m).await?;
    let after_first = snapshot(&env, a.id).await;
    let second = c.handle_message(&m).await?;
    let third = c.handle_batch(event_of(std::slice::from_ref(&m))).await;

    assert_eq!(first, no_compensation(Outcome::Committed));
    assert_eq!(second, no_compensation(Outcome::Duplicate));
    assert!(third.batch_item_failures.is_empty());
    let rows = rows(&env, a.id).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].status, "confirmed");
    assert_eq!(db_remaining(&env, a.id).await, 9);
    assert_eq!(snapshot(&env, a.id).await, after_first);
    assert_eq!(after_first.stock, Some(9));
    assert!(is_participant(&env, a.id, "alice").await);
    Ok(())
}
on_both_redis!(message_delivered_three_times_creates_one_order_and_no_compensation);

async fn message_delivered_twice_at_once_creates_one_order_and_no_compensation(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = open_sale(&env, 10, 1).await;
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
    assert_eq!(count_status(&rows, "confirmed"), 2);
    assert_eq!(db_remaining(&env, a.id).await, 8);
    let snap = snapshot(&env, a.id).await;
    assert_eq!(snap.stock, Some(8), "no unit handed back");
    assert_eq!(snap.participants, 2);
    assert!(snap.ledger.is_empty());
    Ok(())
}
on_both_redis!(message_delivered_twice_at_once_creates_one_order_and_no_compensation);

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
    let a = open_sale(&env, 10, 1).await;
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
    assert_eq!(rows[0].status, "confirmed");
    assert_eq!(db_remaining(&env, a.id).await, 9);
    let after = snapshot(&env, a.id).await;
    assert_eq!(after.stock, before.stock, "no compensation");
    assert_eq!(after.participants, 1);
    assert!(after.ledger.is_empty());
    Ok(())
}
on_both_redis!(redelivery_while_the_first_transaction_waits_creates_one_order);

/// An invocation with less time left than the consumer keeps before its deadline
/// (`STOP_BEFORE_DEADLINE`) starts nothing: every message is reported for redelivery, and the
/// redelivery commits each one once.
#[tokio::test]
async fn a_batch_out_of_time_starts_nothing_and_its_redelivery_commits_it() -> anyhow::Result<()> {
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let a = open_sale(&env, 10, 1).await;
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
    assert_eq!(count_status(&rows(&env, a.id).await, "confirmed"), 3);
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
        let a = open_sale(&env, 10, 1).await;
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

        let left = Duration::from_millis(1500);
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
        assert_eq!(count_status(&rows, "confirmed"), 3, "{rows:?}");
        assert_eq!(rows.len(), 3, "{rows:?}");
        assert_eq!(db_remaining(&env, a.id).await, 7);
        let after = snapshot(&env, a.id).await;
        assert_eq!(after.stock, before.stock, "no compensation");
        assert!(after.ledger.is_empty());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Poison and transient failures
// ---------------------------------------------------------------------------------------------

async fn poison_message_is_reported_alone_and_the_others_commit(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = open_sale(&env, 10, 1).await;
    let good: Vec<OrderMessage> =
        futures::future::join_all((0..3).map(|i| reserve(&env, a.id, ["ann", "ben", "cat"][i], 1)))
            .await;
    let mut zero = serde_json::to_value(&good[0])?;
    zero["quantity"] = 0.into();
    zero["requestId"] = Uuid::new_v4().to_string().into();
    let poison = [
        record("{not json"),
        record(&zero.to_string()),
        record(r#"{"requestId":"0f6a3e2b-8c1d-4b7e-a9f2-3d5c7e9b1a20"}"#),
    ];
    let mut no_id = record("also not json");
    no_id.message_id = None;
    let mut records: Vec<SqsMessage> = good.iter().map(record_of).collect();
    records.extend(poison.iter().cloned());
    records.push(no_id);

    let resp = env.consumer().handle_batch(event(records)).await;

    let expected: HashSet<String> = poison
        .iter()
        .map(|r| r.message_id.clone().unwrap())
        .collect();
    assert_eq!(failed_ids(&resp), expected);
    let rows = rows(&env, a.id).await;
    assert_eq!(rows.len(), 3);
    assert_eq!(count_status(&rows, "confirmed"), 3);
    assert!(snapshot(&env, a.id).await.ledger.is_empty());
    Ok(())
}
on_both_redis!(poison_message_is_reported_alone_and_the_others_commit);

async fn poison_message_on_the_real_queue_ends_in_the_dead_letter_queue(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let url = testkit::fresh_queue(&env.sqs, 1, 2).await?;
    let queue = OrderQueue::new(env.sqs.clone(), url.clone(), Duration::from_secs(10));
    let a = open_sale(&env, 10, 1).await;
    for user in ["ann", "ben"] {
        queue
            .send(&reserve(&env, a.id, user, 1).await, a.id)
            .await?;
    }
    env.sqs
        .send_message()
        .queue_url(&url)
        .message_body("{\"poison\": true")
        .send()
        .await?;
    let c = env.consumer();

    // Keep polling as the event source mapping would until the poison message has been
    // received maxReceiveCount times and moved aside.
    let start = Instant::now();
    let mut acked = 0;
    let mut dead = Vec::new();
    while start.elapsed() < Duration::from_secs(30) {
        acked += {
            let (received, failed) = deliver_once(&env.sqs, &url, &c).await;
            received - failed
        };
        let resp = env
            .sqs
            .receive_message()
            .queue_url(testkit::dlq_url(&url))
            .max_number_of_messages(10)
            .send()
            .await?;
        dead.extend(resp.messages.unwrap_or_default());
        if acked == 2 && !dead.is_empty() {
            break;
        }
    }

    assert_eq!(acked, 2);
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].body(), Some("{\"poison\": true"));
    assert_eq!(count_status(&rows(&env, a.id).await, "confirmed"), 2);
    assert!(queue_is_empty(&env.sqs, &url).await);
    Ok(())
}
on_both_redis!(poison_message_on_the_real_queue_ends_in_the_dead_letter_queue);

async fn unreachable_database_reports_every_message_and_loses_nothing(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = open_sale(&env, 10, 1).await;
    let messages = vec![
        reserve(&env, a.id, "ann", 1).await,
        reserve(&env, a.id, "ben", 1).await,
    ];
    let before = snapshot(&env, a.id).await;
    let dead_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy("postgres://postgres@127.0.0.1:1/x")?;
    let broken = env.consumer_with(|c| c.pool = dead_pool);
    let batch = event_of(&messages);

    let resp = broken.handle_batch(batch.clone()).await;

    let all: HashSet<String> = batch
        .records
        .iter()
        .map(|r| r.message_id.clone().unwrap())
        .collect();
    assert_eq!(failed_ids(&resp), all);
    assert_eq!(snapshot(&env, a.id).await, before, "Redis untouched");
    assert!(rows(&env, a.id).await.is_empty());

    // The database is back: the redelivered batch commits.
    let resp = env.consumer().handle_batch(batch).await;

    assert!(resp.batch_item_failures.is_empty());
    assert_eq!(count_status(&rows(&env, a.id).await, "confirmed"), 2);
    assert_eq!(db_remaining(&env, a.id).await, 8);
    let after = snapshot(&env, a.id).await;
    assert_eq!(after.stock, before.stock);
    assert!(after.ledger.is_empty());
    Ok(())
}
on_both_redis!(unreachable_database_reports_every_message_and_loses_nothing);

// ---------------------------------------------------------------------------------------------
// Business refusals: compensate first, then record, then ack
// ---------------------------------------------------------------------------------------------

async fn database_sold_out_compensates_redis_in_full_and_records_the_failure(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = open_sale(&env, 5, 1).await;
    let messages = vec![
        reserve(&env, a.id, "ann", 1).await,
        reserve(&env, a.id, "ben", 1).await,
        reserve(&env, a.id, "cat", 1).await,
    ];
    // Redis drifted: it believes in 5 units, the database has 1 left.
    set_db_stock(&env, a.id, 1).await;
    let c = env.consumer();

    let resp = c.handle_batch(event_of(&messages)).await;

    assert!(resp.batch_item_failures.is_empty());
    let rows = rows(&env, a.id).await;
    assert_eq!(count_status(&rows, "confirmed"), 1);
    let failed: Vec<&Row> = rows.iter().filter(|r| r.status == "failed").collect();
    assert_eq!(failed.len(), 2);
    assert!(failed
        .iter()
        .all(|r| r.reason.as_deref() == Some(reason::SOLD_OUT)));
    assert_eq!(db_remaining(&env, a.id).await, 0);
    let winner = &rows
        .iter()
        .find(|r| r.status == "confirmed")
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
            no_compensation(Outcome::Duplicate)
        );
    }
    Ok(())
}
on_both_redis!(database_sold_out_compensates_redis_in_full_and_records_the_failure);

async fn rows_len(env: &TestEnv, activity_id: i64) -> usize {
    rows(env, activity_id).await.len()
}

async fn user_who_already_holds_an_order_gets_the_stock_back_but_keeps_the_order(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = open_sale(&env, 10, 1).await;
    let c = env.consumer();
    let first = reserve(&env, a.id, "alice", 1).await;
    assert_eq!(c.handle_message(&first).await?.outcome, Outcome::Committed);
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
    assert_eq!(rows[1].status, "failed");
    assert_eq!(rows[1].reason.as_deref(), Some(reason::ALREADY_PURCHASED));
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
        no_compensation(Outcome::Duplicate)
    );
    assert_eq!(snapshot(&env, a.id).await, snap);
    Ok(())
}
on_both_redis!(user_who_already_holds_an_order_gets_the_stock_back_but_keeps_the_order);

async fn reservation_given_back_by_reconcile_is_never_committed_nor_given_back_again(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = open_sale(&env, 10, 1).await;
    let m = reserve(&env, a.id, "alice", 1).await;
    // Reconcile's give-back: the claim, then the units.
    let given = giveback::give_back(
        &env.pool,
        &env.redis,
        &m.attempt,
        reason::RESERVATION_EXPIRED,
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
    assert_eq!(rows[0].status, "failed");
    assert_eq!(rows[0].reason.as_deref(), Some(reason::RESERVATION_EXPIRED));
    assert_eq!(db_remaining(&env, a.id).await, 10);
    assert_eq!(snapshot(&env, a.id).await, before);
    assert_eq!(
        env.consumer().handle_message(&m).await?,
        no_compensation(Outcome::Duplicate)
    );
    Ok(())
}
on_both_redis!(reservation_given_back_by_reconcile_is_never_committed_nor_given_back_again);

// ---------------------------------------------------------------------------------------------
// End to end: a crowd through testkit::purchase, the queue and the consumer
// ---------------------------------------------------------------------------------------------

async fn crowd_of_500_attempts_sells_exactly_the_stock(kind: RedisKind) -> anyhow::Result<()> {
    const STOCK: i64 = 50;
    const USERS: usize = 200;
    const ATTEMPTS: usize = 500;
    let env = TestEnv::new(kind).await.unwrap();
    let a = open_sale(&env, STOCK, 1).await;
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

on_both_redis!(crowd_of_500_attempts_sells_exactly_the_stock);

// ---------------------------------------------------------------------------------------------
// The batch fast path gives the same results as the per-message path
// ---------------------------------------------------------------------------------------------

/// What a scenario leaves behind, without the random request ids: the rows as
/// (user, quantity, status, reason), DB remaining stock, Redis stock, participants, ledger size.
#[derive(Debug, PartialEq, Eq)]
struct Final {
    rows: Vec<(String, i64, String, Option<String>)>,
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
    let a = open_sale(&env, 100, 3).await;
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
        &env.pool,
        &env.redis,
        &gone.attempt,
        reason::RESERVATION_EXPIRED,
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
            .filter(|r| r.2 == "confirmed")
            .map(|r| r.1)
            .sum::<i64>()
    );
    Ok(())
}

/// Six reservations, but the database has only four units left.
async fn short_database(batch_writes: bool) -> (Final, order_consumer::BatchStats) {
    let env = TestEnv::new(RedisKind::Standalone).await.unwrap();
    let a = open_sale(&env, 10, 1).await;
    let mut messages = Vec::new();
    for i in 0..6 {
        messages.push(reserve(&env, a.id, &format!("s{i}"), 1).await);
    }
    set_db_stock(&env, a.id, 4).await;
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
        let mut rows: Vec<_> = f
            .rows
            .iter()
            .map(|r| (r.1, r.2.clone(), r.3.clone()))
            .collect();
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
    let a = open_sale(&env, 10, 1).await;
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
        "failed".into(),
        Some(reason::ALREADY_PURCHASED.into())
    )));
    assert_eq!(fast.db_remaining, 5);
    assert_eq!(fast.redis_stock, Some(5));
    assert_eq!(fast.pending, 0);
    Ok(())
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
        let a = open_sale(&env, ORDERS as i64, 1).await;
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
