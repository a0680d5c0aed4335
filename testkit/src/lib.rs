//! The test kit: what every test of seckill stands on, against the real local services.
//!
//! # Layout
//!
//! - [`env`](mod@env): a test's own services: a fresh database, Redis key prefix and queue
//!   ([`TestEnv`]), on a standalone Redis or the cluster ([`RedisKind`]).
//! - [`functions`]: each function's handle built from a [`TestEnv`], in one place
//!   (`env.entry_router()`, `env.consumer()`, `env.reconcile()`, `env.preheat()`,
//!   `env.admin_state()`, ...), and each function's Redis login.
//! - [`activities`]: [`new_activity`], a builder of the admin's `NewActivity`, and the env's
//!   ways of creating and loading a sale.
//! - [`http`]: requests as API Gateway delivers them, a router called in process, a purchase,
//!   a status, a payment through the provider.
//! - [`steps`]: the protocol's steps a test sets a state up with (a purchase, a reservation, an
//!   order committed, a payment), each the production function that reaches it.
//! - [`reads`]: what tests assert on (a snapshot, the stock, the rows, the lock's holder).
//! - [`faults`]: what a crash, a loss or time leaves, made by hand, and pools that break or
//!   count.
//! - [`localstripe`]: the Stripe provider pointed at the fake of Stripe's API, and the buyer's
//!   side of a PaymentIntent there.
//! - [`private_redis`]: a redis-server of the test's own, to pause, flush or restart.
//! - [`invariants`]: the one checker of a sale's books (conservation, no oversell, the users,
//!   one live order per user).
//!
//! It is not in the product: the functions do not depend on it, and it does not turn on the
//! `failpoints` feature of seckill-shared (the tests crate does, for itself), so a tool built
//! on it (the benchmark, the demo) compiles no pause point in.

pub mod activities;
pub mod env;
pub mod faults;
pub mod functions;
pub mod http;
pub mod invariants;
pub mod localstripe;
pub mod private_redis;
pub mod reads;
pub mod steps;

pub use activities::{load_without_db, new_activity, ActivityBuilder};
pub use env::{
    config, dlq_url, empty_database, entries_url, fresh_database, fresh_queue, RedisKind, TestEnv,
};
pub use faults::{
    after_grace, age_reservations, close_draw_window, counting_pool, dead_pool, dead_queue,
    end_activity_by_hand, lose_activity, lose_field, set_db_stock_by_hand, set_term,
};
pub use functions::redis_acl_users;
pub use http::{
    buy, call, call_with_headers, my_status, pay_through_provider, provider_event, request,
};
pub use private_redis::PrivateRedis;
pub use reads::{
    db_remaining, draw_entry_rows, field, is_participant, lock_hold, order_rows, orders_in_db,
    redis_stock, snapshot, LockHold,
};
pub use seckill_shared::infra::shape::local_redis_login;
pub use steps::{
    a_minute_from_now, commit_order, consume, consume_queue, consume_queue_of, pay, purchase,
    reserve, reserve_in_pool, restore_entrants, spawn_drawer,
};

/// What a test body run by [`on_every_redis!`] returns: like every test, a `Result` whose `Err`
/// fails it.
pub trait Outcome {
    fn check(self);
}

impl<E: std::fmt::Debug> Outcome for Result<(), E> {
    fn check(self) {
        if let Err(e) = self {
            panic!("test failed: {e:?}");
        }
    }
}

/// Runs each `async fn(RedisKind)` as three tests, `<name>::standalone`, `<name>::cluster` and
/// `<name>::valkey`, so every Redis-facing behaviour is proven on a single Redis server, on Redis
/// Cluster and on a single Valkey server (ElastiCache's default engine), in one test run.
#[macro_export]
macro_rules! on_every_redis {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn standalone() {
                $crate::Outcome::check(super::$name($crate::RedisKind::Standalone).await)
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn cluster() {
                $crate::Outcome::check(super::$name($crate::RedisKind::Cluster).await)
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn valkey() {
                $crate::Outcome::check(super::$name($crate::RedisKind::Valkey).await)
            }
        }
    )*};
}
