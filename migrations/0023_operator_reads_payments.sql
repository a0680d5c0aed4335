-- The operator page (`GET /admin/ops`, the admin function) lists the payments that need a
-- human: refunds that failed for good, refunds owed for longer than a few minutes, disputes;
-- and counts them, with the refunds made in the last day. Every read is bounded by one of the
-- partial indexes below (a flash sale can leave a million payments, nearly all of them none of
-- these).
--
-- The admin reads only the columns it shows, and no more of `payments` than that: the
-- whole-table read of 0009 goes. It reads the order's id to name the sale a payment is for
-- (`orders` keeps its row-level security: the admin's policy there is its grants). `payments`
-- has no row-level security. The admin writes nothing of either table.
revoke select on payments from seckill_admin;
grant select (order_id, provider_payment_id, amount_minor, currency, refund_state, refund_id,
              refund_attempts, refund_error, disputed_at, updated_at)
    on payments to seckill_admin;
grant select (id) on orders to seckill_admin;
-- Nor the provider's events, which it never reads.
revoke select on payment_events from seckill_admin;

-- Failed refunds newest first (`updated_at` is the last attempt's claim): the same rows as
-- 0021's index, keyed by time, so the newest few are read without the rest.
drop index payments_refunds_failed;
create index payments_refunds_failed on payments (updated_at) where refund_state = 'failed';
-- Refunds claimed by a run (few: a run's batch, and those refused waiting for their next
-- attempt), counted apart from the many a backlog can leave `due` in 0021's open index.
create index payments_refunds_claimed on payments (updated_at) where refund_state = 'refunding';
-- Disputes, newest event first (each dispute event sets `updated_at`).
create index payments_disputed on payments (updated_at) where disputed_at is not null;
-- Refunds made, by when they were recorded, for the count of the last day.
create index payments_refunded on payments (updated_at) where refund_state = 'refunded';
