//! The order message the entry function sends and the consumer reads, and the SQS client.

use aws_sdk_sqs::Client;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use uuid::Uuid;

/// One accepted purchase on its way to the database. The request id makes it idempotent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OrderMessage {
    pub request_id: Uuid,
    pub activity_id: i64,
    pub user_id: String,
    pub quantity: i32,
    /// Redis server time of the reservation, in ms since the epoch.
    pub reserved_at_ms: i64,
    /// The sale's load epoch the reservation was made under; the order commits only while the
    /// database's is the same (a reload since means Redis lost this reservation). Absent in
    /// messages from before epochs existed: no check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_epoch: Option<i64>,
    /// The sale's bucket count the reservation was made under (absent: 1): with the user it
    /// names the home bucket whose ledger holds the reservation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buckets: Option<u32>,
}

impl OrderMessage {
    /// The bucket whose ledger holds this reservation.
    pub fn home(&self) -> crate::keys::Bucket {
        crate::keys::Bucket::home(self.activity_id, self.buckets.unwrap_or(1), &self.user_id)
    }
}

/// Builds an SQS client from the standard AWS environment. `AWS_ENDPOINT_URL_SQS` points it
/// at the local emulator; nothing else differs between local and AWS.
pub async fn sqs_client() -> Client {
    let config = aws_config::load_from_env().await;
    Client::new(&config)
}

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("sending to the order queue timed out after {0:?}")]
    Timeout(Duration),
    #[error("sending to the order queue failed: {0}")]
    Send(String),
}

/// The order queue, with a bounded send.
#[derive(Clone, Debug)]
pub struct OrderQueue {
    pub client: Client,
    pub url: String,
    pub timeout: Duration,
}

impl OrderQueue {
    pub fn new(client: Client, url: impl Into<String>, timeout: Duration) -> Self {
        Self {
            client,
            url: url.into(),
            timeout,
        }
    }

    /// Sends one order message; an error or a timeout means it may or may not have been
    /// enqueued, which the consumer's idempotency and the ledger guard both tolerate.
    pub async fn send(&self, message: &OrderMessage) -> Result<(), QueueError> {
        let body = serde_json::to_string(message).expect("order messages serialize");
        let send = self
            .client
            .send_message()
            .queue_url(&self.url)
            .message_body(body)
            .send();
        match tokio::time::timeout(self.timeout, send).await {
            // Stored, but the caller never hears so: a send that times out after storing.
            Ok(Ok(_)) if crate::pause::fail("queue.send.lost_reply", message.activity_id) => {
                Err(QueueError::Timeout(self.timeout))
            }
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(QueueError::Send(
                aws_sdk_sqs::error::DisplayErrorContext(&e).to_string(),
            )),
            Err(_) => Err(QueueError::Timeout(self.timeout)),
        }
    }

    /// Sends up to ten order messages in one `SendMessageBatch`, answering the request ids the
    /// queue confirmed stored. A message missing from the answer (refused, or the whole call
    /// failed or timed out) may or may not be on the queue: the caller sends it again later.
    pub async fn send_batch(&self, messages: &[OrderMessage]) -> Result<Vec<Uuid>, QueueError> {
        use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let mut entries = Vec::with_capacity(messages.len());
        for (i, m) in messages.iter().enumerate() {
            let body = serde_json::to_string(m).expect("order messages serialize");
            let entry = SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(body)
                .build()
                .map_err(|e| QueueError::Send(e.to_string()))?;
            entries.push(entry);
        }
        let send = self
            .client
            .send_message_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries))
            .send();
        match tokio::time::timeout(self.timeout, send).await {
            Ok(Ok(_)) if crate::pause::fail("queue.send.lost_reply", messages[0].activity_id) => {
                Err(QueueError::Timeout(self.timeout))
            }
            Ok(Ok(out)) => Ok(out
                .successful()
                .iter()
                .filter_map(|ok| ok.id().parse::<usize>().ok())
                .filter_map(|i| messages.get(i).map(|m| m.request_id))
                .collect()),
            Ok(Err(e)) => Err(QueueError::Send(
                aws_sdk_sqs::error::DisplayErrorContext(&e).to_string(),
            )),
            Err(_) => Err(QueueError::Timeout(self.timeout)),
        }
    }
}
