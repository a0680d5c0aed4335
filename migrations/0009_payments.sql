-- Payment through a provider: a sale has a price, a confirmed order gets one payment at the
-- provider for exactly its amount, and only the provider's signed event marks it paid.
--
-- A sale's price per unit in the currency's minor units (cents). Sales from before prices
-- read 0, which cannot be paid until an admin sets one; a new sale states its own (no default).
alter table activities
    add column price_minor bigint not null default 0
        check (price_minor between 0 and 99999999),
    add column currency text not null default 'usd'
        check (currency ~ '^[a-z]{3}$');
alter table activities alter column price_minor drop default;
alter table activities alter column currency drop default;

-- One payment per order, started by its owner's `POST /orders/{id}/pay`: the amount and
-- currency are fixed here when it starts (the sale's price times the quantity), and the
-- provider's event must match them to the unit.
create table payments (
    order_id            bigint      primary key references orders (id),
    provider            text        not null,
    -- the provider's id of the payment (Stripe's PaymentIntent id, pi_...)
    provider_payment_id text        not null unique,
    amount_minor        bigint      not null check (amount_minor > 0),
    currency            text        not null check (currency ~ '^[a-z]{3}$'),
    status              text        not null default 'requires_payment'
                                    check (status in ('requires_payment', 'succeeded')),
    created_at          timestamptz not null default now(),
    updated_at          timestamptz not null default now()
);

-- Every provider event that changed or decided something, keyed by the provider's event id:
-- a redelivery finds its row and changes nothing. `refund_due` is a payment that arrived for
-- an order that can no longer be paid (released, cancelled, past the payment timeout): the
-- money goes back, never the unit.
create table payment_events (
    event_id            text        primary key,
    provider            text        not null,
    kind                text        not null,
    provider_payment_id text        not null,
    order_id            bigint      not null references orders (id),
    amount_minor        bigint      not null,
    currency            text        not null,
    outcome             text        not null
                                    check (outcome in ('paid', 'already_paid', 'refund_due')),
    received_at         timestamptz not null default now(),
    refunded_at         timestamptz
);
create index payment_events_refund_due on payment_events (received_at)
    where outcome = 'refund_due' and refunded_at is null;

-- seckill-entry starts payments and takes the provider's events.
grant select on payments, payment_events to seckill_entry;
grant insert (order_id, provider, provider_payment_id, amount_minor, currency)
    on payments to seckill_entry;
grant update (status, updated_at) on payments to seckill_entry;
grant insert (event_id, provider, kind, provider_payment_id, order_id, amount_minor, currency,
              outcome)
    on payment_events to seckill_entry;
-- reconcile's payment timeout reads whether a payment is under way; the admin sees refunds due.
grant select on payments, payment_events to seckill_reconcile, seckill_admin;
