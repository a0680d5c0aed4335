//! Poison and transient failures: a poison message is reported alone (and ends in the dead-letter
//! queue), an unreachable database reports every message and loses nothing.

use crate::{
    count_status, deliver_once, event, event_of, failed_ids, open_activity, queue_is_empty, record,
    record_of, rows,
};
use aws_lambda_events::event::sqs::SqsMessage;
use seckill_shared::domain::purchase::OrderMessage;
use seckill_shared::domain::status::OrderStatus;
use seckill_shared::infra::sqs::OrderQueue;
use std::collections::HashSet;
use std::time::{Duration, Instant};
use testkit::on_every_redis;
use testkit::RedisKind;
use testkit::TestEnv;
use testkit::{db_remaining, reserve, snapshot};
use uuid::Uuid;

on_every_redis!(
    poison_message_is_reported_alone_and_the_others_commit,
    poison_message_on_the_real_queue_ends_in_the_dead_letter_queue,
    unreachable_database_reports_every_message_and_loses_nothing,
);

async fn poison_message_is_reported_alone_and_the_others_commit(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = open_activity(&env, 10, 1).await;
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
    assert_eq!(count_status(&rows, OrderStatus::Confirmed), 3);
    assert!(snapshot(&env, a.id).await.ledger.is_empty());
    Ok(())
}

async fn poison_message_on_the_real_queue_ends_in_the_dead_letter_queue(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let url = testkit::fresh_queue(&env.sqs, 1, 2).await?;
    let queue = OrderQueue::new(env.sqs.clone(), url.clone(), Duration::from_secs(10));
    let a = open_activity(&env, 10, 1).await;
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
    assert_eq!(
        count_status(&rows(&env, a.id).await, OrderStatus::Confirmed),
        2
    );
    assert!(queue_is_empty(&env.sqs, &url).await);
    Ok(())
}

async fn unreachable_database_reports_every_message_and_loses_nothing(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = open_activity(&env, 10, 1).await;
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
    assert_eq!(
        count_status(&rows(&env, a.id).await, OrderStatus::Confirmed),
        2
    );
    assert_eq!(db_remaining(&env, a.id).await, 8);
    let after = snapshot(&env, a.id).await;
    assert_eq!(after.stock, before.stock);
    assert!(after.ledger.is_empty());
    Ok(())
}
