//! The admin function and the fenced lock against real Redis (standalone and cluster) and
//! real PostgreSQL: a paused holder fenced out, a wiped token counter, concurrent admins,
//! owner-checked release, renewals, live stock changes during a sale, and bad input.
//!
//! [`fencing`] (the lock under the admin's writes), live [`stock_changes`], [`bad_requests`],
//! the [`prices`] buyers pressed buy at, and the operator page's [`payments`] to look at.

mod bad_requests;
mod fencing;
mod payments;
mod prices;
mod stock_changes;

use admin::AdminState;
use seckill_shared::domain::activity;
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::settings::ActivityPatch;
use serde_json::Value;
use std::time::Duration;
use testkit::RedisKind;
use testkit::TestEnv;

const ADMIN: (&str, &str) = ("ops", "seckill:admin");
const USER: (&str, &str) = ("alice", "");

async fn setup(kind: RedisKind, lock_ttl_ms: u64, lock_wait_ms: u64) -> (TestEnv, AdminState) {
    let env = TestEnv::new(kind).await.expect("test environment");
    let state = env.admin_state_with(|c| {
        c.config.lock_ttl = Duration::from_millis(lock_ttl_ms);
        c.config.lock_wait = Duration::from_millis(lock_wait_ms);
    });
    (env, state)
}

async fn db_activity(env: &TestEnv, id: i64) -> Activity {
    activity::get(&env.pool, id).await.unwrap().unwrap()
}

async fn lock_value(env: &TestEnv, id: i64) -> Option<String> {
    testkit::lock_hold(&env.redis, id)
        .await
        .unwrap()
        .map(|hold| hold.owner)
}

fn patch(v: Value) -> ActivityPatch {
    serde_json::from_value(v).unwrap()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
