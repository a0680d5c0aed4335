//! The protocol's steps as a test sets a state up with them: each calls the production
//! function that reaches the state (a reservation, an order committed, a payment settled), so
//! it runs the statement, guards included, that production runs.

use crate::env::TestEnv;
use chrono::Utc;
use seckill_shared::domain::activity;
use seckill_shared::domain::draw::Entry;
use seckill_shared::domain::order;
use seckill_shared::domain::purchase::{Attempt, MessageKind, OrderMessage};
use seckill_shared::domain::refusal::Refusal;
use seckill_shared::infra::payments::{self, LocalProvider, PaymentRequest, Provider};
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol::draw::{self as drawing, DrawError, DrawRun};
use seckill_shared::protocol::pay::{self, Settled, Started};
use seckill_shared::protocol::purchase as protocol;
use seckill_shared::store::conn::{Redis, StoreError};
use seckill_shared::store::draw::{self, Restore, RestoreCursor};
use seckill_shared::store::ledger;
use seckill_shared::store::purchase::{self, Reservation};
use std::time::Duration;
use uuid::Uuid;

/// Buys `quantity` units of sale `activity_id` for `user` as the entry function does, with the
/// sale's bucket count learnt from Redis: the reservation, or the refusal. A draw sale's
/// answers (queued, draw due) are an error here: tests of a draw read
/// [`protocol::enter`].
pub async fn purchase(
    redis: &Redis,
    activity_id: i64,
    user: &str,
    quantity: i64,
    request_id: Uuid,
    deadline_ms: i64,
) -> Result<Result<Reservation, Refusal>, StoreError> {
    let mut attempt = Attempt {
        request_id,
        activity_id,
        user_id: user.to_string(),
        quantity,
        buckets: 1,
    };
    let not_here = |answer: &str| {
        StoreError::Redis(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "a draw sale's answer",
            format!("purchase.lua answered {answer}: tests of a draw read purchase::enter"),
        )))
    };
    match protocol::enter(
        redis,
        &seckill_shared::protocol::buckets::Hints::none(),
        &mut attempt,
        deadline_ms,
    )
    .await?
    {
        protocol::Outcome::Reserved(r) => Ok(Ok(r)),
        protocol::Outcome::Refused(refusal) => Ok(Err(refusal)),
        protocol::Outcome::Queued { .. } => Err(not_here("queued")),
        protocol::Outcome::DrawDue => Err(not_here("draw due")),
    }
}

/// Makes a reservation the way the entry function does (the purchase script must accept it)
/// and returns the order message it would send.
pub async fn reserve(env: &TestEnv, activity_id: i64, user: &str, quantity: i64) -> OrderMessage {
    let request_id = Uuid::new_v4();
    let decision = purchase(
        &env.redis,
        activity_id,
        user,
        quantity,
        request_id,
        purchase::far_deadline(),
    )
    .await
    .expect("redis answers");
    let Ok(Reservation {
        now_ms,
        epoch,
        buckets,
        ..
    }) = decision
    else {
        panic!("reservation for {user} refused: {decision:?}");
    };
    OrderMessage {
        attempt: Attempt {
            request_id,
            activity_id,
            user_id: user.to_string(),
            quantity,
            buckets,
        },
        reserved_at_ms: now_ms,
        load_epoch: Some(epoch),
        kind: MessageKind::Order,
    }
}

/// Puts `user` in a draw sale's pool the way the entry function does (the purchase script
/// must answer `queued`) and returns the attempt that entered it.
pub async fn reserve_in_pool(env: &TestEnv, activity_id: i64, user: &str) -> Attempt {
    let attempt = Attempt {
        request_id: Uuid::now_v7(),
        activity_id,
        user_id: user.to_string(),
        quantity: 1,
        buckets: 1,
    };
    let home = activity_id.into();
    let (decision, _) = purchase::run(&env.redis, home, &attempt, purchase::far_deadline(), &[])
        .await
        .expect("redis answers");
    assert!(
        matches!(decision, purchase::Answer::Queued { .. }),
        "{user}: {decision:?}"
    );
    attempt
}

/// `n` entrants (`<prefix>0..`, one unit each) put into a draw sale's pool in bulk, the way
/// the consumer puts a kept entry back (`lua/pool_restore.lua`, with its ticket), in calls of
/// 1,000: a crowd of tens of thousands in seconds. Only Redis holds them (no `draw_entries`
/// row: a loss of the sale's keys loses them). The window must still be open. Returns them.
pub async fn restore_entrants(
    env: &TestEnv,
    activity_id: i64,
    prefix: &str,
    n: usize,
) -> Vec<Entry> {
    let entries: Vec<Entry> = (0..n)
        .map(|i| Entry {
            request_id: Uuid::now_v7(),
            user_id: format!("{prefix}{i}"),
            quantity: 1,
        })
        .collect();
    for chunk in entries.chunks(1_000) {
        let put = draw::restore(
            &env.redis,
            activity_id,
            None,
            Restore::Entries,
            RestoreCursor::None,
            chunk,
        )
        .await
        .expect("redis answers");
        assert_eq!(
            put.map(|p| p.put),
            Some(chunk.len() as i64),
            "every entrant went in"
        );
    }
    entries
}

