//! End-to-end and invariant tests of seckill, against the real local services.
//!
//! The tests live in `tests/tests/`, one binary per concern: `entry` (purchase path and its
//! failures), `lifecycle` (pay and cancel), `consumer` (the SQS consumer), `admin` (the fenced
//! lock), `jobs` (preheat and reconcile), `http` (the local dev server over TCP), `tls` (Redis
//! over TLS), `lambda_invoke` (every function under the real Lambda runtime API). Shared
//! helpers are in `seckill_shared::testing`.
