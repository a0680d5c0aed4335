//! `GET /admin/ops`: what the operator page charts beside each sale's stats.
//!
//! - **queue**: the order queue's `ApproximateNumberOfMessages` (visible) and
//!   `ApproximateNumberOfMessagesNotVisible` (in flight), and the dead-letter queue's
//!   visible messages when `ORDER_DLQ_URL` names it (`Config::order_dlq_url`). Each figure is `null` when the queue did
//!   not answer within [`QUEUE_TIMEOUT`] (the cause is logged): the page keeps charting the
//!   rest.
//! - **counters**: cumulative purchase answers counted by the process this function runs in
//!   ([`PurchaseCounts`], attached as a request extension by whoever fronts the entry router in
//!   the same process: the local dev server). `null` where nobody counts, as in Lambda, where
//!   the admin function runs apart from the entry; the page then derives accepted purchases
//!   per second from the sales' pending and confirmed quantities.
//! - **reconcile**: the latest rows reconcile wrote to `activity_stats` (one per sale, newest
//!   check first, at most [`RECONCILE_ROWS`]).
//! - **payments**: what needs a human (docs/invariants.md, "Pay", Refunds): refunds owed,
//!   under way, failed, made in the last [`REFUNDED_WITHIN`], and disputes, each counted up to
//!   [`COUNT_CAP`]; and the payments to look at ([`payment::flagged`]): refunds failed,
//!   disputes, refunds owed for longer than [`OWED_FOR`], newest change first, at most
//!   [`FLAGGED_ROWS`].
//!
//! Nothing here is on a purchase's path: it reads the queue, one small table, the partial
//! indexes of `payments`, and atomics.

use crate::state::AdminState;
use aws_sdk_sqs::types::QueueAttributeName;
use axum::extract::State;
use axum::{Extension, Json};
use chrono::{DateTime, SecondsFormat, Utc};
use seckill_shared::domain::activity;
use seckill_shared::domain::payment::{self, FlaggedPayment, PaymentCounts};
use seckill_shared::http::auth::Admin;
use seckill_shared::http::error::ErrorBody;
use seckill_shared::infra::sqs;
use seckill_shared::ApiError;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OnceCell;

/// The longest the queue may take to answer (less when `SQS_TIMEOUT_MS` is shorter).
pub const QUEUE_TIMEOUT: Duration = Duration::from_secs(2);

/// How many reconcile rows one answer carries.
pub const RECONCILE_ROWS: i64 = 50;

/// How many flagged payments one answer carries.
pub const FLAGGED_ROWS: i64 = 50;

/// Each payment count stops here: the page shows it with a "+" rather than read further.
pub const COUNT_CAP: i64 = 10_000;

/// A refund owed unchanged for longer than this is listed: reconcile (every minute, 10 refunds
/// a run, a claim's lease of 60 s) has left it for several runs. One owed for less is its
/// next run's.
pub const OWED_FOR: Duration = Duration::from_secs(5 * 60);

/// The window of the refunds-made count.
pub const REFUNDED_WITHIN: Duration = Duration::from_secs(24 * 60 * 60);

/// Cumulative answers to `POST /activities/{id}/orders` in this process, by outcome. Counted by
/// a layer in front of the entry router (one relaxed increment per purchase answer); read by
/// `ops`. Shared through an `Arc` as an axum request extension.
#[derive(Debug, Default)]
pub struct PurchaseCounts {
    accepted: AtomicU64,
    refused: AtomicU64,
    unavailable: AtomicU64,
    failed: AtomicU64,
}

