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
    /// The name this deployment gives its payments at the provider: in every payment's
    /// idempotency key and metadata, so two stacks on one provider account never take each
    /// other's payments or events for their own (the template sets the stack's name).
    #[arg(long = "payment-stack", env = "PAYMENT_STACK", value_name = "PAYMENT_STACK",
          value_parser = stack_name, default_value = "seckill")]
    pub stack: String,
    /// How far a webhook event's signed timestamp may be from now, in seconds.
    #[arg(long = "payment-webhook-tolerance-secs", env = "PAYMENT_WEBHOOK_TOLERANCE_SECS",
          value_name = "PAYMENT_WEBHOOK_TOLERANCE_SECS", value_parser = tolerance,
          default_value = "300")]
    pub webhook_tolerance: Duration,
    /// The provider's publishable key (Stripe's `pk_...`), answered to the page with a `stripe`
    /// payment so that Stripe.js can confirm it. Not a secret: every buyer's browser gets it.
    /// Unset: the pay route answers no key, and the storefront cannot take the card (a client
    /// of its own may carry its key).
    #[arg(long = "payment-publishable-key", env = "PAYMENT_PUBLISHABLE_KEY",
          value_name = "PAYMENT_PUBLISHABLE_KEY", value_parser = publishable_key)]
    pub publishable_key: Option<String>,
    /// Where the page loads Stripe.js from: Stripe's own address (Stripe asks that it always be
    /// loaded from there), or a local fake's. The dev server's Content-Security-Policy allows its
    /// origin with the `stripe` provider.
    #[arg(long = "payment-js-url", env = "PAYMENT_JS_URL", value_name = "PAYMENT_JS_URL",
          value_parser = js_url, default_value = "https://js.stripe.com/v3/")]
    pub js_url: String,
}

/// What a browser needs to confirm a payment with the provider's own script: the answer of a
/// `stripe` pay carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrowserCheckout {
    /// Stripe's `pk_...`, for `Stripe(publishableKey)`.
    pub publishable_key: String,
    /// Where Stripe.js is.
    pub js_url: String,
}

/// The origins a page that confirms payments with Stripe.js must be allowed to reach: the
/// script's (loaded from it, and its frames) and the API's (Stripe.js calls it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrowserOrigins {
    /// The origin of PAYMENT_JS_URL (`https://js.stripe.com`).
    pub script: String,
    /// The origin of PAYMENT_API_BASE (`https://api.stripe.com`).
    pub api: String,
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
                &self.stack,
            ))),
            _ => None,
        }
    }

    /// What the page confirms a payment with, for the `stripe` provider with a publishable key;
    /// `None` otherwise (the local provider completes at a URL of ours).
    pub fn browser_checkout(&self) -> Option<BrowserCheckout> {
        if self.provider != "stripe" {
            return None;
        }
        Some(BrowserCheckout {
            publishable_key: self.publishable_key.clone()?,
            js_url: self.js_url.clone(),
        })
    }

    /// The origins a storefront page must be allowed to reach to pay, for the `stripe` provider;
    /// `None` for the others, whose page stays on its own origin.
    pub fn browser_origins(&self) -> Option<BrowserOrigins> {
        if self.provider != "stripe" {
            return None;
        }
        Some(BrowserOrigins {
            script: origin(&self.js_url)?,
            api: origin(&self.api_base)?,
        })
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
    /// Not its publishable key: reconcile parses the same settings and never meets a browser,
    /// and a client of the API's own (an app) may carry its key; a pay answered without one
    /// makes the storefront say it cannot take the card, and charges nothing.
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

/// A publishable key: what every buyer's browser receives, so never a secret key (`sk_`) or a
/// restricted one (`rk_`) pasted into the wrong setting.
fn publishable_key(value: &str) -> Result<String, String> {
    let plain = value.len() > 3
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if value.starts_with("pk_") && plain {
        Ok(value.to_string())
    } else {
        Err("must be a publishable key (pk_...): it is sent to every buyer's browser".into())
    }
}

/// An absolute URL a browser loads a script from: `https`, or `http` on a loopback host only
/// (a local fake such as localstripe): a script fetched in clear could be anyone's.
fn js_url(value: &str) -> Result<String, String> {
    let url = url::Url::parse(value).map_err(|e| format!("not a URL: {e}"))?;
    let loopback = match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(name)) => name == "localhost",
        None => false,
    };
    match url.scheme() {
        "https" => Ok(value.to_string()),
        "http" if loopback => Ok(value.to_string()),
        _ => Err("must be an https URL (http only on a loopback host)".into()),
    }
}

