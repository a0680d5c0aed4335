//! The SQS client and the order queue, with bounded sends.

use aws_sdk_sqs::Client;
use serde::Serialize;
use std::fmt::Display;
use std::time::Duration;

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

    /// Sends one message as JSON; an error or a timeout means it may or may not have been
    /// enqueued, which the consumer's idempotency and the ledger guard both tolerate. `scope`
    /// names the sale, for the injectable failure `queue.send.lost_reply`.
    pub async fn send(
        &self,
        message: &impl Serialize,
        scope: impl Display,
    ) -> Result<(), QueueError> {
        let body = serde_json::to_string(message).expect("queue messages serialize");
        let send = self
            .client
            .send_message()
            .queue_url(&self.url)
            .message_body(body)
            .send();
        match tokio::time::timeout(self.timeout, send).await {
            // Stored, but the caller never hears so: a send that times out after storing.
            Ok(Ok(_)) if crate::infra::pause::fail("queue.send.lost_reply", scope) => {
                Err(QueueError::Timeout(self.timeout))
            }
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(QueueError::Send(
                aws_sdk_sqs::error::DisplayErrorContext(&e).to_string(),
            )),
            Err(_) => Err(QueueError::Timeout(self.timeout)),
        }
    }

    /// Sends up to ten messages in one `SendMessageBatch`, answering the indexes (into
    /// `messages`) the queue confirmed stored. A message missing from the answer (refused, or
    /// the whole call failed or timed out) may or may not be on the queue: the caller sends it
    /// again later.
    pub async fn send_batch(
        &self,
        messages: &[impl Serialize],
        scope: impl Display,
    ) -> Result<Vec<usize>, QueueError> {
        use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let mut entries = Vec::with_capacity(messages.len());
        for (i, m) in messages.iter().enumerate() {
            let body = serde_json::to_string(m).expect("queue messages serialize");
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
            Ok(Ok(_)) if crate::infra::pause::fail("queue.send.lost_reply", scope) => {
                Err(QueueError::Timeout(self.timeout))
            }
            Ok(Ok(out)) => Ok(out
                .successful()
                .iter()
                .filter_map(|ok| ok.id().parse::<usize>().ok())
                .filter(|i| *i < messages.len())
                .collect()),
            Ok(Err(e)) => Err(QueueError::Send(
                aws_sdk_sqs::error::DisplayErrorContext(&e).to_string(),
            )),
            Err(_) => Err(QueueError::Timeout(self.timeout)),
        }
    }
}
