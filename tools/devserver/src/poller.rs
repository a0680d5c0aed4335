//! The SQS event source mapping, played locally.
//!
//! Lambda's mapping long-polls the queue, hands a batch to the function as an `SqsEvent` and,
//! with `ReportBatchItemFailures`, deletes every message except those the function listed in
//! `batchItemFailures`; those become visible again after the visibility timeout and are
//! redelivered (then dead-lettered after `maxReceiveCount`). [`poll_once`] does exactly that,
//! so the consumer's partial-failure and idempotency paths run locally as they run in AWS.

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, Message, MessageSystemAttributeName};
use aws_sdk_sqs::Client;
use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

/// Bound on one SQS call beyond its long-poll wait.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the poller reads from.
#[derive(Clone, Debug)]
pub struct QueueSource {
    pub client: Client,
    pub url: String,
    /// The queue's ARN, as Lambda puts it in each record's `eventSourceARN`.
    pub arn: Option<String>,
    pub region: Option<String>,
    /// Long-poll wait per receive (whole seconds, as SQS counts them).
    pub wait: Duration,
}

impl QueueSource {
    /// Looks up the queue's ARN once; a queue that does not exist fails here, at start.
    pub async fn connect(client: Client, url: &str, wait: Duration) -> anyhow::Result<Self> {
        use aws_sdk_sqs::types::QueueAttributeName;
        let attrs = client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "queue {url} is not reachable: {}",
                    aws_sdk_sqs::error::DisplayErrorContext(&e)
                )
            })?;
        let arn = attrs
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::QueueArn))
            .cloned();
        let region = client.config().region().map(|r| r.to_string());
        Ok(Self {
            client,
            url: url.to_string(),
            arn,
            region,
            wait,
        })
    }
}

/// What one poll did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollOutcome {
    pub received: usize,
    pub deleted: usize,
    /// Left on the queue for redelivery (reported failures, or the whole batch on a crash).
    pub retried: usize,
}

/// Converts a received message into the record Lambda would deliver.
pub fn to_lambda_message(msg: &Message, source: &QueueSource) -> SqsMessage {
    let mut record = SqsMessage::default();
    record.message_id = msg.message_id.clone();
    record.receipt_handle = msg.receipt_handle.clone();
    record.body = msg.body.clone();
    record.md5_of_body = msg.md5_of_body.clone();
    record.md5_of_message_attributes = msg.md5_of_message_attributes.clone();
    record.attributes = msg
        .attributes()
        .map(|a| {
            a.iter()
                .map(|(k, v)| (k.as_str().to_string(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    record.event_source = Some("aws:sqs".into());
    record.event_source_arn = source.arn.clone();
    record.aws_region = source.region.clone();
    record
}

/// Receives up to 10 messages, hands them to `handler` as one event and deletes the ones it
/// did not report as failed. A handler that panics leaves the whole batch on the queue, as a
/// crashed invocation would.
pub async fn poll_once<F, Fut>(source: &QueueSource, handler: F) -> anyhow::Result<PollOutcome>
where
    F: FnOnce(SqsEvent) -> Fut,
    Fut: Future<Output = SqsBatchResponse> + Send + 'static,
{
    let messages = receive(source).await?;
    if messages.is_empty() {
        return Ok(PollOutcome::default());
    }
    let mut event = SqsEvent::default();
    event.records = messages
        .iter()
        .map(|m| to_lambda_message(m, source))
        .collect();

    let received = messages.len();
    let failed: HashSet<String> = match tokio::spawn(handler(event)).await {
        Ok(response) => response
            .batch_item_failures
            .into_iter()
            .map(|f| f.item_identifier)
            .collect(),
        Err(e) => {
            tracing::error!(error = %e, received, "consumer crashed; the batch stays on the queue");
            return Ok(PollOutcome {
                received,
                deleted: 0,
                retried: received,
            });
        }
    };
    let deleted = delete_handled(source, &messages, &failed).await?;
    Ok(PollOutcome {
        received,
        deleted,
        retried: received - deleted,
    })
}

/// One long-poll receive of up to 10 messages.
async fn receive(source: &QueueSource) -> anyhow::Result<Vec<Message>> {
    // The SDK has no deadline of its own: bound every call, so a hung queue endpoint makes a
    // poll fail (and back off) instead of holding the poller, and shutdown, forever.
    let deadline = source.wait + CALL_TIMEOUT;
    let receive = source
        .client
        .receive_message()
        .queue_url(&source.url)
        .max_number_of_messages(10)
        .wait_time_seconds(source.wait.as_secs().clamp(0, 20) as i32)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .send();
    let resp = tokio::time::timeout(deadline, receive)
        .await
        .map_err(|_| anyhow::anyhow!("receive from {} timed out after {deadline:?}", source.url))?
        .map_err(|e| {
            anyhow::anyhow!(
                "receive from {} failed: {}",
                source.url,
                aws_sdk_sqs::error::DisplayErrorContext(&e)
            )
        })?;
    Ok(resp.messages.unwrap_or_default())
}

/// Deletes the messages the handler did not report as failed; returns how many went.
async fn delete_handled(
    source: &QueueSource,
    messages: &[Message],
    failed: &HashSet<String>,
) -> anyhow::Result<usize> {
    let entries: Vec<DeleteMessageBatchRequestEntry> = messages
        .iter()
        .enumerate()
        .filter(|(_, m)| {
            m.message_id
                .as_deref()
                .is_none_or(|id| !failed.contains(id))
        })
        .filter_map(|(i, m)| {
            DeleteMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .set_receipt_handle(m.receipt_handle.clone())
                .build()
                .ok()
        })
        .collect();
    if entries.is_empty() {
        return Ok(0);
    }
    let delete = source
        .client
        .delete_message_batch()
        .queue_url(&source.url)
        .set_entries(Some(entries))
        .send();
    // A delete that times out is not lost work: the messages come back after the
    // visibility timeout and the consumer's idempotency absorbs the redelivery.
    let resp = tokio::time::timeout(CALL_TIMEOUT, delete)
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "delete from {} timed out after {CALL_TIMEOUT:?}",
                source.url
            )
        })?
        .map_err(|e| {
            anyhow::anyhow!(
                "delete from {} failed: {}",
                source.url,
                aws_sdk_sqs::error::DisplayErrorContext(&e)
            )
        })?;
    for f in resp.failed() {
        // Not fatal: the message comes back and the consumer's idempotency absorbs it.
        tracing::warn!(
            id = f.id(),
            code = f.code(),
            "delete failed; message will be redelivered"
        );
    }
    Ok(resp.successful().len())
}