/// `scheme://host[:port]` of an absolute URL, as a Content-Security-Policy names a source.
fn origin(value: &str) -> Option<String> {
    let origin = url::Url::parse(value).ok()?.origin();
    origin.is_tuple().then(|| origin.ascii_serialization())
}

/// A stack's name as CloudFormation allows it: letters, digits and hyphens, at most 128.
fn stack_name(value: &str) -> Result<String, String> {
    let ok = !value.is_empty()
        && value.len() <= 128
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if ok {
        Ok(value.to_string())
    } else {
        Err("must be 1 to 128 letters, digits or hyphens".into())
    }
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
    /// The key a provider deduplicates starts by: one payment per order of this `stack`,
    /// however often its owner presses Pay.
    pub fn idempotency_key(&self, stack: &str) -> String {
        format!("{stack}-order-{}", self.order_id)
    }
}

/// Where a payment stands at the provider, after a cancel was asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// Cancelled: it can never be paid; its client secret completes nothing any more.
    Cancelled,
    /// It succeeded before the cancel: the buyer paid, for this amount (minor units).
    Succeeded { amount_minor: i64 },
    /// Neither yet (a payment method that settles later is `processing`): ask again later.
    Pending,
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

    /// The payment `provider_payment_id` started before, read back: what the client completes
    /// it with.
    fn resume<'a>(
        &'a self,
        provider_payment_id: &'a str,
    ) -> BoxFuture<'a, Result<StartedPayment, ProviderError>>;

    /// Cancels the payment `provider_payment_id` unless it succeeded already, and answers where
    /// it stands after: asked again, it answers the same.
    fn cancel<'a>(
        &'a self,
        provider_payment_id: &'a str,
    ) -> BoxFuture<'a, Result<Closed, ProviderError>>;

    /// Refunds the whole of `refund`'s payment, once per attempt however often it is asked
    /// (the provider's idempotency key is the stack's, the payment's and the attempt's; a
    /// second whole refund the provider refuses as made before): the refund's id, or `None`
    /// when the provider says the payment was refunded before.
    fn refund<'a>(
        &'a self,
        refund: &'a RefundRequest,
    ) -> BoxFuture<'a, Result<Option<String>, ProviderError>>;
}

/// A payment to give back whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefundRequest {
    pub order_id: i64,
    pub provider_payment_id: String,
    pub amount_minor: i64,
    /// Which attempt, from 1: in the idempotency key, so that a retry after the provider
    /// refused is asked anew (the provider keeps a key's first answer for a day).
    pub attempt: i32,
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

    fn resume<'a>(
        &'a self,
        provider_payment_id: &'a str,
    ) -> BoxFuture<'a, Result<StartedPayment, ProviderError>> {
        Box::pin(async move {
            Ok(StartedPayment {
                complete_url: self.complete_url(provider_payment_id),
                provider_payment_id: provider_payment_id.to_string(),
                client_secret: None,
            })
        })
    }

    /// A local payment is charged only when its complete route sends the event, and that route
    /// completes no payment the database records cancelled: nothing to cancel here.
    fn cancel<'a>(
        &'a self,
        _provider_payment_id: &'a str,
    ) -> BoxFuture<'a, Result<Closed, ProviderError>> {
        Box::pin(async { Ok(Closed::Cancelled) })
    }

    /// The local provider holds no money: its refund is the payment's id, refunded.
    fn refund<'a>(
        &'a self,
        refund: &'a RefundRequest,
    ) -> BoxFuture<'a, Result<Option<String>, ProviderError>> {
        Box::pin(async move { Ok(Some(format!("re_{}", refund.provider_payment_id))) })
    }
}

/// Stripe: one PaymentIntent per order (`POST /v1/payment_intents`, form-encoded, cards only,
/// the order id and the stack's name in its metadata, an idempotency key per order and stack),
/// completed by the client with Stripe.js and the intent's client secret; cancelled through
/// `POST /v1/payment_intents/{id}/cancel`, read back when the cancel is refused.
pub struct StripeProvider {
    client: reqwest::Client,
    intents: String,
    refunds: String,
    api_key: SecretString,
    stack: String,
}

/// How long a call to the provider may take: the pay route answers 503 past it, well inside
/// the entry function's timeout.
pub const PROVIDER_TIMEOUT: Duration = Duration::from_millis(2500);

impl StripeProvider {
    pub fn new(api_base: &str, api_key: SecretString, stack: &str) -> Self {
        Self {
            client: reqwest::Client::builder()
                .timeout(PROVIDER_TIMEOUT)
                .build()
                .expect("a TLS client"),
            intents: format!("{}/v1/payment_intents", api_base.trim_end_matches('/')),
            refunds: format!("{}/v1/refunds", api_base.trim_end_matches('/')),
            api_key,
            stack: stack.to_string(),
        }
    }

