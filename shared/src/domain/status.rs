//! Every status, reason and state a row or an answer carries: one enum each, from the column
//! to the JSON answer. The database stores each as its text (a `check` constraint lists the
//! values); `text_enum!` gives an enum that text in one list, read and written through
//! `sqlx` and `serde` alike, so no caller compares or parses a string.

/// Declares an enum stored and sent as text: each variant with its text, `as_str`, `parse`,
/// `Display`, `serde` and `sqlx` (the column's type is `text`). The text is the variant's name
/// in snake case, which `serde` and the OpenAPI schema derive from the name; a test holds the
/// two together.
macro_rules! text_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident = $text:literal,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(
            Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize,
            serde::Deserialize,
            utoipa::ToSchema,
        )]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        impl $name {
            /// Every value, in the order declared.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The text the database and the wire carry.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }

            /// The value of `text`; `None` for any other text.
            pub fn parse(text: &str) -> Option<Self> {
                match text {
                    $($text => Some($name::$variant),)*
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl sqlx::Type<sqlx::Postgres> for $name {
            fn type_info() -> sqlx::postgres::PgTypeInfo {
                <&str as sqlx::Type<sqlx::Postgres>>::type_info()
            }

            fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
                <&str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
            }
        }

        impl sqlx::Encode<'_, sqlx::Postgres> for $name {
            fn encode_by_ref(
                &self,
                buf: &mut sqlx::postgres::PgArgumentBuffer,
            ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
                <&str as sqlx::Encode<sqlx::Postgres>>::encode(self.as_str(), buf)
            }
        }

        impl<'r> sqlx::Decode<'r, sqlx::Postgres> for $name {
            fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
                let text = <&str as sqlx::Decode<sqlx::Postgres>>::decode(value)?;
                $name::parse(text).ok_or_else(|| {
                    format!(concat!("not a ", stringify!($name), ": {:?}"), text).into()
                })
            }
        }
    };
}
pub(crate) use text_enum;

text_enum! {
    /// An order's life (`orders.status`): `confirmed` (written by the consumer, awaiting
    /// payment) → `paid`, or → `cancelled` (by its owner or by the payment timeout). `failed`
    /// records a request the database refused or a give-back claimed, so its redeliveries are
    /// recognised.
    pub enum OrderStatus {
        Confirmed = "confirmed",
        Paid = "paid",
        Cancelled = "cancelled",
        Failed = "failed",
    }
}

impl OrderStatus {
    /// A live order holds its units and its buyer's one order of the sale. The database's
    /// form of this predicate is the function `order_is_live(status)`.
    pub fn is_live(self) -> bool {
        matches!(self, OrderStatus::Confirmed | OrderStatus::Paid)
    }
}

text_enum! {
    /// Why a request ended `failed` (`orders.failure_reason`).
    pub enum FailureReason {
        /// The database's stock was lower than Redis believed.
        SoldOut = "sold_out",
        /// The user already holds another order of the sale.
        AlreadyPurchased = "already_purchased",
        /// The reservation was not in Redis any more when its message was processed (given
        /// back by reconcile after its grace period, or lost with Redis).
        ReservationExpired = "reservation_expired",
        /// The sale does not exist in the database.
        UnknownActivity = "unknown_activity",
        /// The order message could not be sent (the caller was told 503).
        SendFailed = "send_failed",
        /// The purchase script's answer did not arrive in time (the caller was told 503).
        Unavailable = "unavailable",
    }
}

text_enum! {
    /// A sale's state (`activities.state`): only a published sale is sold or shown.
    pub enum ActivityState {
        Draft = "draft",
        Published = "published",
        Closed = "closed",
    }
}

