//! The origin secret's settings: what `x-origin-verify` may carry when the edge is on.

use super::values::non_blank;
use crate::infra::aws_secrets;
use crate::infra::secret::SecretString;
use chrono::{DateTime, Utc};
use std::time::Duration;

/// How long the previous origin secret stays accepted after the current one was made, unless
/// EDGE_ORIGIN_PREVIOUS_SECS says otherwise: a rotation's deploy and CloudFront's update have
/// a day to finish, and a value rotated out is refused after that whether or not the secret is
/// rotated again.
pub const PREVIOUS_FOR: Duration = Duration::from_secs(24 * 3600);

/// The longest EDGE_ORIGIN_PREVIOUS_SECS may keep a previous value.
pub const MAX_PREVIOUS_FOR: Duration = Duration::from_secs(7 * 24 * 3600);

/// The values `x-origin-verify` may carry: with the edge on, CloudFront adds the origin
/// secret to every request it sends the HTTP API, and `http::origin` refuses the others.
/// Nothing set: every request is let through (the edge off, and local runs).
#[derive(Clone, Debug, clap::Args)]
pub struct EdgeOrigin {
    /// AWS, the edge on: the Secrets Manager secret (JSON {"value": ...}) CloudFront sends in
    /// x-origin-verify. Its current value is accepted, and its previous one (a rotation
    /// refuses nobody) until EDGE_ORIGIN_PREVIOUS_SECS after the current one was made.
    #[arg(
        id = "edge_origin_secret_arn",
        long = "edge-origin-secret-arn",
        env = "EDGE_ORIGIN_SECRET_ARN",
        value_name = "EDGE_ORIGIN_SECRET_ARN"
    )]
    pub secret_arn: Option<String>,
    /// The origin secret itself, for a run outside AWS that stands behind a proxy adding it.
    #[arg(id = "edge_origin_secret", long = "edge-origin-secret", env = "EDGE_ORIGIN_SECRET",
          value_name = "EDGE_ORIGIN_SECRET", value_parser = secret_text, hide_env_values = true)]
    pub secret: Option<SecretString>,
    /// How long after the current value of EDGE_ORIGIN_SECRET_ARN was made its previous value
    /// is still accepted, in seconds (at most a week).
    #[arg(long = "edge-origin-previous-secs", env = "EDGE_ORIGIN_PREVIOUS_SECS",
          value_name = "EDGE_ORIGIN_PREVIOUS_SECS", value_parser = previous_secs,
          default_value = "86400")]
    pub previous_for: Duration,
    /// The values read from EDGE_ORIGIN_SECRET_ARN at the cold start.
    #[arg(skip)]
    pub from_arn: Vec<OriginValue>,
}

/// One value `x-origin-verify` may carry, and until when.
#[derive(Clone, Debug)]
pub struct OriginValue {
    pub value: SecretString,
    /// After this the value is refused; `None`: as long as this process runs.
    pub until: Option<DateTime<Utc>>,
}

impl OriginValue {
    /// A value accepted as long as this process runs.
    pub fn always(value: SecretString) -> Self {
        OriginValue { value, until: None }
    }

    /// Whether a request carrying this value at `now` is let through.
    pub fn valid_at(&self, now: DateTime<Utc>) -> bool {
        self.until.is_none_or(|until| now < until)
    }
}

impl Default for EdgeOrigin {
    fn default() -> Self {
        EdgeOrigin {
            secret_arn: None,
            secret: None,
            previous_for: PREVIOUS_FOR,
            from_arn: Vec::new(),
        }
    }
}

impl EdgeOrigin {
    /// Every value a request may carry, each with its end; empty: no check.
    pub fn accepted(&self) -> Vec<OriginValue> {
        self.secret
            .iter()
            .cloned()
            .map(OriginValue::always)
            .chain(self.from_arn.iter().cloned())
            .collect()
    }

    /// Reads the current and (if any) the previous value of EDGE_ORIGIN_SECRET_ARN.
    pub async fn resolve(&mut self, client: &aws_sdk_secretsmanager::Client) -> anyhow::Result<()> {
        let Some(arn) = &self.secret_arn else {
            return Ok(());
        };
        let value = |json: &str| -> anyhow::Result<SecretString> {
            #[derive(serde::Deserialize)]
            struct Origin {
                value: String,
            }
            let origin: Origin = serde_json::from_str(json)
                .map_err(|_| anyhow::anyhow!("origin secret is not JSON with a \"value\""))?;
            anyhow::ensure!(!origin.value.is_empty(), "origin secret is empty");
            Ok(SecretString::from(origin.value))
        };
        let (current, made) = aws_secrets::read_version(client, arn, "AWSCURRENT").await?;
        self.from_arn = vec![OriginValue::always(value(&current)?)];
        match aws_secrets::read_version(client, arn, "AWSPREVIOUS").await {
            Ok((previous, _)) => {
                // Counted from when the current value was made; from now when Secrets Manager
                // does not say.
                let until =
                    made.unwrap_or_else(Utc::now) + chrono::Duration::from_std(self.previous_for)?;
                if Utc::now() < until {
                    self.from_arn.push(OriginValue {
                        value: value(&previous)?,
                        until: Some(until),
                    });
                }
            }
            // A secret never rotated has no previous version.
            Err(e) => tracing::debug!(error = %e, "no previous origin secret"),
        }
        tracing::info!(
            values = self.from_arn.len(),
            "origin secret read from Secrets Manager"
        );
        Ok(())
    }
}

fn previous_secs(value: &str) -> Result<Duration, String> {
    let secs = super::values::secs(value)?;
    if secs > MAX_PREVIOUS_FOR {
        return Err(format!("at most {} (a week)", MAX_PREVIOUS_FOR.as_secs()));
    }
    Ok(secs)
}

fn secret_text(value: &str) -> Result<SecretString, String> {
    non_blank(value).map(SecretString::from)
}