    fn failed(message: String) -> ProviderError {
        ProviderError {
            provider: "stripe",
            message,
        }
    }

    /// Sends `request` with the API key; the answer's status and JSON body.
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<(reqwest::StatusCode, serde_json::Value), ProviderError> {
        use super::secret::ExposeSecret;
        let response = request
            .bearer_auth(self.api_key.expose_secret())
            .send()
            .await
            .map_err(|e| Self::failed(format!("unreachable: {e}")))?;
        let status = response.status();
        let body: serde_json::Value = response
            .json()
            .await
            .map_err(|e| Self::failed(format!("{status}: unreadable answer: {e}")))?;
        Ok((status, body))
    }

    fn refused(status: reqwest::StatusCode, body: &serde_json::Value) -> ProviderError {
        let message = body["error"]["message"].as_str().unwrap_or("no message");
        Self::failed(format!("{status}: {message}"))
    }

    async fn create(&self, request: &PaymentRequest) -> Result<StartedPayment, ProviderError> {
        // Cards settle at once: a payment method that settles days later (a bank debit) could
        // succeed after the order's payment timeout released its unit.
        let form = [
            ("amount", request.amount_minor.to_string()),
            ("currency", request.currency.clone()),
            ("payment_method_types[]", "card".into()),
            ("metadata[order_id]", request.order_id.to_string()),
            ("metadata[stack]", self.stack.clone()),
        ];
        let post = self
            .client
            .post(&self.intents)
            .header("Idempotency-Key", request.idempotency_key(&self.stack))
            .form(&form);
        let (status, body) = self.send(post).await?;
        if !status.is_success() {
            return Err(Self::refused(status, &body));
        }
        let id = body["id"]
            .as_str()
            .ok_or_else(|| Self::failed("a PaymentIntent without an id".into()))?;
        Ok(StartedPayment {
            provider_payment_id: id.to_string(),
            complete_url: None,
            client_secret: body["client_secret"].as_str().map(str::to_string),
        })
    }

    /// `POST /v1/refunds` for the whole PaymentIntent, the stack's name and the order in the
    /// refund's metadata, one idempotency key per payment and attempt. Stripe's `charge_already_refunded`
    /// (refunded at the dashboard, say) is a refund made before.
    async fn give_back(&self, refund: &RefundRequest) -> Result<Option<String>, ProviderError> {
        let form = [
            ("payment_intent", refund.provider_payment_id.clone()),
            ("amount", refund.amount_minor.to_string()),
            ("metadata[order_id]", refund.order_id.to_string()),
            ("metadata[stack]", self.stack.clone()),
        ];
        let key = format!(
            "{}-refund-{}-{}",
            self.stack, refund.provider_payment_id, refund.attempt
        );
        let post = self
            .client
            .post(&self.refunds)
            .header("Idempotency-Key", key)
            .form(&form);
        let (status, body) = self.send(post).await?;
        if !status.is_success() {
            if body["error"]["code"].as_str() == Some("charge_already_refunded") {
                return Ok(None);
            }
            return Err(Self::refused(status, &body));
        }
        match body["id"].as_str() {
            Some(id) => Ok(Some(id.to_string())),
            None => Err(Self::failed("a refund without an id".into())),
        }
    }

    /// `GET /v1/payment_intents/{id}`: its client secret.
    async fn read(&self, id: &str) -> Result<StartedPayment, ProviderError> {
        let (status, body) = self
            .send(self.client.get(format!("{}/{id}", self.intents)))
            .await?;
        if !status.is_success() {
            return Err(Self::refused(status, &body));
        }
        Ok(StartedPayment {
            provider_payment_id: id.to_string(),
            complete_url: None,
            client_secret: body["client_secret"].as_str().map(str::to_string),
        })
    }

