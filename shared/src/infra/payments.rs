//! The payment provider: where a payment starts, and how its events are signed.
//!
//! - [`Provider`]: starts a payment for an amount and answers what the client needs to
//!   complete it. [`LocalProvider`] is the dev server's: it completes a payment by sending the
//!   webhook a signed event, the way a real provider does; [`StripeProvider`] starts a
//!   PaymentIntent through Stripe's API.
//! - [`signature`]: the provider's webhook signature, Stripe's documented scheme: the header
//!   `Stripe-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`, checked in
//!   constant time, within a tolerance window.
//! - [`Event`]: the fields of a provider event the webhook decides by (Stripe's event shape).
//!
//! Nothing here knows orders; `protocol::pay` does.

use super::secret::SecretString;
use futures::future::BoxFuture;
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;

/// How this process takes payments: part of `Config`, parsed with it.
#[derive(Clone, Debug, clap::Args)]
pub struct PaymentSettings {
    /// Which provider starts payments: `stripe` (PaymentIntents through Stripe's API, with
    /// PAYMENT_API_KEY), `local` (the dev server completes them, for `make serve`, the demo and
    /// the tests) or `none` (`POST /orders/{id}/pay` answers 503).
    #[arg(long = "payment-provider", env = "PAYMENT_PROVIDER", value_name = "PAYMENT_PROVIDER",
          value_parser = ["none", "local", "stripe"], default_value = "none")]
    pub provider: String,
    /// The provider's API key (Stripe's `sk_...`); in AWS read from PAYMENT_SECRET_ARN.
    #[arg(long = "payment-api-key", env = "PAYMENT_API_KEY", value_name = "PAYMENT_API_KEY",
          value_parser = secret, hide_env_values = true)]
    pub api_key: Option<SecretString>,
    /// Where the provider's API is (Stripe's; a test points it at a recording server).
    #[arg(
        long = "payment-api-base",
        env = "PAYMENT_API_BASE",
        value_name = "PAYMENT_API_BASE",
        default_value = "https://api.stripe.com"
    )]
    pub api_base: String,
    /// AWS: the Secrets Manager secret holding `{"apiKey": "sk_...", "webhookSecret":
    /// "whsec_..."}`, read at a cold start into PAYMENT_API_KEY and PAYMENT_WEBHOOK_SECRET.
    #[arg(
        long = "payment-secret-arn",
        env = "PAYMENT_SECRET_ARN",
        value_name = "PAYMENT_SECRET_ARN"
    )]
    pub secret_arn: Option<String>,
    /// The secret the provider signs its webhook events with (Stripe's `whsec_...`). Unset:
    /// `POST /payments/webhook` answers 503 and nothing is ever paid.
    #[arg(long = "payment-webhook-secret", env = "PAYMENT_WEBHOOK_SECRET",
          value_name = "PAYMENT_WEBHOOK_SECRET", value_parser = secret, hide_env_values = true)]
    pub webhook_secret: Option<SecretString>,
    /// How far a webhook event's signed timestamp may be from now, in seconds.
    #[arg(long = "payment-webhook-tolerance-secs", env = "PAYMENT_WEBHOOK_TOLERANCE_SECS",
          value_name = "PAYMENT_WEBHOOK_TOLERANCE_SECS", value_parser = tolerance,
          default_value = "300")]
    pub webhook_tolerance: Duration,
}

impl PaymentSettings {
    /// The provider these settings name, `None` for `none` (and for `stripe` without an API
    /// key, which `Config::check` refuses first).
    pub fn provider(&self) -> Option<Arc<dyn Provider>> {
        match self.provider.as_str() {
            "local" => Some(Arc::new(LocalProvider)),
            "stripe" => Some(Arc::new(StripeProvider::new(
                &self.api_base,
                self.api_key.clone()?,
            ))),
            _ => None,
        }
    }

    /// A blank secret reference is no reference (`events/env.json` blanks the template's).
    pub fn drop_blank(&mut self) {
        if self
            .secret_arn
            .as_deref()
            .is_some_and(|v| v.trim().is_empty())
        {
            self.secret_arn = None;
        }
    }

