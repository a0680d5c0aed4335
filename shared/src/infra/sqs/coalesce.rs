//! Sends of one container gathered into `SendMessageBatch` calls, each caller still waiting
//! for its own message's answer.
//!
//! A crowd entering a draw sends one entry message a request; one `SendMessage` each caps the
//! container at a few thousand entries a second (each request holds a connection to the queue
//! for a round trip). Here a send joins a shared line: while fewer than [`MAX_IN_FLIGHT`]
//! batches are on their way (the line's slots) it goes at once (a lone request, as in a Lambda container serving
//! one invocation at a time, waits for nothing more than its own call); past that it waits for
//! the next batch of up to ten, which a drainer task sends as soon as a slot frees. Every caller
//! hears its own message's fate: stored, refused, or unknown (the call failed or timed out),
//! exactly as a single send would tell it.

use super::{OrderQueue, QueueError};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Batches on their way at once, per container.
pub const MAX_IN_FLIGHT: usize = 16;
/// Messages a `SendMessageBatch` takes at most (the SQS limit).
pub const BATCH: usize = 10;

/// One message waiting for its batch: its JSON body, the sale it belongs to (for the
/// injectable failure `queue.send.lost_reply`), and where its answer goes.
struct Waiting {
    body: String,
    scope: String,
    answer: oneshot::Sender<Result<(), QueueError>>,
}

#[derive(Default)]
struct Line {
    waiting: VecDeque<Waiting>,
    in_flight: usize,
    slots: usize,
    /// `SendMessageBatch` calls made and messages they carried, for tests and the bench.
    batches: u64,
    messages: u64,
}

/// The shared line of one queue's coalesced sends (cloned with its [`OrderQueue`]).
#[derive(Clone)]
pub struct Coalescer {
    line: Arc<Mutex<Line>>,
}

impl Default for Coalescer {
    fn default() -> Self {
        Self::with_slots(MAX_IN_FLIGHT)
    }
}

impl std::fmt::Debug for Coalescer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (batches, messages) = self.sent();
        f.debug_struct("Coalescer")
            .field("batches", &batches)
            .field("messages", &messages)
            .finish()
    }
}

impl Coalescer {
    /// A line with `slots` batches on their way at most (at least one).
    pub fn with_slots(slots: usize) -> Self {
        let line = Line {
            slots: slots.max(1),
            ..Line::default()
        };
        Self {
            line: Arc::new(Mutex::new(line)),
        }
    }

    /// The most batches on their way at once.
    pub fn slots(&self) -> usize {
        self.line
            .lock()
            .expect("the line's lock is never poisoned")
            .slots
    }

    /// Messages waiting for a slot now.
    pub fn waiting(&self) -> usize {
        let line = self.line.lock().expect("the line's lock is never poisoned");
        line.waiting.len()
    }

    /// `SendMessageBatch` calls made so far, and the messages they carried.
    pub fn sent(&self) -> (u64, u64) {
        let line = self.line.lock().expect("the line's lock is never poisoned");
        (line.batches, line.messages)
    }

    /// Sends `body` to `queue` in the next batch and waits for its answer. The batch's call
    /// is bounded by the queue's timeout; should the drainer be gone (its runtime shut down),
    /// the answer is a timeout: the message may or may not be on the queue.
    pub(super) async fn send(
        &self,
        queue: &OrderQueue,
        body: String,
        scope: String,
    ) -> Result<(), QueueError> {
        let (answer, heard) = oneshot::channel();
        let lead = {
            let mut line = self.line.lock().expect("the line's lock is never poisoned");
            line.waiting.push_back(Waiting {
                body,
                scope,
                answer,
            });
            let lead = line.in_flight < line.slots;
            line.in_flight += usize::from(lead);
            lead
        };
        if lead {
            let (line, queue) = (self.clone(), queue.clone());
            tokio::spawn(async move { line.drain(&queue).await });
        }
        heard
            .await
            .unwrap_or(Err(QueueError::Timeout(queue.timeout)))
    }

    /// Sends batches while messages wait, then gives its slot back.
    async fn drain(&self, queue: &OrderQueue) {
        loop {
            let batch: Vec<Waiting> = {
                let mut line = self.line.lock().expect("the line's lock is never poisoned");
                let n = line.waiting.len().min(BATCH);
                if n == 0 {
                    line.in_flight -= 1;
                    return;
                }
                line.batches += 1;
                line.messages += n as u64;
                line.waiting.drain(..n).collect()
            };
            // Between taking a batch and its call: other senders wait for a slot.
            crate::infra::pause::point("queue.coalesce.before_send", &batch[0].scope).await;
            let bodies: Vec<&str> = batch.iter().map(|w| w.body.as_str()).collect();
            let stored = queue.send_bodies(&bodies).await;
            for (i, w) in batch.into_iter().enumerate() {
                let result = match &stored {
                    Ok(ok) if ok.contains(&i) => {
                        // Stored, but the caller never hears so: a send that times out after
                        // storing.
                        if crate::infra::pause::fail("queue.send.lost_reply", &w.scope) {
                            Err(QueueError::Timeout(queue.timeout))
                        } else {
                            Ok(())
                        }
                    }
                    Ok(_) => Err(QueueError::Send(
                        "the queue did not store the message".into(),
                    )),
                    Err(e) => Err(e.clone()),
                };
                // A caller that stopped waiting (its request dropped) hears nothing.
                let _ = w.answer.send(result);
            }
        }
    }
}
