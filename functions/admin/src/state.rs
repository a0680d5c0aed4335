//! What every admin handler is given: the config and the clients.

use seckill_shared::{ApiError, Config, Context};

/// What every handler needs, built once per cold start: the config and the clients, which
/// the protocol's admin steps take as they are.
#[derive(Clone)]
pub struct AdminState {
    context: Context,
}

impl AdminState {
    pub fn new(context: Context) -> Self {
        Self { context }
    }

    /// Connects Redis (bounded) and a lazy pool, as a cold start does.
    pub async fn connect(config: Config) -> anyhow::Result<Self> {
        Ok(Self::new(Context::connect(config).await?))
    }
}

impl std::ops::Deref for AdminState {
    type Target = Context;

    fn deref(&self) -> &Context {
        &self.context
    }
}

/// The answer for a sale that does not exist.
pub(crate) fn not_found(id: i64) -> ApiError {
    ApiError::NotFound(format!("activity {id} does not exist"))
}