    /// `stripe` needs its API key and its webhook secret, from the environment or the secret.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.provider == "stripe" && self.secret_arn.is_none() {
            anyhow::ensure!(
                self.api_key.is_some() && self.webhook_secret.is_some(),
                "PAYMENT_PROVIDER=stripe needs PAYMENT_API_KEY and PAYMENT_WEBHOOK_SECRET, or \
                 PAYMENT_SECRET_ARN"
            );
        }
        Ok(())
    }

    /// Reads the API key and the webhook secret from PAYMENT_SECRET_ARN, when set.
    pub async fn resolve_secret(
        &mut self,
        client: &aws_sdk_secretsmanager::Client,
    ) -> anyhow::Result<()> {
        let Some(arn) = &self.secret_arn else {
            return Ok(());
        };
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Secrets {
            api_key: String,
            webhook_secret: String,
        }
        let json = super::aws_secrets::read(client, arn).await?;
        let s: Secrets = serde_json::from_str(&json).map_err(|_| {
            anyhow::anyhow!("payment secret is not JSON with \"apiKey\" and \"webhookSecret\"")
        })?;
        self.api_key = Some(secret(&s.api_key).map_err(anyhow::Error::msg)?);
        self.webhook_secret = Some(secret(&s.webhook_secret).map_err(anyhow::Error::msg)?);
        tracing::info!("payment provider secrets read from Secrets Manager");
        Ok(())
    }
}

fn secret(value: &str) -> Result<SecretString, String> {
    if value.trim().is_empty() {
        return Err("must not be blank".into());
    }
    Ok(SecretString::from(value.to_string()))
}

/// Whole seconds, 1 to 3600: a zero window refuses every event, a long one lets a captured
/// event be replayed for longer.
fn tolerance(value: &str) -> Result<Duration, String> {
    match value.trim().parse::<u64>() {
        Ok(s @ 1..=3600) => Ok(Duration::from_secs(s)),
        _ => Err("must be a whole number of seconds from 1 to 3600".into()),
    }
}

/// What a payment is started for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PaymentRequest {
    pub order_id: i64,
    /// In the currency's minor units; more than 0.
    pub amount_minor: i64,
    /// ISO 4217, lowercase.
    pub currency: String,
}

impl PaymentRequest {
    /// The key a provider deduplicates starts by: one payment per order, however often its
    /// owner presses Pay.
    pub fn idempotency_key(&self) -> String {
        format!("seckill-order-{}", self.order_id)
    }
}

/// A payment the provider holds, as the client needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartedPayment {
    /// The provider's id of the payment (`pi_...`); its events name it.
    pub provider_payment_id: String,
    /// Where the client completes it, when the provider completes payments at a URL of ours
    /// (the local provider); `None` when the client completes it with the provider itself.
    pub complete_url: Option<String>,
    /// What the client completes it with at the provider (Stripe's PaymentIntent client
    /// secret, for Stripe.js); the buyer's own, never logged.
    pub client_secret: Option<String>,
}

/// The provider could not start a payment (out of reach, or refused): the caller answers 503.
#[derive(Debug, thiserror::Error)]
#[error("payment provider {provider}: {message}")]
pub struct ProviderError {
    pub provider: &'static str,
    pub message: String,
}

/// A payment provider.
pub trait Provider: Send + Sync + 'static {
    /// Its name, stored with each payment and answered to the client (`local`, `stripe`).
    fn name(&self) -> &'static str;

    /// Starts a payment of `request`, idempotently per [`PaymentRequest::idempotency_key`]:
    /// the same order gets the same payment.
    fn start<'a>(
        &'a self,
        request: &'a PaymentRequest,
    ) -> BoxFuture<'a, Result<StartedPayment, ProviderError>>;

    /// Where the client completes the stored payment `provider_payment_id`, if at a URL of
    /// ours.
    fn complete_url(&self, provider_payment_id: &str) -> Option<String>;
}

/// The dev server's provider: a payment is a local id, and `POST <completeUrl>` on the dev
/// server plays the provider's part, sending the webhook a `payment_intent.succeeded` event
/// signed with the webhook secret.
#[derive(Clone, Debug, Default)]
pub struct LocalProvider;

/// The prefix of a local payment's id; the order id follows.
pub const LOCAL_PAYMENT_PREFIX: &str = "pi_local_";

impl Provider for LocalProvider {
    fn name(&self) -> &'static str {
        "local"
    }

    fn start<'a>(
        &'a self,
        request: &'a PaymentRequest,
    ) -> BoxFuture<'a, Result<StartedPayment, ProviderError>> {
        let id = format!("{LOCAL_PAYMENT_PREFIX}{}", request.order_id);
        Box::pin(async move {
            Ok(StartedPayment {
                complete_url: self.complete_url(&id),
                provider_payment_id: id,
                client_secret: None,
            })
        })
    }

    fn complete_url(&self, provider_payment_id: &str) -> Option<String> {
        Some(format!("/payments/local/{provider_payment_id}/complete"))
    }
}

