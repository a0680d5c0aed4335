//! The scheduled jobs against the real services: preheat loads idempotently, reconcile repairs
//! every drift a crash can leave and breaks nothing while purchases run.
//!
//! Each scenario runs on standalone Redis and on the cluster (`<name>::standalone`,
//! `<name>::cluster`). Time-dependent steps pass a `now` in the future instead of sleeping.
//!
//! [`preheats`], reconcile's [`repairs`], reconcile within its run [`budget`], the payment
//! timeout's [`releases`], and reconcile [`under_load`].

mod budget;
mod preheats;
mod releases;
mod repairs;
mod under_load;

use chrono::{DateTime, Utc};
use seckill_shared::domain::activity;
use seckill_shared::domain::activity::Activity;
use std::time::Duration;
use testkit::RedisKind;
use testkit::TestEnv;

const GRACE: Duration = Duration::from_secs(5);
const PAYMENT_TIMEOUT: Duration = Duration::from_secs(3600);

/// How long after its deadline a run may end: no step begins past the deadline, but the one
/// begun before it ends (a statement, a script, a `SendMessageBatch`), and on a loaded machine
/// that takes up to a few hundred milliseconds. A run that did not keep its deadline (a release
/// that waits for a busy order, a drain that sends every winner) goes on for many budgets.
fn within_deadline(took: Duration, budget: Duration) -> bool {
    took <= budget + budget / 2
}

async fn env(kind: RedisKind) -> anyhow::Result<TestEnv> {
    let mut env = TestEnv::new(kind).await?;
    env.config.reconcile_grace = GRACE;
    env.config.payment_timeout = PAYMENT_TIMEOUT;
    Ok(env)
}

/// An activity in the database only (not preheated).
async fn insert_activity(
    env: &TestEnv,
    stock: i64,
    start_at: DateTime<Utc>,
    end_at: DateTime<Utc>,
) -> anyhow::Result<Activity> {
    Ok(activity::insert(
        &env.pool,
        &testkit::new_activity()
            .title("job test")
            .stock(stock)
            .limit(5)
            .window(start_at, end_at)
            .build()
            .settings()?,
    )
    .await?)
}
