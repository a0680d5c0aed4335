//! The library every seckill function uses, in floors: each one imports only from the floors
//! below it.
//!
//! # Layout
//!
//! - [`infra`]: config, secrets, the database pool, SQS, metrics, tracing, pause points.
//! - [`domain`]: sales and their settings, orders, a purchase and its refusals, with their
//!   database statements.
//! - [`store`]: the Redis store: the connection, the keys, every Lua script and its typed
//!   wrapper.
//! - [`protocol`]: the steps that keep Redis and the database right together: a purchase
//!   across buckets, the give-back arbiter, cancel, pay, the draw, a fenced load, the lock.
//! - [`http`]: the error answer, the request extractors and the caller's identity.
//! - [`context`]: the config and clients a function's state is built from.
//!
//! docs/invariants.md tells the protocol step by step; each module links its section.

pub mod context;
pub mod domain;
pub mod http;
pub mod infra;
pub mod protocol;
pub mod store;

pub use context::Context;
pub use domain::refusal::Refusal;
pub use http::error::ApiError;
pub use infra::config::Config;
