//! Infrastructure: what a function needs from its surroundings, and nothing of the sale.
//!
//! - [`config`]: the typed settings (clap, each from its environment variable), parsed once;
//!   [`config::RedisTopology`]: where Redis is (one server or a cluster).
//! - [`shape`]: how each function is deployed (its Timeout, role and Redis user).
//! - [`secret`]: secrets that redact themselves (`Debug` never prints one).
//! - [`aws_secrets`]: credentials read from Secrets Manager at a cold start (AWS only).
//! - [`db`]: the PostgreSQL pool, how it verifies the server, the roles, the migrations.
//! - [`sqs`]: the SQS client and the order queue, with bounded sends (a crowd's concurrent
//!   sends sharing `SendMessageBatch` calls).
//! - [`deadline`]: an invocation's deadline, from the Lambda context to this process's clock.
//! - [`metrics`]: CloudWatch Embedded Metric Format lines.
//! - [`payments`]: the payment provider, its webhook signature and its events.
//! - [`telemetry`]: tracing, set up once per process.
//! - [`pause`]: named pause points and injectable failures for the interleaving tests
//!   (compiled out without the `failpoints` feature).

pub mod aws_secrets;
pub mod config;
pub mod db;
pub mod deadline;
pub mod metrics;
pub mod pause;
pub mod payments;
pub mod secret;
pub mod shape;
pub mod sqs;
pub mod telemetry;
