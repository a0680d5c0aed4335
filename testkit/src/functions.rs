//! Each function's handle, built from a [`TestEnv`] in this one place: the entry's and the
//! admin's routers, the consumer, preheat and reconcile, each as it runs in AWS, logged in as
//! its own database role and Redis ACL user (functions/shape.toml).
//!
//! A test that runs a function on something else (a dead pool, a Redis that times out, a
//! role's login) says what it changes with the `_with` form, which adjusts the function's
//! context before the handle is built: how each function connects stays here.

use crate::env::TestEnv;
use admin::AdminState;
use axum::Router;
use order_consumer::Consumer;
use preheat::Preheat;
use reconcile::Reconcile;
use seckill_entry::EntryState;
use seckill_shared::infra::shape::Function;
use seckill_shared::infra::sqs::Queues;
use seckill_shared::Context;

impl TestEnv {
    /// The context `function`'s handle is built on (its role, its Redis user), after `adjust`.
    fn function_context(&self, function: Function, adjust: impl FnOnce(&mut Context)) -> Context {
        let mut context = self.context(function);
        adjust(&mut context);
        context
    }

    /// The entry function's router on the test's queues.
    pub fn entry_router(&self) -> Router {
        self.entry_router_with(|_| {})
    }

    /// [`Self::entry_router`] on a context `adjust` changed.
    pub fn entry_router_with(&self, adjust: impl FnOnce(&mut Context)) -> Router {
        self.entry_router_on(self.queues(), adjust)
    }

    /// The entry function's router sending to `queues`, on a context `adjust` changed.
    pub fn entry_router_on(&self, queues: Queues, adjust: impl FnOnce(&mut Context)) -> Router {
        seckill_entry::router(EntryState::new(
            self.function_context(Function::Entry, adjust),
            queues,
        ))
    }

    /// The order consumer.
    pub fn consumer(&self) -> Consumer {
        self.consumer_with(|_| {})
    }

    /// [`Self::consumer`] on a context `adjust` changed.
    pub fn consumer_with(&self, adjust: impl FnOnce(&mut Context)) -> Consumer {
        Consumer::new(self.function_context(Function::Consumer, adjust))
    }

    /// The scheduled reconcile job.
    pub fn reconcile(&self) -> Reconcile {
        self.reconcile_with(|_| {})
    }

    /// [`Self::reconcile`] on a context `adjust` changed.
    pub fn reconcile_with(&self, adjust: impl FnOnce(&mut Context)) -> Reconcile {
        Reconcile::new(self.function_context(Function::Reconcile, adjust))
    }

    /// The scheduled preheat job.
    pub fn preheat(&self) -> Preheat {
        self.preheat_with(|_| {})
    }

    /// [`Self::preheat`] on a context `adjust` changed.
    pub fn preheat_with(&self, adjust: impl FnOnce(&mut Context)) -> Preheat {
        Preheat::new(self.function_context(Function::Preheat, adjust))
    }

    /// The admin function's state (what its handlers take, for a test that calls them
    /// directly).
    pub fn admin_state(&self) -> AdminState {
        self.admin_state_with(|_| {})
    }

    /// [`Self::admin_state`] on a context `adjust` changed.
    pub fn admin_state_with(&self, adjust: impl FnOnce(&mut Context)) -> AdminState {
        AdminState::new(self.function_context(Function::Admin, adjust))
    }

    /// The admin function's router.
    pub fn admin_router(&self) -> Router {
        self.admin_router_with(|_| {})
    }

    /// [`Self::admin_router`] on a context `adjust` changed.
    pub fn admin_router_with(&self, adjust: impl FnOnce(&mut Context)) -> Router {
        admin::router(self.admin_state_with(adjust))
    }
}

/// Each function's Redis ACL user as scripts/redis_acl.py declares it: binary name ->
/// `{"user", "access", "scripts"}`.
pub fn redis_acl_users() -> serde_json::Value {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::process::Command::new("python3")
        .arg(root.join("scripts/redis_acl.py"))
        .arg("json")
        .output()
        .expect("python3 runs scripts/redis_acl.py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("scripts/redis_acl.py json")
}
