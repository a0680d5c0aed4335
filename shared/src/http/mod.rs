//! What every HTTP function shares at its edge: the error answer, the request extractors, and
//! the caller's identity.
//!
//! - [`error`]: the JSON error every route answers with, each variant's status, and the
//!   answer each lower layer's error becomes.
//! - [`extract`]: bounded JSON bodies, positive-integer path ids, the 404 / 405 answers.
//! - [`auth`]: the caller's identity from the verified JWT's claims; local HS256 tokens.
//! - [`origin`]: the origin secret's check, the edge's only way in.
//! - [`routes`]: what API Gateway asks of a caller on each route (`functions/routes.toml`).

pub mod auth;
pub mod error;
pub mod extract;
pub mod origin;
pub mod routes;
