//! localstripe, the stateful fake of Stripe's API the local stack runs on 8420
//! (`scripts/stack/payments.sh`): the Stripe provider pointed at it, and the buyer's side of a
//! PaymentIntent as Stripe.js would drive it (a card attached, the intent confirmed) and the
//! event Stripe would send about it.

use seckill_shared::infra::config::Config;
use seckill_shared::infra::payments::SUCCEEDED;
use serde_json::Value;

/// Where localstripe listens.
pub const LOCALSTRIPE: &str = "http://127.0.0.1:8420";

/// `config` pointed at the Stripe provider at `api_base` (localstripe takes any `sk_test_` key).
pub fn stripe_at(config: &mut Config, api_base: &str) {
    let payments = &mut config.payments;
    payments.provider = "stripe".into();
    payments.api_base = api_base.into();
    payments.api_key = Some("sk_test_seckill".to_string().into());
}

/// The buyer's side of PaymentIntent `payment_id`, as Stripe.js would drive it: a card attached
/// and the intent confirmed (4242…: succeeds at once). Answers the intent afterwards, or the
/// error localstripe answered (a cancelled intent refuses both steps).
pub async fn buyer_pays(payment_id: &str) -> Result<Value, Value> {
    let http = reqwest::Client::new();
    let post = |path: String, form: Vec<(&'static str, String)>| {
        http.post(format!("{LOCALSTRIPE}{path}"))
            .basic_auth("sk_test_buyer", Some(""))
            .form(&form)
            .send()
    };
    let card = vec![
        ("type", "card".to_string()),
        ("card[number]", "4242424242424242".into()),
        ("card[exp_month]", "12".into()),
        ("card[exp_year]", "2040".into()),
        ("card[cvc]", "123".into()),
    ];
    let answer = |r: Result<reqwest::Response, reqwest::Error>| async move {
        match r {
            Ok(r) => {
                let ok = r.status().is_success();
                let body: Value = r.json().await.unwrap_or(Value::Null);
                if ok {
                    Ok(body)
                } else {
                    Err(body)
                }
            }
            Err(e) => Err(Value::String(e.to_string())),
        }
    };
    let pm = answer(post("/v1/payment_methods".into(), card).await).await?;
    let attach = vec![(
        "payment_method",
        pm["id"].as_str().unwrap_or_default().to_string(),
    )];
    let path = format!("/v1/payment_intents/{payment_id}");
    answer(post(path.clone(), attach).await).await?;
    answer(post(format!("{path}/confirm"), vec![]).await).await
}

/// PaymentIntent `payment_id` as localstripe holds it.
pub async fn intent(payment_id: &str) -> anyhow::Result<Value> {
    Ok(reqwest::Client::new()
        .get(format!("{LOCALSTRIPE}/v1/payment_intents/{payment_id}"))
        .basic_auth("sk_test_reader", Some(""))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?)
}

/// The intent's status at localstripe (`requires_payment_method`, `succeeded`, `canceled`, …).
pub async fn intent_status(payment_id: &str) -> String {
    intent(payment_id).await.map_or_else(
        |e| format!("unreadable: {e}"),
        |i| i["status"].as_str().unwrap_or_default().to_string(),
    )
}

/// The `payment_intent.succeeded` event `event_id` Stripe sends about `intent` (as read from
/// localstripe): the intent itself, metadata and all, as the event's object.
pub fn succeeded_event_of(event_id: &str, intent: &Value) -> String {
    serde_json::json!({
        "id": event_id,
        "object": "event",
        "type": SUCCEEDED,
        "created": chrono::Utc::now().timestamp(),
        "data": {"object": intent},
    })
    .to_string()
}