text_enum! {
    /// Where a buyer's purchase of one sale is, as `GET …/orders/me` and a purchase's 202
    /// tell it.
    pub enum BuyerStatus {
        /// Nothing of the caller's in this sale.
        None = "none",
        /// In a draw sale's pool, before its draw.
        Queued = "queued",
        /// Reserved in Redis; the order is being written.
        Pending = "pending",
        Confirmed = "confirmed",
        Paid = "paid",
        Cancelled = "cancelled",
        /// Refused or given back, with a reason.
        Failed = "failed",
        /// In a draw sale's pool, and the draw passed the entry over: final.
        NotDrawn = "not_drawn",
        /// In a draw sale's pool too late for its draw: the entry was answered `queued`, but
        /// reached the pool again (after Redis lost the sale) only once the draw had begun, so
        /// the draw could not look at it; counted in the public view's `lateEntries`. Final.
        EnteredLate = "entered_late",
    }
}

// By hand: every enum of the macro shares one derive list, and only this one has a default.
#[allow(clippy::derivable_impls)]
impl Default for BuyerStatus {
    fn default() -> Self {
        BuyerStatus::None
    }
}

impl From<OrderStatus> for BuyerStatus {
    fn from(status: OrderStatus) -> Self {
        match status {
            OrderStatus::Confirmed => BuyerStatus::Confirmed,
            OrderStatus::Paid => BuyerStatus::Paid,
            OrderStatus::Cancelled => BuyerStatus::Cancelled,
            OrderStatus::Failed => BuyerStatus::Failed,
        }
    }
}

text_enum! {
    /// A payment's state at the provider, as the database records it (`payments.status`).
    pub enum PaymentStatus {
        /// Started; the buyer has not paid (as far as any verified event says).
        RequiresPayment = "requires_payment",
        /// A verified event, or the provider asked before a release, said the money was
        /// received.
        Succeeded = "succeeded",
        /// Cancelled at the provider before its order was cancelled: it can never be paid.
        Cancelled = "cancelled",
    }
}

text_enum! {
    /// Where the money of a payment owed back stands (`payments.refund_state`; none while
    /// nothing is owed). docs/invariants.md, "Pay", Refunds.
    pub enum RefundState {
        /// Owed back: its order could no longer be paid when the money arrived.
        Due = "due",
        /// Claimed by a reconcile run for one attempt (`updated_at` is the claim's lease).
        Refunding = "refunding",
        /// Given back at the provider (its refund id recorded when the provider named it).
        Refunded = "refunded",
        /// Refused too many times: left to the operator.
        Failed = "failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_reads_back_from_its_text_and_nothing_else_does() {
        for s in OrderStatus::ALL {
            assert_eq!(OrderStatus::parse(s.as_str()), Some(*s));
            assert_eq!(serde_json::to_string(s).unwrap(), format!("\"{s}\""));
        }
        for r in FailureReason::ALL {
            assert_eq!(FailureReason::parse(r.as_str()), Some(*r));
        }
        for s in BuyerStatus::ALL {
            assert_eq!(BuyerStatus::parse(s.as_str()), Some(*s));
        }
        fn serde_says<T: serde::Serialize>(value: T) -> String {
            serde_json::to_value(value)
                .unwrap()
                .as_str()
                .unwrap()
                .to_string()
        }
        let texts = OrderStatus::ALL
            .iter()
            .map(|v| (serde_says(v), v.as_str()))
            .chain(
                FailureReason::ALL
                    .iter()
                    .map(|v| (serde_says(v), v.as_str())),
            )
            .chain(
                ActivityState::ALL
                    .iter()
                    .map(|v| (serde_says(v), v.as_str())),
            )
            .chain(BuyerStatus::ALL.iter().map(|v| (serde_says(v), v.as_str())))
            .chain(
                PaymentStatus::ALL
                    .iter()
                    .map(|v| (serde_says(v), v.as_str())),
            )
            .chain(RefundState::ALL.iter().map(|v| (serde_says(v), v.as_str())));
        for (serde, text) in texts {
            assert_eq!(serde, text);
        }
        assert_eq!(OrderStatus::parse("Confirmed"), None);
        assert_eq!(ActivityState::parse(""), None);
    }

    #[test]
    fn only_confirmed_and_paid_orders_are_live() {
        let live: Vec<_> = OrderStatus::ALL.iter().filter(|s| s.is_live()).collect();
        assert_eq!(live, [&OrderStatus::Confirmed, &OrderStatus::Paid]);
    }
}