impl PurchaseCounts {
    /// Counts one purchase answer by its status: 2xx accepted (`pending` or `queued`), 4xx
    /// refused (`sold_out`, `already_purchased`, `rate_limited`, ...), 503 unavailable, any
    /// other 5xx failed.
    pub fn count(&self, status: u16) {
        let counter = match status {
            200..=299 => &self.accepted,
            400..=499 => &self.refused,
            503 => &self.unavailable,
            _ => &self.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn snapshot(&self) -> Counters {
        let read = |n: &AtomicU64| n.load(Ordering::Relaxed);
        Counters {
            purchases_accepted: read(&self.accepted),
            purchases_refused: read(&self.refused),
            purchases_unavailable: read(&self.unavailable),
            purchases_failed: read(&self.failed),
        }
    }
}

/// Purchase answers since this process started (rates come from the change between reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Counters {
    /// 202s: reserved (`pending`) or in a draw's pool (`queued`).
    pub purchases_accepted: u64,
    /// 4xx answers: sold out, already purchased, outside the window, rate limited, bad input.
    pub purchases_refused: u64,
    /// 503 `unavailable`: nothing was reserved.
    pub purchases_unavailable: u64,
    /// Any other 5xx.
    pub purchases_failed: u64,
}

/// Messages in the order queue and its dead-letter queue; `null` when not known.
#[derive(Debug, Clone, Copy, Default, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueDepth {
    /// Waiting to be received (`ApproximateNumberOfMessages`).
    pub visible: Option<i64>,
    /// Received, not yet deleted (`ApproximateNumberOfMessagesNotVisible`).
    pub in_flight: Option<i64>,
    /// Waiting in the dead-letter queue; `null` also when `ORDER_DLQ_URL` is not set.
    pub dead_letter: Option<i64>,
}

/// One sale's latest reconcile check (`activity_stats`).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReconcileCheck {
    pub activity_id: i64,
    pub checked_at: DateTime<Utc>,
    /// `redis + pending + confirmed - total` as reconcile found it.
    pub drift: i64,
    /// Repairs that run made (give-backs, settled entries, a stock fix).
    pub repairs: i64,
}

/// The payments section: the counts, and the payments a human has to look at.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PaymentWatch {
    pub counts: PaymentCounts,
    /// Refunds failed, disputed payments, and refunds owed for longer than `owedForSecs`;
    /// newest change first, a bounded number of them. Empty when nothing needs a human.
    pub flagged: Vec<FlaggedPayment>,
    /// Each count stops at this many.
    #[schema(example = 10000)]
    pub count_cap: i64,
    /// How long a refund is owed before it is listed.
    #[schema(example = 300)]
    pub owed_for_secs: u64,
    /// The window of `counts.refundedRecently`.
    #[schema(example = 86400)]
    pub refunded_within_secs: u64,
}

/// 200 body of `GET /admin/ops`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Ops {
    /// This function's clock: RFC 3339, UTC, milliseconds.
    #[schema(example = "2026-12-01T12:00:00.123Z")]
    pub now: String,
    pub queue: QueueDepth,
    /// `null` where this process does not see the purchases (the admin Lambda).
    pub counters: Option<Counters>,
    pub reconcile: Vec<ReconcileCheck>,
    pub payments: PaymentWatch,
}

#[utoipa::path(
    get,
    path = "/admin/ops",
    tag = "admin",
    operation_id = "ops",
    summary = "Queue depth, this process's purchase counters, the latest reconcile checks, and the refunds and disputes that need a human, for the operator page",
    responses(
        (status = 200, description = "The figures; a queue figure is null when the queue did not answer", body = Ops),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The token lacks the `seckill:admin` scope", body = ErrorBody),
        (status = 503, description = "The database is out of reach", body = ErrorBody),
        (status = 500, description = "Unexpected; logged", body = ErrorBody),
    )
)]
pub(crate) async fn ops(
    Admin(_): Admin,
    State(state): State<AdminState>,
    counts: Option<Extension<Arc<PurchaseCounts>>>,
) -> Result<Json<Ops>, ApiError> {
    let now = Utc::now();
    let bound = state.config.sqs_timeout.min(QUEUE_TIMEOUT);
    let config = &state.config;
    let (queue, reconcile, payments) = tokio::join!(
        queue_depth(
            &config.order_queue_url,
            config.order_dlq_url.as_deref(),
            bound
        ),
        activity::latest_checks(&state.pool, RECONCILE_ROWS),
        payment_watch(&state.pool, now),
    );
    Ok(Json(Ops {
        now: now.to_rfc3339_opts(SecondsFormat::Millis, true),
        queue,
        counters: counts.map(|Extension(c)| c.snapshot()),
        reconcile: reconcile?
            .into_iter()
            .map(|c| ReconcileCheck {
                activity_id: c.activity_id,
                checked_at: c.checked_at,
                drift: c.drift,
                repairs: c.repairs,
            })
            .collect(),
        payments: payments?,
    }))
}

