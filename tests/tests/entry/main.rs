//! The purchase path through the `seckill-entry` router, against real Redis (standalone and
//! cluster), real PostgreSQL and the SQS emulator: concurrency, failure of each dependency,
//! the sold-out cache, and every kind of bad input.
//!
//! [`crowds`] (concurrency), [`failures`] of a dependency, the [`input`] and its answers, the
//! [`commands`] a purchase costs Redis, and the per-container [`guards`].

mod commands;
mod crowds;
mod failures;
mod guards;
mod input;

use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::purchase::OrderMessage;

fn orders_path(a: &Activity) -> String {
    format!("/activities/{}/orders", a.id)
}

fn messages(raw: &[aws_sdk_sqs::types::Message]) -> Vec<OrderMessage> {
    raw.iter()
        .map(|m| serde_json::from_str(m.body().unwrap()).unwrap())
        .collect()
}