/// Stripe: one PaymentIntent per order (`POST /v1/payment_intents`, form-encoded, the order
/// id in its metadata, an idempotency key per order), completed by the client with Stripe.js
/// and the intent's client secret.
pub struct StripeProvider {
    client: reqwest::Client,
    intents: String,
    api_key: SecretString,
}

/// How long a call to the provider may take: the pay route answers 503 past it, well inside
/// the entry function's timeout.
pub const PROVIDER_TIMEOUT: Duration = Duration::from_millis(2500);

impl StripeProvider {
    pub fn new(api_base: &str, api_key: SecretString) -> Self {
        Self {
            client: reqwest::Client::builder()
                .timeout(PROVIDER_TIMEOUT)
                .build()
                .expect("a TLS client"),
            intents: format!("{}/v1/payment_intents", api_base.trim_end_matches('/')),
            api_key,
        }
    }

    async fn create(&self, request: &PaymentRequest) -> Result<StartedPayment, ProviderError> {
        use super::secret::ExposeSecret;
        let failed = |message: String| ProviderError {
            provider: "stripe",
            message,
        };
        let form = [
            ("amount", request.amount_minor.to_string()),
            ("currency", request.currency.clone()),
            ("metadata[order_id]", request.order_id.to_string()),
            ("automatic_payment_methods[enabled]", "true".into()),
        ];
        let response = self
            .client
            .post(&self.intents)
            .bearer_auth(self.api_key.expose_secret())
            .header("Idempotency-Key", request.idempotency_key())
            .form(&form)
            .send()
            .await
            .map_err(|e| failed(format!("unreachable: {e}")))?;
        let status = response.status();
        let body: serde_json::Value = response
            .json()
            .await
            .map_err(|e| failed(format!("{status}: unreadable answer: {e}")))?;
        if !status.is_success() {
            let message = body["error"]["message"].as_str().unwrap_or("no message");
            return Err(failed(format!("{status}: {message}")));
        }
        let id = body["id"]
            .as_str()
            .ok_or_else(|| failed("a PaymentIntent without an id".into()))?;
        Ok(StartedPayment {
            provider_payment_id: id.to_string(),
            complete_url: None,
            client_secret: body["client_secret"].as_str().map(str::to_string),
        })
    }
}

impl Provider for StripeProvider {
    fn name(&self) -> &'static str {
        "stripe"
    }

    fn start<'a>(
        &'a self,
        request: &'a PaymentRequest,
    ) -> BoxFuture<'a, Result<StartedPayment, ProviderError>> {
        Box::pin(self.create(request))
    }

    fn complete_url(&self, _provider_payment_id: &str) -> Option<String> {
        None
    }
}

/// The kind of event that pays an order; every other kind is acknowledged and ignored.
pub const SUCCEEDED: &str = "payment_intent.succeeded";

/// A provider event, as much of Stripe's event object as the webhook decides by.
#[derive(Clone, Debug, Deserialize)]
pub struct Event {
    /// The event's id (`evt_...`): the provider redelivers an event with the same id.
    pub id: String,
    /// `payment_intent.succeeded`, ...
    #[serde(rename = "type")]
    pub kind: String,
    pub data: EventData,
}

#[derive(Clone, Debug, Deserialize)]
pub struct EventData {
    pub object: EventPayment,
}

/// The payment an event is about.
#[derive(Clone, Debug, Deserialize)]
pub struct EventPayment {
    /// The provider's payment id (`pi_...`).
    pub id: String,
    /// Minor units.
    pub amount: i64,
    pub currency: String,
    /// What the payment was started with: `order_id`.
    #[serde(default)]
    pub metadata: std::collections::HashMap<String, String>,
}

impl EventPayment {
    /// The order id the payment was started for, as its metadata says.
    pub fn order_id(&self) -> Option<i64> {
        self.metadata.get("order_id")?.parse().ok()
    }
}

/// The event of a payment that succeeded, in Stripe's shape: what the local provider sends.
pub fn succeeded_event(event_id: &str, request: &PaymentRequest, payment_id: &str) -> String {
    serde_json::json!({
        "id": event_id,
        "object": "event",
        "type": SUCCEEDED,
        "created": chrono::Utc::now().timestamp(),
        "data": {"object": {
            "id": payment_id,
            "object": "payment_intent",
            "amount": request.amount_minor,
            "amount_received": request.amount_minor,
            "currency": request.currency,
            "status": "succeeded",
            "metadata": {"order_id": request.order_id.to_string()},
        }},
    })
    .to_string()
}

pub mod signature {
    //! Stripe's webhook signature: `t=<unix seconds>,v1=<hex HMAC-SHA256("<t>.<body>")>`.