/// The payments section as of `now`.
async fn payment_watch(pool: &sqlx::PgPool, now: DateTime<Utc>) -> Result<PaymentWatch, ApiError> {
    let ago = |d: Duration| now - chrono::Duration::from_std(d).expect("a constant in range");
    let (counts, flagged) = tokio::try_join!(
        payment::operator_counts(pool, ago(REFUNDED_WITHIN), COUNT_CAP),
        payment::flagged(pool, ago(OWED_FOR), FLAGGED_ROWS),
    )?;
    Ok(PaymentWatch {
        counts,
        flagged,
        count_cap: COUNT_CAP,
        owed_for_secs: OWED_FOR.as_secs(),
        refunded_within_secs: REFUNDED_WITHIN.as_secs(),
    })
}

/// The SQS client, built on first use (the admin's other routes never need it).
async fn sqs() -> &'static aws_sdk_sqs::Client {
    static CLIENT: OnceCell<aws_sdk_sqs::Client> = OnceCell::const_new();
    CLIENT.get_or_init(sqs::sqs_client).await
}

async fn queue_depth(order_queue_url: &str, dlq_url: Option<&str>, bound: Duration) -> QueueDepth {
    let client = sqs().await;
    let main = attributes(
        client,
        order_queue_url,
        &[
            QueueAttributeName::ApproximateNumberOfMessages,
            QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
        ],
        bound,
    );
    let dead = async {
        match dlq_url {
            Some(url) => {
                let names = [QueueAttributeName::ApproximateNumberOfMessages];
                attributes(client, url, &names, bound).await
            }
            None => Vec::new(),
        }
    };
    let (main, dead) = tokio::join!(main, dead);
    QueueDepth {
        visible: main.first().copied().flatten(),
        in_flight: main.get(1).copied().flatten(),
        dead_letter: dead.first().copied().flatten(),
    }
}

/// The named attributes of one queue as numbers, in the order asked; empty when the queue
/// did not answer in time.
async fn attributes(
    client: &aws_sdk_sqs::Client,
    url: &str,
    names: &[QueueAttributeName],
    bound: Duration,
) -> Vec<Option<i64>> {
    let request = client
        .get_queue_attributes()
        .queue_url(url)
        .set_attribute_names(Some(names.to_vec()))
        .send();
    match tokio::time::timeout(bound, request).await {
        Ok(Ok(answer)) => {
            let attrs = answer.attributes();
            names
                .iter()
                .map(|n| attrs.and_then(|a| a.get(n)).and_then(|v| v.parse().ok()))
                .collect()
        }
        Ok(Err(e)) => {
            // The cause stays in the log: it may name hosts.
            let e = aws_sdk_sqs::error::DisplayErrorContext(e);
            tracing::warn!(error = %e, "queue attributes unavailable");
            Vec::new()
        }
        Err(_) => {
            tracing::warn!(?bound, "queue attributes: no answer in time");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn purchase_answers_are_counted_by_their_status_class() {
        let counts = PurchaseCounts::default();
        for status in [202, 202, 409, 400, 429, 503, 500] {
            counts.count(status);
        }
        assert_eq!(
            counts.snapshot(),
            Counters {
                purchases_accepted: 2,
                purchases_refused: 3,
                purchases_unavailable: 1,
                purchases_failed: 1,
            }
        );
    }
}
