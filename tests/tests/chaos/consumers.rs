//! The consumers, as the event source mapping runs them, with faults: a batch handled twice (in a
//! row or at once), a consumer dying mid-batch or before its deletes.

use crate::world::{Chaos, Delivery};
use crate::SQS_CALL_LIMIT;
use anyhow::Context as _;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use aws_sdk_sqs::types::Message;
use order_consumer::Consumer;
use rand::RngExt;
use std::sync::Arc;
use std::time::Duration;

/// What the event source mapping does, with faults: receive, handle, delete the acked.
pub async fn consumer(c: Arc<Chaos>, index: u64) -> anyhow::Result<()> {
    let consumer = c.consumer();
    let mut rng = c.rng(200 + index);
    // The orders' queue and the draw entries', in turn (each has its mapping in AWS).
    let urls = c.env.queue_urls();
    for turn in 0.. {
        if c.stopped() {
            break;
        }
        let url = &urls[turn % urls.len()];
        let messages = match c.receive(url).await {
            Ok(m) => m,
            Err(_) => {
                c.count(|r| r.sqs_errors += 1);
                c.nap(200).await;
                continue;
            }
        };
        if messages.is_empty() {
            continue;
        }
        let delivery = match rng.random_range(0..100) {
            0..60 => Delivery::Once,
            60..70 => Delivery::TwiceInARow,
            70..80 => Delivery::TwiceAtOnce,
            80..90 => Delivery::DiesMidBatch,
            _ => Delivery::NotDeleted,
        };
        let dies_after = Duration::from_millis(rng.random_range(0..40));
        c.deliver(&consumer, url, &messages, delivery, dies_after)
            .await;
    }
    Ok(())
}

impl Chaos {
    /// One receive of up to ten messages from queue `url`.
    pub async fn receive(&self, url: &str) -> anyhow::Result<Vec<Message>> {
        let receive = self
            .env
            .sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send();
        // The emulator can stall under load; a stalled call must not hold the seed forever.
        let resp = tokio::time::timeout(SQS_CALL_LIMIT, receive)
            .await
            .with_context(|| format!("receive from {url} timed out"))?
            .with_context(|| format!("receive from {url}"))?;
        Ok(resp.messages.unwrap_or_default())
    }

    pub async fn deliver(
        &self,
        consumer: &Consumer,
        url: &str,
        messages: &[Message],
        delivery: Delivery,
        dies_after: Duration,
    ) {
        let event = event_of(messages);
        let label = match delivery {
            Delivery::Once => "once",
            Delivery::TwiceInARow => "twice in a row",
            Delivery::TwiceAtOnce => "twice at once",
            Delivery::DiesMidBatch => "died mid-batch",
            Delivery::NotDeleted => "not deleted",
        };
        self.count(|r| *r.batches.entry(label).or_default() += 1);
        let responses = match delivery {
            Delivery::Once => vec![consumer.handle_batch(event).await],
            Delivery::TwiceInARow => {
                let first = consumer.handle_batch(event.clone()).await;
                vec![first, consumer.handle_batch(event).await]
            }
            Delivery::TwiceAtOnce => {
                let (a, b) = tokio::join!(
                    consumer.handle_batch(event.clone()),
                    consumer.handle_batch(event)
                );
                vec![a, b]
            }
            Delivery::DiesMidBatch => {
                let _ = tokio::time::timeout(dies_after, consumer.handle_batch(event)).await;
                return;
            }
            Delivery::NotDeleted => {
                consumer.handle_batch(event).await;
                return;
            }
        };
        self.delete_acked(url, messages, &responses).await;
    }

    /// Deletes every message some delivery acked (not in its `batchItemFailures`).
    async fn delete_acked(&self, url: &str, messages: &[Message], responses: &[SqsBatchResponse]) {
        for m in messages {
            let id = m.message_id().unwrap_or_default();
            let acked = responses.iter().any(|r| {
                !r.batch_item_failures
                    .iter()
                    .any(|f| f.item_identifier == id)
            });
            if !acked {
                self.count(|r| r.reported_failed += 1);
                continue;
            }
            let delete = self
                .env
                .sqs
                .delete_message()
                .queue_url(url)
                .receipt_handle(m.receipt_handle().unwrap_or_default())
                .send();
            let deleted = tokio::time::timeout(SQS_CALL_LIMIT, delete).await;
            // A failed delete is one more redelivery, which the consumer must absorb.
            self.count(|r| match deleted {
                Ok(Ok(_)) => r.acked += 1,
                _ => r.sqs_errors += 1,
            });
        }
    }
}
/// An SQS event as Lambda hands it to the consumer.
fn event_of(messages: &[Message]) -> SqsEvent {
    let mut event = SqsEvent::default();
    event.records = messages
        .iter()
        .map(|m| {
            let mut r = SqsMessage::default();
            r.message_id = m.message_id().map(str::to_string);
            r.receipt_handle = m.receipt_handle().map(str::to_string);
            r.body = m.body().map(str::to_string);
            r.event_source = Some("aws:sqs".into());
            r
        })
        .collect();
    event
}