    use hmac::{Hmac, KeyInit, Mac};
    use sha2::Sha256;
    use std::time::Duration;

    /// The header that carries it.
    pub const HEADER: &str = "stripe-signature";

    /// How far an event's timestamp may be from now: Stripe's libraries default to five
    /// minutes, which bounds how long a captured event can be replayed.
    pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

    /// Why a signature was refused; each is a 400 that changes nothing.
    #[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
    pub enum Refused {
        #[error("no Stripe-Signature header")]
        Missing,
        #[error("the Stripe-Signature header has no timestamp or no v1 signature")]
        Malformed,
        #[error("the signature's timestamp is {0} s from now, outside the tolerance")]
        OutsideTolerance(i64),
        #[error("no v1 signature matches the body")]
        Mismatch,
    }

    fn mac(secret: &[u8], timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }

    /// The header value signing `body` at `timestamp` (unix seconds).
    pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
        let digest = mac(secret, timestamp, body).finalize().into_bytes();
        format!("t={timestamp},v1={}", hex::encode(digest))
    }

    /// Checks `header` against `body` at `now` (unix seconds): one of its `v1` signatures is
    /// the body's (compared in constant time) and its timestamp is within `tolerance`.
    pub fn verify(
        secret: &[u8],
        header: Option<&str>,
        body: &[u8],
        now: i64,
        tolerance: Duration,
    ) -> Result<(), Refused> {
        let header = header.ok_or(Refused::Missing)?;
        let mut timestamp = None;
        let mut signatures = Vec::new();
        for part in header.split(',') {
            match part.trim().split_once('=') {
                Some(("t", t)) => timestamp = t.parse::<i64>().ok(),
                Some(("v1", v)) => signatures.extend(hex::decode(v).ok()),
                _ => {}
            }
        }
        let timestamp = timestamp.ok_or(Refused::Malformed)?;
        if signatures.is_empty() {
            return Err(Refused::Malformed);
        }
        let off = now.saturating_sub(timestamp);
        if off.unsigned_abs() > tolerance.as_secs() {
            return Err(Refused::OutsideTolerance(off));
        }
        let expected = mac(secret, timestamp, body);
        if signatures
            .iter()
            .any(|s| expected.clone().verify_slice(s).is_ok())
        {
            Ok(())
        } else {
            Err(Refused::Mismatch)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::signature::{sign, verify, Refused, DEFAULT_TOLERANCE};

    const SECRET: &[u8] = b"whsec_test";
    const BODY: &[u8] = br#"{"id":"evt_1"}"#;

    #[test]
    fn a_signature_verifies_within_the_window_only() {
        let header = sign(SECRET, 1_000, BODY);
        assert_eq!(
            verify(SECRET, Some(&header), BODY, 1_000, DEFAULT_TOLERANCE),
            Ok(())
        );
        assert_eq!(
            verify(SECRET, Some(&header), BODY, 1_300, DEFAULT_TOLERANCE),
            Ok(())
        );
        assert_eq!(
            verify(SECRET, Some(&header), BODY, 1_301, DEFAULT_TOLERANCE),
            Err(Refused::OutsideTolerance(301))
        );
        assert_eq!(
            verify(SECRET, Some(&header), BODY, 600, DEFAULT_TOLERANCE),
            Err(Refused::OutsideTolerance(-400))
        );
    }

    #[test]
    fn a_changed_body_secret_or_header_is_refused() {
        let header = sign(SECRET, 1_000, BODY);
        let verify_at = |secret: &[u8], header: Option<&str>, body: &[u8]| {
            verify(secret, header, body, 1_000, DEFAULT_TOLERANCE)
        };
        assert_eq!(
            verify_at(SECRET, Some(&header), b"{}"),
            Err(Refused::Mismatch)
        );
        assert_eq!(
            verify_at(b"other", Some(&header), BODY),
            Err(Refused::Mismatch)
        );
        assert_eq!(verify_at(SECRET, None, BODY), Err(Refused::Missing));
        assert_eq!(
            verify_at(SECRET, Some("v1=00"), BODY),
            Err(Refused::Malformed)
        );
        assert_eq!(
            verify_at(SECRET, Some("t=1000"), BODY),
            Err(Refused::Malformed)
        );
        // A header with a second, valid signature (a secret being rolled) verifies.
        let rolled = format!(
            "t=1000,v1={},{}",
            "ab".repeat(32),
            &header["t=1000,".len()..]
        );
        assert_eq!(verify_at(SECRET, Some(&rolled), BODY), Ok(()));
    }
}
