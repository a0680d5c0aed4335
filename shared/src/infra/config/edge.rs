//! The origin secret's settings: what `x-origin-verify` may carry when the edge is on.

use super::values::non_blank;
use crate::infra::aws_secrets;
use crate::infra::secret::SecretString;

/// The values `x-origin-verify` may carry: with the edge on, CloudFront adds the origin
/// secret to every request it sends the HTTP API, and `http::origin` refuses the others.
/// Nothing set: every request is let through (the edge off, and local runs).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct EdgeOrigin {
    /// AWS, the edge on: the Secrets Manager secret (JSON {"value": ...}) CloudFront sends in
    /// x-origin-verify. Its current and previous values are accepted (a rotation refuses
    /// nobody).
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
    /// The values read from EDGE_ORIGIN_SECRET_ARN at the cold start.
    #[arg(skip)]
    pub from_arn: Vec<SecretString>,
}

impl EdgeOrigin {
    /// Every value a request may carry; empty: no check.
    pub fn accepted(&self) -> Vec<SecretString> {
        self.secret.iter().chain(&self.from_arn).cloned().collect()
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
        self.from_arn = vec![value(&aws_secrets::read(client, arn).await?)?];
        match aws_secrets::read_stage(client, arn, "AWSPREVIOUS").await {
            Ok(previous) => self.from_arn.push(value(&previous)?),
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

fn secret_text(value: &str) -> Result<SecretString, String> {
    non_blank(value).map(SecretString::from)
}
