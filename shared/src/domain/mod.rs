//! The domain: sales, their settings, orders, a purchase and its refusals, and the database
//! statements that read and write them. Nothing here knows Redis or HTTP.
//!
//! - [`activity`]: a sale's row and its statements; [`activity::Phase`] of its window.
//! - [`settings`]: what an admin may set on a sale and the rules it obeys.
//! - [`draw`]: what the database keeps of a draw sale's draw: its entries and outcome.
//! - [`order`]: an order's row, statuses, failure reasons and statements.
//! - [`payment`]: an order's payment at the provider, and the provider's events.
//! - [`purchase`]: one purchase attempt, and the order message it becomes.
//! - [`refusal`]: why a purchase was refused.
//! - [`status`]: every status, reason and state a row or an answer carries, one enum each.

pub mod activity;
pub mod draw;
pub mod order;
pub mod payment;
pub mod purchase;
pub mod refusal;
pub mod settings;
pub mod status;