    /// Cancels the PaymentIntent; one Stripe refuses to cancel (it succeeded, or is
    /// processing, or was cancelled before) is read back, and its status answers.
    async fn close(&self, id: &str) -> Result<Closed, ProviderError> {
        let path = format!("{}/{id}", self.intents);
        let (status, body) = self
            .send(self.client.post(format!("{path}/cancel")))
            .await?;
        let body = if status.is_success() {
            body
        } else if status.is_client_error() && status != reqwest::StatusCode::NOT_FOUND {
            let (status, body) = self.send(self.client.get(&path)).await?;
            if !status.is_success() {
                return Err(Self::refused(status, &body));
            }
            body
        } else {
            return Err(Self::refused(status, &body));
        };
        match body["status"].as_str() {
            Some("canceled") => Ok(Closed::Cancelled),
            Some("succeeded") => Ok(Closed::Succeeded {
                amount_minor: body["amount_received"]
                    .as_i64()
                    .or(body["amount"].as_i64())
                    .unwrap_or(0),
            }),
            Some(_) => Ok(Closed::Pending),
            None => Err(Self::failed("a PaymentIntent without a status".into())),
        }
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

    fn resume<'a>(
        &'a self,
        provider_payment_id: &'a str,
    ) -> BoxFuture<'a, Result<StartedPayment, ProviderError>> {
        Box::pin(self.read(provider_payment_id))
    }

    fn cancel<'a>(
        &'a self,
        provider_payment_id: &'a str,
    ) -> BoxFuture<'a, Result<Closed, ProviderError>> {
        Box::pin(self.close(provider_payment_id))
    }

    fn refund<'a>(
        &'a self,
        refund: &'a RefundRequest,
    ) -> BoxFuture<'a, Result<Option<String>, ProviderError>> {
        Box::pin(self.give_back(refund))
    }
}

/// The kind of event that pays an order.
pub const SUCCEEDED: &str = "payment_intent.succeeded";
/// A refund made at the provider (the dashboard's, or ours): its object is the charge.
pub const REFUNDED: &str = "charge.refunded";
/// A dispute's events (`charge.dispute.created`, `…updated`, `…closed`): the object is the
/// dispute. Every other kind is acknowledged and ignored.
pub const DISPUTE_PREFIX: &str = "charge.dispute.";

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

/// The object an event is about: the PaymentIntent of a success, the charge of a refund, the
/// dispute of a dispute's event.
#[derive(Clone, Debug, Deserialize)]
pub struct EventPayment {
    /// The object's id: the payment's (`pi_...`) for a success, else the charge's or the
    /// dispute's.
    pub id: String,
    /// Minor units: paid, charged, or disputed.
    pub amount: i64,
    pub currency: String,
    /// The payment a charge or a dispute belongs to.
    #[serde(default)]
    pub payment_intent: Option<String>,
    /// A charge's refunded part, in minor units.
    #[serde(default)]
    pub amount_refunded: Option<i64>,
    /// A charge's refunds, newest first (`data[0].id` is the last refund's id).
    #[serde(default)]
    pub refunds: Option<serde_json::Value>,
    /// What the payment was started with: `order_id`, `stack`.
    #[serde(default)]
    pub metadata: std::collections::HashMap<String, String>,
}

impl EventPayment {
    /// The order id the payment was started for, as its metadata says.
    pub fn order_id(&self) -> Option<i64> {
        self.metadata.get("order_id")?.parse().ok()
    }

    /// The provider's id of the payment the event is about.
    pub fn payment_id(&self) -> &str {
        self.payment_intent.as_deref().unwrap_or(&self.id)
    }

    /// The last refund's id, on a charge's event.
    pub fn refund_id(&self) -> Option<&str> {
        self.refunds.as_ref()?["data"][0]["id"].as_str()
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

    #[test]
    fn only_a_publishable_key_is_taken_for_the_browser() {
        use super::publishable_key;
        assert!(publishable_key("pk_test_51Abc").is_ok());
        for bad in [
            "sk_test_51Abc",
            "rk_live_1",
            "pk_",
            "pk_test 1",
            "",
            "whsec_1",
        ] {
            assert!(publishable_key(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn stripe_js_is_loaded_over_tls_or_from_loopback() {
        use super::js_url;
        for ok in [
            "https://js.stripe.com/v3/",
            "http://127.0.0.1:8420/js.stripe.com/v3/",
            "http://localhost:8420/js.stripe.com/v3/",
            "http://[::1]:8420/v3/",
        ] {
            assert!(js_url(ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://js.stripe.com/v3/",
            "js.stripe.com/v3/",
            "ftp://127.0.0.1/x",
            "",
        ] {
            assert!(js_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn origins_are_scheme_host_and_port_only() {
        use super::origin;
        let cases = [
            ("https://js.stripe.com/v3/", Some("https://js.stripe.com")),
            ("https://api.stripe.com", Some("https://api.stripe.com")),
            (
                "http://127.0.0.1:8420/js.stripe.com/v3/",
                Some("http://127.0.0.1:8420"),
            ),
            (
                "https://api.stripe.com:443/v1",
                Some("https://api.stripe.com"),
            ),
            ("not a url", None),
        ];
        for (url, want) in cases {
            assert_eq!(origin(url).as_deref(), want, "{url}");
        }
    }
}
