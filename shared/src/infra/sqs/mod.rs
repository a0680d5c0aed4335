//! The SQS client and the order queues (the orders, and the draw entries on a queue of their
//! own), with bounded sends; a container's concurrent sends may share `SendMessageBatch` calls
//! (`coalesce`).

mod coalesce;

pub use coalesce::Coalescer;

use crate::infra::config::Config;
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

#[derive(Clone, Debug, thiserror::Error)]
pub enum QueueError {
    #[error("sending to the order queue timed out after {0:?}")]
    Timeout(Duration),
    #[error("sending to the order queue failed: {0}")]
    Send(String),
    #[error("reading the order queue's attributes failed: {0}")]
    Attributes(String),
}

/// The entry function's two queues: the orders (first-come reservations) and the draw entries,
/// each with a line of coalesced sends of its own; the same queue when no entry queue is set
/// (`Config::entry_queue`).
#[derive(Clone, Debug)]
pub struct Queues {
    pub orders: OrderQueue,
    pub entries: OrderQueue,
}

impl Queues {
    /// The queues `config` names, on one client.
    pub fn new(client: Client, config: &Config) -> Self {
        let orders = OrderQueue::new(client, config.order_queue_url.clone(), config.sqs_timeout);
        Self::around(orders, config.entry_queue_url.as_deref())
    }

    /// `orders`, and the entries on `entry_url` when it names another queue (a sibling of
    /// `orders`: same client and timeout, its own line of coalesced sends).
    pub fn around(orders: OrderQueue, entry_url: Option<&str>) -> Self {
        match entry_url {
            Some(url) if url != orders.url => Self {
                entries: orders.sibling(url.to_string()),
                orders,
            },
            _ => Self::one(orders),
        }
    }

    /// Orders and entries on one queue (one line of coalesced sends).
    pub fn one(queue: OrderQueue) -> Self {
        Self {
            entries: queue.clone(),
            orders: queue,
        }
    }
}

/// An order queue (the orders, or the draw entries: both carry order messages), with a
/// bounded send.
#[derive(Clone, Debug)]
pub struct OrderQueue {
    pub client: Client,
    pub url: String,
    pub timeout: Duration,
    /// The line of this queue's coalesced sends, shared by its clones.
    pub coalesced: Coalescer,
}

impl OrderQueue {
    pub fn new(client: Client, url: impl Into<String>, timeout: Duration) -> Self {
        Self {
            client,
            url: url.into(),
            timeout,
            coalesced: Coalescer::default(),
        }
    }

    /// Another queue on this one's client and timeout, with a line of coalesced sends of its
    /// own of as many slots as this one's.
    pub fn sibling(&self, url: impl Into<String>) -> Self {
        Self::new(self.client.clone(), url, self.timeout).with_send_slots(self.coalesced.slots())
    }

    /// This queue with its coalesced sends on a line of their own of `slots` batches on
    /// their way at most.
    pub fn with_send_slots(mut self, slots: usize) -> Self {
        self.coalesced = Coalescer::with_slots(slots);
        self
    }

    /// Sends one message as JSON in the next `SendMessageBatch` of this container's
    /// coalesced sends ([`Coalescer`]), and answers as [`OrderQueue::send`] would: an error
    /// or a timeout means it may or may not have been enqueued.
    pub async fn send_coalesced(
        &self,
        message: &impl Serialize,
        scope: impl Display,
    ) -> Result<(), QueueError> {
        let body = serde_json::to_string(message).expect("queue messages serialize");
        self.coalesced.send(self, body, scope.to_string()).await
    }

    /// The messages the queue holds: visible, in flight (received and not yet deleted) and
    /// delayed, as `GetQueueAttributes` counts them (SQS's counts are approximate and may lag
    /// a few seconds behind a send).
    pub async fn backlog(&self) -> Result<u64, QueueError> {
        use aws_sdk_sqs::types::QueueAttributeName as Name;
        let names = [
            Name::ApproximateNumberOfMessages,
            Name::ApproximateNumberOfMessagesNotVisible,
            Name::ApproximateNumberOfMessagesDelayed,
        ];
        let read = self
            .client
            .get_queue_attributes()
            .queue_url(&self.url)
            .set_attribute_names(Some(names.to_vec()))
            .send();
        let attrs = match tokio::time::timeout(self.timeout, read).await {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => {
                return Err(QueueError::Attributes(
                    aws_sdk_sqs::error::DisplayErrorContext(&e).to_string(),
                ))
            }
            Err(_) => return Err(QueueError::Timeout(self.timeout)),
        };
        Ok(names
            .iter()
            .filter_map(|n| attrs.attributes()?.get(n)?.parse::<u64>().ok())
            .sum())
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
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let bodies: Vec<String> = messages
            .iter()
            .map(|m| serde_json::to_string(m).expect("queue messages serialize"))
            .collect();
        let bodies: Vec<&str> = bodies.iter().map(String::as_str).collect();
        let stored = self.send_bodies(&bodies).await?;
        // Stored, but the caller never hears so: a send that times out after storing.
        if crate::infra::pause::fail("queue.send.lost_reply", scope) {
            return Err(QueueError::Timeout(self.timeout));
        }
        Ok(stored)
    }

    /// One `SendMessageBatch` of up to ten JSON bodies, bounded by the queue's timeout: the
    /// indexes (into `bodies`) the queue confirmed stored.
    async fn send_bodies(&self, bodies: &[&str]) -> Result<Vec<usize>, QueueError> {
        use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
        if bodies.is_empty() {
            return Ok(Vec::new());
        }
        let mut entries = Vec::with_capacity(bodies.len());
        for (i, body) in bodies.iter().enumerate() {
            let entry = SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(*body)
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
            Ok(Ok(out)) => Ok(out
                .successful()
                .iter()
                .filter_map(|ok| ok.id().parse::<usize>().ok())
                .filter(|i| *i < bodies.len())
                .collect()),
            Ok(Err(e)) => Err(QueueError::Send(
                aws_sdk_sqs::error::DisplayErrorContext(&e).to_string(),
            )),
            Err(_) => Err(QueueError::Timeout(self.timeout)),
        }
    }
}
