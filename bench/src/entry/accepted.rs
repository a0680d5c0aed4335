//! Accepted purchases through the entry's router, each with its SQS send, against a bare
//! SendMessage loop of the same size on the same emulator.

use super::fixture::{Bench, Measure, Sizes, BODY};
use crate::strategies::open_activity;
use crate::util::{self, Outcome};
use seckill_shared::domain::purchase::{Attempt, MessageKind, OrderMessage};
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;
use uuid::Uuid;

pub(crate) async fn accepted(
    b: &Bench,
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    sizes: &Sizes,
) -> anyhow::Result<(Measure, Measure)> {
    let n = sizes.sqs_sends;
    let c = sizes.sqs_concurrency;
    let activity_id = 3;
    testkit::load_without_db(
        &b.redis,
        &open_activity(activity_id, n as i64 + 10),
        Duration::from_secs(3600),
    )
    .await?;
    // Users no other section used for this activity: every request is accepted.
    let router = b.router.clone();
    let users = b.users.clone();
    let path = Arc::new(format!("/activities/{activity_id}/orders"));
    let run = util::run_tasks(c, n, move |i| {
        let (router, users, path) = (router.clone(), users.clone(), path.clone());
        async move {
            let req = testkit::request("POST", &path, Some((&users[i], "")), Some(BODY));
            match router.oneshot(req).await {
                Ok(resp) if resp.status().as_u16() == 202 => Outcome::Sold,
                Ok(resp) => {
                    let status = resp.status();
                    let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
                        .await
                        .unwrap_or_default();
                    Outcome::Error(format!("{status} {}", String::from_utf8_lossy(&body)))
                }
                Err(e) => Outcome::Error(e.to_string()),
            }
        }
    })
    .await;
    let accepted = Measure::from_run("entry in-process, accepted (+ SQS send)", &run, c, None);

    // The same number of sends, same concurrency, on a fresh queue of the same emulator.
    let bare_url = testkit::fresh_queue(sqs, 30, 5).await?;
    let body = Arc::new(serde_json::to_string(&OrderMessage {
        attempt: Attempt {
            request_id: Uuid::now_v7(),
            activity_id,
            user_id: b.users[0].clone(),
            quantity: 1,
            buckets: 1,
        },
        reserved_at_ms: chrono::Utc::now().timestamp_millis(),
        load_epoch: Some(1),
        kind: MessageKind::Order,
    })?);
    let (client, url) = (sqs.clone(), Arc::new(bare_url.clone()));
    let run = util::run_tasks(c, n, move |_| {
        let (client, url, body) = (client.clone(), url.clone(), body.clone());
        async move {
            match client
                .send_message()
                .queue_url(url.as_str())
                .message_body(body.as_str())
                .send()
                .await
            {
                Ok(_) => Outcome::Sold,
                Err(e) => Outcome::Error(aws_sdk_sqs::error::DisplayErrorContext(&e).to_string()),
            }
        }
    })
    .await;
    let bare = Measure::from_run("bare SendMessage (same emulator)", &run, c, None);
    delete_queue(sqs, &bare_url).await;
    let _ = queue_url;
    Ok((accepted, bare))
}

pub(crate) async fn delete_queue(sqs: &aws_sdk_sqs::Client, url: &str) {
    for u in [url.to_string(), testkit::dlq_url(url)] {
        let _ = sqs.delete_queue().queue_url(u).send().await;
    }
}
