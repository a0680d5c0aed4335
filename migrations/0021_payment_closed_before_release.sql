-- A payment is closed at the provider before its order's unit comes back. An order with a
-- payment still open there (`requires_payment`) is not cancelled: its canceller (the owner, or
-- the payment timeout's release) first cancels the payment at the provider and records it
-- `cancelled` here, or, when the provider says it succeeded, pays the order instead. A payment
-- is opened only while its order is `confirmed`, under the order's row lock, so an open and a
-- cancel of one order are one after the other: the cancel sees the payment, or the open sees
-- the order cancelled.

alter table payments drop constraint payments_status_check;
alter table payments add constraint payments_status_check
    check (status in ('requires_payment', 'succeeded', 'cancelled'));

-- Money back, by the provider's refund API, exactly once per payment: a payment whose order
-- could no longer be paid is `due`; reconcile claims it (`refunding`, one attempt counted, a
-- lease of `updated_at`), asks the provider with an idempotency key per payment, and records
-- the provider's refund id (`refunded`); after too many refused attempts it is `failed`, for
-- the operator. A refund made at the provider (its `charge.refunded` event) is `refunded` too,
-- and a dispute opened there is flagged (`disputed_at`). Neither brings a unit back.
alter table payments
    add column refund_state    text check (refund_state in ('due', 'refunding', 'refunded',
                                                            'failed')),
    add column refund_id       text,
    add column refund_attempts integer not null default 0,
    add column refund_error    text,
    add column disputed_at     timestamptz;
create index payments_refunds_open on payments (updated_at)
    where refund_state in ('due', 'refunding');
create index payments_refunds_failed on payments (order_id) where refund_state = 'failed';
-- Payments owed back before refunds were automatic.
update payments p set refund_state = 'due'
  from payment_events e
 where e.provider_payment_id = p.provider_payment_id and e.outcome = 'refund_due'
   and e.refunded_at is null and p.refund_state is null;

-- The events that changed something: a refund or a dispute at the provider, and an event the
-- webhook answered 200 without acting on (its payment, order, amount or currency not ours:
-- recorded for the operator instead of refused, so the provider does not retry it for days).
alter table payment_events drop constraint payment_events_outcome_check;
alter table payment_events add constraint payment_events_outcome_check
    check (outcome in ('paid', 'already_paid', 'refund_due', 'refunded', 'disputed',
                       'mismatch'));

-- The migrating user hands the functions over to their owner (see 0017 for why); a concurrent
-- migration may be granting the same.
do $$
begin
    execute format('grant seckill_definer to %I', current_user);
exception
    when unique_violation or internal_error then
        null;
end
$$;
grant create on schema public to seckill_definer;
grant insert (order_id, provider, provider_payment_id, amount_minor, currency)
    on payments to seckill_definer;

-- The order's payment opened, unless it has one: only while the order is `confirmed`, under a
-- share lock of its row (a cancel's row lock waits for this transaction, and this waits for a
-- cancel's). Answers whether the order may be paid: false when it is not confirmed.
create function open_payment(p_order_id bigint, p_provider text, p_payment_id text,
                             p_amount_minor bigint, p_currency text)
returns boolean
language plpgsql
security definer
set search_path = public, pg_temp
as $$
begin
    perform 1 from orders where id = p_order_id and status = 'confirmed' for share;
    if not found then
        return false;
    end if;
    insert into payments (order_id, provider, provider_payment_id, amount_minor, currency)
    values (p_order_id, p_provider, p_payment_id, p_amount_minor, p_currency)
    on conflict (order_id) do nothing;
    return true;
end
$$;

-- The cancel of 0010, which now answers `payment_open` (nothing changed) while the order's
-- payment is open at the provider. The order's row is locked before the payment is read: a
-- payment opened before the lock is seen, and none can open after it.
create or replace function cancel_confirmed_order(p_order_id bigint, p_cancel_id uuid,
                                                  p_epoch bigint, p_now timestamptz)
returns table (outcome text, quantity integer)
language plpgsql
security definer
set search_path = public, pg_temp
as $$
declare
    q integer;
    sale bigint;
begin
    perform 1 from orders where id = p_order_id for update;
    if exists (select 1 from payments
                where order_id = p_order_id and status = 'requires_payment') then
        return query select 'payment_open'::text, 0;
        return;
    end if;
    update orders set status = 'cancelled', cancel_id = p_cancel_id, cancelled_at = p_now,
                      updated_at = p_now
     where id = p_order_id and status = 'confirmed'
       and not (p_cancel_id = any(aborted_cancel_ids))
    returning orders.quantity, orders.activity_id into q, sale;
    if not found then
        return query select 'not_confirmed'::text, 0;
        return;
    end if;
    update activities set remaining_stock = remaining_stock + q, updated_at = p_now
     where id = sale and (p_epoch is null or load_epoch = p_epoch);
    if not found then
        -- Caught below: the body's subtransaction rolls back, the order's update with it.
        raise exception 'epoch moved' using errcode = 'SK001';
    end if;
    return query select 'cancelled'::text, q;
exception when sqlstate 'SK001' then
    return query select 'epoch_moved'::text, 0;
end
$$;

alter function open_payment(bigint, text, text, bigint, text) owner to seckill_definer;
revoke create on schema public from seckill_definer;
revoke execute on function open_payment(bigint, text, text, bigint, text) from public;
grant execute on function open_payment(bigint, text, text, bigint, text) to seckill_entry;
-- The entry opens payments through the function alone.
revoke insert on payments from seckill_entry;

-- The webhook marks a payment owed back, refunded or disputed at the provider (a refund there
-- settles the events that owed it).
grant update (refund_state, refund_id, disputed_at) on payments to seckill_entry;
grant update (refunded_at) on payment_events to seckill_entry;

-- The payment timeout's release closes payments at the provider and records a cancelled one
-- (one the provider says succeeded waits for its event, which alone marks an order paid). Its
-- refunds claim, count and record each refund.
grant update (status, updated_at, refund_state, refund_id, refund_attempts, refund_error)
    on payments to seckill_reconcile;
grant update (refunded_at) on payment_events to seckill_reconcile;

do $$
begin
    execute format('revoke seckill_definer from %I', current_user);
exception
    when unique_violation or internal_error then
        null;
end
$$;
