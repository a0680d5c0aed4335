//! One purchase, from the request to the order message: the [`Attempt`] the entry function
//! makes of a click, and the [`OrderMessage`] it becomes once Redis reserved its units.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A buyer's attempt to buy `quantity` units of a sale: what is known of a request before
/// Redis decides, and what a give-back claims in the database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// Issued by the entry function; the order row's unique key.
    pub request_id: Uuid,
    pub activity_id: i64,
    /// The verified token's `sub`.
    pub user_id: String,
    pub quantity: i64,
    /// The sale's bucket count as the caller knows it (1 when it does not): with the user it
    /// names the home bucket whose ledger holds the reservation.
    pub buckets: u32,
}

/// An attempt Redis reserved units for, on its way to the database: what the entry function
/// sends to the order queue and the consumer reads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Wire", into = "Wire")]
pub struct OrderMessage {
    pub attempt: Attempt,
    /// Redis server time of the reservation, in ms since the epoch.
    pub reserved_at_ms: i64,
    /// The sale's load epoch the reservation was made under; the order commits only while the
    /// database's is the same (a reload since means Redis lost this reservation). Absent in
    /// messages from before epochs existed: no check.
    pub load_epoch: Option<i64>,
    pub kind: MessageKind,
}

/// What a message on the order queue carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MessageKind {
    /// A first-come reservation (or a draw sale's purchase after its draw): the consumer
    /// writes its order.
    #[default]
    Order,
    /// An entry of a draw sale's pool, answered 202 `queued`: the consumer keeps it in the
    /// database, so that a pool Redis loses is rebuilt with it.
    Entry,
}

/// The message as JSON: one flat object, camelCase, unknown fields refused; `buckets` absent
/// for a sale with one bucket.
#[derive(Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Wire {
    request_id: Uuid,
    activity_id: i64,
    user_id: String,
    quantity: i64,
    reserved_at_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    load_epoch: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    buckets: Option<u32>,
    /// Absent for an order.
    #[serde(default, skip_serializing_if = "is_order")]
    kind: MessageKind,
}

fn is_order(kind: &MessageKind) -> bool {
    *kind == MessageKind::Order
}

impl From<Wire> for OrderMessage {
    fn from(w: Wire) -> Self {
        OrderMessage {
            attempt: Attempt {
                request_id: w.request_id,
                activity_id: w.activity_id,
                user_id: w.user_id,
                quantity: w.quantity,
                buckets: w.buckets.unwrap_or(1).max(1),
            },
            reserved_at_ms: w.reserved_at_ms,
            load_epoch: w.load_epoch,
            kind: w.kind,
        }
    }
}

impl From<OrderMessage> for Wire {
    fn from(m: OrderMessage) -> Self {
        let a = m.attempt;
        Wire {
            request_id: a.request_id,
            activity_id: a.activity_id,
            user_id: a.user_id,
            quantity: a.quantity,
            reserved_at_ms: m.reserved_at_ms,
            load_epoch: m.load_epoch,
            buckets: (a.buckets > 1).then_some(a.buckets),
            kind: m.kind,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_one_flat_object_and_a_one_bucket_sale_names_no_buckets() {
        let id = Uuid::nil();
        let m = OrderMessage {
            attempt: Attempt {
                request_id: id,
                activity_id: 7,
                user_id: "alice".into(),
                quantity: 2,
                buckets: 1,
            },
            reserved_at_ms: 1_000,
            load_epoch: Some(3),
            kind: MessageKind::Order,
        };
        let json = serde_json::to_value(&m).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"requestId": id, "activityId": 7, "userId": "alice",
                "quantity": 2, "reservedAtMs": 1000, "loadEpoch": 3})
        );
        let back: OrderMessage = serde_json::from_value(json).unwrap();
        assert_eq!(back, m);
        let bucketed = r#"{"requestId":"00000000-0000-0000-0000-000000000000","activityId":7,
            "userId":"a","quantity":1,"reservedAtMs":1,"buckets":3}"#;
        assert_eq!(
            serde_json::from_str::<OrderMessage>(bucketed)
                .unwrap()
                .attempt
                .buckets,
            3
        );
        let unknown = r#"{"requestId":"00000000-0000-0000-0000-000000000000","activityId":7,
            "userId":"a","quantity":1,"reservedAtMs":1,"extra":1}"#;
        assert!(serde_json::from_str::<OrderMessage>(unknown).is_err());
        let entry = r#"{"requestId":"00000000-0000-0000-0000-000000000000","activityId":7,
            "userId":"a","quantity":1,"reservedAtMs":1,"kind":"entry"}"#;
        let entry = serde_json::from_str::<OrderMessage>(entry).unwrap();
        assert_eq!(entry.kind, MessageKind::Entry);
        assert_eq!(
            serde_json::to_value(&entry).unwrap()["kind"],
            serde_json::json!("entry")
        );
        let bad = r#"{"requestId":"00000000-0000-0000-0000-000000000000","activityId":7,
            "userId":"a","quantity":1,"reservedAtMs":1,"kind":"gift"}"#;
        assert!(serde_json::from_str::<OrderMessage>(bad).is_err());
    }
}
