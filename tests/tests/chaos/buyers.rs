//! The crowd: buyers clicking through the entry router, and the sends whose reply is lost after
//! the message was stored.

use crate::world::{lock, Attempt, Chaos};
use crate::{PER_ORDER_LIMIT, REQUEST_LIMIT};
use anyhow::Context as _;
use rand::seq::IndexedRandom;
use rand::RngExt;
use seckill_shared::infra::pause;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::call;
use testkit::request;

/// A crowd member: `budget` clicks at most, about `gap` apart, a third of them in bursts;
/// random user, sale and quantity.
pub async fn buyer(c: Arc<Chaos>, index: u64, budget: u64, gap: Duration) -> anyhow::Result<()> {
    let mut rng = c.rng(100 + index);
    let gap_ms = (gap.as_millis() as u64).max(1);
    for _ in 0..budget {
        // A third of the clicks come right after the previous one; the rest wait 0-3 gaps,
        // which (with the time a click takes) spreads the budget over the phase.
        if !rng.random_bool(0.35) && !c.nap(rng.random_range(0..=3 * gap_ms)).await {
            break;
        }
        if c.stopped() {
            break;
        }
        let activity_id = c.pick_activity(&mut rng);
        let user = c.users.choose(&mut rng).context("users")?.clone();
        let quantity = rng.random_range(1..=PER_ORDER_LIMIT);
        let attempt = c.purchase(activity_id, user, quantity).await;
        c.record(attempt);
    }
    Ok(())
}

impl Chaos {
    async fn purchase(&self, activity_id: i64, user: String, quantity: i64) -> Attempt {
        let path = format!("/activities/{activity_id}/orders");
        let body = format!(r#"{{"quantity":{quantity}}}"#);
        let req = request("POST", &path, Some((&user, "")), Some(&body));
        let (status, json) =
            match tokio::time::timeout(REQUEST_LIMIT, call(&self.router, req)).await {
                Ok((status, json)) => (status.as_u16(), json),
                Err(_) => {
                    self.violate(
                        "request_answered",
                        Some(activity_id),
                        format!("POST {path} by {user} had no answer within {REQUEST_LIMIT:?}"),
                    );
                    (0, serde_json::Value::Null)
                }
            };
        Attempt {
            activity_id,
            user,
            quantity,
            status,
            queued: status == 202 && json.get("status").and_then(|v| v.as_str()) == Some("queued"),
            request_id: json
                .get("requestId")
                .and_then(|v| v.as_str())
                .and_then(|s| s.parse().ok()),
            code: json
                .get("error")
                .and_then(|v| v.as_str())
                .map(str::to_string),
        }
    }

    fn record(&self, a: Attempt) {
        self.count(|r| {
            r.attempts += 1;
            match a.status {
                202 => r.accepted += 1,
                503 => r.unavailable += 1,
                400..=499 => {
                    let code = a.code.clone().unwrap_or_else(|| a.status.to_string());
                    *r.refused.entry(code).or_default() += 1;
                }
                other => *r.other_status.entry(other).or_default() += 1,
            }
        });
        lock(&self.attempts).push(a);
    }
}
/// Arms `queue.send.lost_reply` at random moments: the next 1-3 sends of a sale store their
/// message and then report a timeout.
pub async fn lost_replies(c: Arc<Chaos>) -> anyhow::Result<()> {
    let mut rng = c.rng(300);
    while c.nap(rng.random_range(200..1200)).await {
        let id = c.pick_activity(&mut rng);
        let n: u32 = rng.random_range(1..=3);
        let armed = pause::arm_failure("queue.send.lost_reply", id, n);
        // Held until it fired n times, or for at most 1.5 s.
        let hold = Instant::now() + Duration::from_millis(rng.random_range(300..1500));
        while armed.hits() < n && Instant::now() < hold && !c.stopped() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let hits = armed.hits();
        drop(armed);
        c.count(|r| {
            r.lost_replies_armed += u64::from(n);
            r.lost_replies += u64::from(hits);
        });
    }
    Ok(())
}
