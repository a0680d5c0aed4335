//! The order consumer against the real services: PostgreSQL, Redis (standalone and cluster)
//! and the SQS emulator.
//!
//! Reservations are made with `testkit::purchase`, exactly as the entry function makes them, so
//! the ledger the consumer checks is real. Batches are built from the `events/` fixture, or
//! really travel through an emulator queue (receive, `handle_batch`, delete what was acked:
//! what the Lambda event source mapping does).
//!
//! Here the helpers every part shares; the [`happy_path`], [`redelivery`] (one order whatever the
//! deliveries), [`failures`] (poison and transient), business [`refusals`], and the [`batch_path`].

mod batch_path;
mod failures;
mod happy_path;
mod redelivery;
mod refusals;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use order_consumer::Consumer;
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::purchase::OrderMessage;
use seckill_shared::domain::status::{FailureReason, OrderStatus};
use seckill_shared::protocol::consume::{Decided, Decision};
use std::collections::HashSet;
use std::time::{Duration, Instant};
use testkit::order_rows;
use testkit::TestEnv;
use uuid::Uuid;

const FIXTURE: &str = include_str!("../../../events/order-consumer-batch.json");

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

fn no_compensation(decision: Decision) -> Decided {
    Decided {
        decision,
        compensated: false,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    id: i64,
    request_id: Uuid,
    user_id: String,
    quantity: i64,
    status: OrderStatus,
    reason: Option<FailureReason>,
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

fn count_status(rows: &[Row], status: OrderStatus) -> usize {
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

async fn open_activity(env: &TestEnv, stock: i64, limit: i64) -> Activity {
    env.open_activity(stock, limit).await.expect("sale created")
}
