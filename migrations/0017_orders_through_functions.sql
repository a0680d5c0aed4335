-- Row-level security on `orders` holds for its owner too, and the entry function changes an
-- order's row only through database functions: the cancel (0010), and now the provider's
-- payment, whose webhook locks the order and marks it paid.
--
-- Why: for `select ... for update`, PostgreSQL applies a table's UPDATE policies' USING
-- clause too, and a row lock needs an UPDATE grant. The entry's only UPDATE policy allowed
-- `confirmed` rows, so the webhook locked no row of an order that was cancelled or paid:
-- every delivery of a payment that came after its order's cancel (or a second event of a paid
-- order) failed, and no refund was ever recorded. Locking and paying through functions that
-- decide nothing else, and no UPDATE of `orders` at all for the entry, leaves its role exactly
-- what its path needs.

-- The owner of the functions: it logs in never; the functions run as it (SECURITY DEFINER),
-- under its own grants and its own policy, so forcing row-level security on the table's owner
-- (below) leaves them working while any other path of the owner is caught. Roles are
-- cluster-wide (see 0006 for why CREATE ROLE is guarded).
do $$
begin
    create role seckill_definer nologin nosuperuser nocreatedb nocreaterole noinherit
        noreplication nobypassrls;
exception
    when duplicate_object or unique_violation then
        null;
end
$$;
-- The migrating user hands the functions over (ALTER ... OWNER needs the role's membership);
-- a concurrent migration may be granting the same.
do $$
begin
    execute format('grant seckill_definer to %I', current_user);
exception
    when unique_violation or internal_error then
        null;
end
$$;
grant usage on schema public to seckill_definer;
grant select on activities, orders, payments to seckill_definer;
grant update (remaining_stock, updated_at) on activities to seckill_definer;
grant update (status, paid_at, cancelled_at, cancel_id, updated_at) on orders to seckill_definer;
create policy orders_definer on orders to seckill_definer using (true) with check (true);

-- A function's new owner needs CREATE on its schema (unless a superuser hands it over, which
-- the master user of a managed database is not): lent for the hand-overs below, and taken back.
grant create on schema public to seckill_definer;
alter function cancel_confirmed_order(bigint, uuid, bigint, timestamptz) owner to seckill_definer;

-- The order a provider's event decides, locked until the event's transaction ends: a cancel or
-- the payment timeout's release of the same order waits, and whichever commits first wins.
create function lock_order_for_payment(p_order_id bigint) returns setof orders
language sql
security definer
set search_path = public, pg_temp
as $$ select * from orders where id = p_order_id for update $$;

-- An order paid by the provider's verified event: `confirmed` -> `paid`, only while the order
-- has this started payment (its provider's id, not yet succeeded). Answers whether it paid.
create function pay_confirmed_order(p_order_id bigint, p_provider text, p_payment_id text,
                                    p_now timestamptz)
returns boolean
language plpgsql
security definer
set search_path = public, pg_temp
as $$
begin
    update orders set status = 'paid', paid_at = p_now, updated_at = p_now
     where id = p_order_id and status = 'confirmed'
       and exists (select 1 from payments
                    where order_id = p_order_id and provider = p_provider
                      and provider_payment_id = p_payment_id and status = 'requires_payment');
    return found;
end
$$;

alter function lock_order_for_payment(bigint) owner to seckill_definer;
alter function pay_confirmed_order(bigint, text, text, timestamptz) owner to seckill_definer;
revoke create on schema public from seckill_definer;
revoke execute on function lock_order_for_payment(bigint) from public;
revoke execute on function pay_confirmed_order(bigint, text, text, timestamptz) from public;
grant execute on function lock_order_for_payment(bigint) to seckill_entry;
grant execute on function pay_confirmed_order(bigint, text, text, timestamptz) to seckill_entry;

-- The entry writes no order row itself but its `failed` claims.
drop policy orders_entry_settles_confirmed on orders;
revoke update (status, paid_at, cancelled_at, cancel_id, updated_at) on orders from seckill_entry;

-- A draw's outcome is recorded by reconcile alone (the entry only steps a draw in Redis).
revoke insert on draw_outcomes, draw_winners from seckill_entry;

alter table orders force row level security;

-- The migrating user lets the role go again: a member would pass the role's policy on `orders`
-- (`using (true)`), and forcing the table's security on its owner would guard nothing. A later
-- migration that replaces one of the functions takes the membership for the hand-over, as
-- above, and gives it back.
do $$
begin
    execute format('revoke seckill_definer from %I', current_user);
exception
    when unique_violation or internal_error then
        null;
end
$$;