/// The consumer's order transaction for a reservation, on the consumer's own statements: the
/// order row, then the conditional stock decrement (no epoch check). Returns the order id.
/// The ledger entry is left alone (as if the consumer crashed before settling).
pub async fn commit_order(
    env: &TestEnv,
    activity_id: i64,
    user: &str,
    request_id: Uuid,
    quantity: i64,
) -> anyhow::Result<i64> {
    let attempt = Attempt {
        request_id,
        activity_id,
        user_id: user.to_string(),
        quantity,
        buckets: 1,
    };
    let mut tx = env.pool.begin().await?;
    let order_id = order::insert_confirmed(&mut tx, &attempt).await?;
    let taken = activity::take_stock(&mut tx, activity_id, quantity, None).await?;
    anyhow::ensure!(taken.is_some(), "DB sold out");
    tx.commit().await?;
    Ok(order_id)
}

/// The consumer's whole happy path: [`commit_order`], then the ledger entry dropped.
pub async fn consume(
    env: &TestEnv,
    activity_id: i64,
    user: &str,
    request_id: Uuid,
    quantity: i64,
) -> anyhow::Result<i64> {
    let order_id = commit_order(env, activity_id, user, request_id, quantity).await?;
    assert!(ledger::settle(&env.redis, activity_id, user, &request_id.to_string()).await?);
    Ok(order_id)
}

/// Every message on the test's queues (the orders', then the entries'), read through the
/// consumer as SQS delivers them. Answers how many were order messages (first-come
/// reservations): a draw sale's entries are kept in the database and not counted.
pub async fn consume_queue(env: &TestEnv) -> anyhow::Result<usize> {
    let mut n = 0;
    for url in env.queue_urls() {
        n += consume_queue_of(env, &url).await?;
    }
    Ok(n)
}

/// [`consume_queue`] of one of the test's queues, `url`.
pub async fn consume_queue_of(env: &TestEnv, url: &str) -> anyhow::Result<usize> {
    let consumer = env.consumer();
    let mut n = 0;
    for m in env.drain_messages_of(url, 10_000).await? {
        let message = order_consumer::parse(m.body())?;
        consumer.handle_message(&message).await?;
        n += usize::from(message.kind != MessageKind::Entry);
        // Handled: gone from the queue, as the event source deletes a batch that succeeded.
        if let Some(receipt) = m.receipt_handle() {
            env.sqs
                .delete_message()
                .queue_url(url)
                .receipt_handle(receipt)
                .send()
                .await?;
        }
    }
    Ok(n)
}

/// Pays order `order_id` as its owner and the provider would: starts its payment with the
/// local provider, then settles the provider's `payment_intent.succeeded` event for it (the
/// webhook's signature check is the HTTP layer's, tested there). The payment timeout is
/// `timeout`. Answers what the event came to, or why the payment could not start.
pub async fn pay(
    env: &TestEnv,
    order_id: i64,
    timeout: Duration,
) -> anyhow::Result<Result<Settled, String>> {
    // As the entry function pays: its `pay` route starts the payment, its webhook settles it.
    let (pool, _) = env.login(Function::Entry);
    let pool = &pool;
    let order = order::get(pool, order_id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no order {order_id}"))?;
    let payment = match pay::start(pool, &LocalProvider, &order, Utc::now(), timeout).await? {
        Started::Pending { payment, .. } | Started::Paid(payment) => payment,
        Started::NotPayable(why) => return Ok(Err(why)),
    };
    let request = PaymentRequest {
        order_id,
        amount_minor: payment.amount_minor,
        currency: payment.currency.clone(),
    };
    let event_id = format!("evt_test_{}", Uuid::new_v4().simple());
    let body = payments::succeeded_event(&event_id, &request, &payment.provider_payment_id);
    let event: payments::Event = serde_json::from_str(&body)?;
    let stack = &env.config.payments.stack;
    match pay::settle(pool, LocalProvider.name(), stack, &event, Utc::now()).await? {
        Settled::Mismatched(mismatch) => Ok(Err(mismatch.to_string())),
        settled => Ok(Ok(settled)),
    }
}

/// Reconcile's draw part for sale `activity_id`, spawned as the drawer runs in AWS: reconcile's
/// database role and Redis user, the test's entries queue, a minute's share and the configured wait
/// for queued entries.
pub fn spawn_drawer(
    env: &TestEnv,
    activity_id: i64,
) -> tokio::task::JoinHandle<Result<DrawRun, DrawError>> {
    let (db, redis) = env.login(Function::Reconcile);
    let (queue, wait) = (env.queues().entries, env.config.draw_entry_wait);
    tokio::spawn(async move {
        let until = crate::a_minute_from_now();
        drawing::drive(&redis, &db, &queue, activity_id, until, wait).await
    })
}

/// A minute from now: a deadline or share a step under test never reaches.
pub fn a_minute_from_now() -> std::time::Instant {
    std::time::Instant::now() + Duration::from_secs(60)
}
