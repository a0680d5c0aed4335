-- A cancel's database step through one narrow function: the order `confirmed` → `cancelled`
-- (unless this cancel attempt was aborted) and its units back to the sale's remaining stock,
-- in one statement's transaction, only while the sale's load epoch is still the one the
-- attempt saw. The entry role loses its own grant on `remaining_stock`: an internet-facing
-- function can give a sale units back only by cancelling one of its confirmed orders.
--
-- Answers one row: `cancelled` with the quantity, `not_confirmed` (not confirmed any more, or
-- this attempt was aborted: nothing changed), or `epoch_moved` (the sale was reloaded since
-- the attempt announced itself: nothing changed, the order stays confirmed).
create function cancel_confirmed_order(p_order_id bigint, p_cancel_id uuid, p_epoch bigint,
                                       p_now timestamptz)
returns table (outcome text, quantity integer)
language plpgsql
security definer
set search_path = public, pg_temp
as $$
declare
    q integer;
    sale bigint;
begin
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

revoke execute on function cancel_confirmed_order(bigint, uuid, bigint, timestamptz) from public;
grant execute on function cancel_confirmed_order(bigint, uuid, bigint, timestamptz)
    to seckill_entry, seckill_reconcile;
revoke update (remaining_stock, updated_at) on activities from seckill_entry;
