-- The consumer's batch path in one statement: a group of one sale's orders confirmed and
-- their units taken from the sale's stock, in the statement's own transaction. One round trip
-- instead of four (BEGIN, the insert, the stock update, COMMIT), and no client turn while the
-- sale's hot row is locked: from the stock update to the commit's WAL flush, which every
-- other group of the sale waits for (docs/invariants.md, "Consumer: an order message").
--
-- The orders are inserted `confirmed` at the sale's price, skipping request ids that already
-- have a row (a claim or an earlier delivery decided them); then the units of the rows it
-- inserted are taken exactly as the single order's update takes them (activity::take_stock):
-- only while the sale has them all and its load epoch is still `p_epoch` (null: messages that
-- carry none). Answers the request ids it inserted; none when every one had a row, or when the
-- sale does not exist (nothing written either way).
--
-- Raises, and the whole group rolls back with the statement, when the stock is short or the
-- epoch moved (SQLSTATE SK002), on a second live order of a user (`orders_one_per_user`), and
-- on arrays of unequal lengths or longer than one SQS event carries (10 000 records at most):
-- the caller decides each message on its own then.
--
-- SECURITY INVOKER: the function runs as the consumer's own role, under that role's grants
-- and policy on `orders` and `activities` (0006, 0022), and only that role may call it.
create function confirm_orders(p_activity_id bigint, p_epoch bigint, p_request_ids uuid[],
                               p_user_ids text[], p_quantities bigint[])
returns setof uuid
language plpgsql
set search_path = public, pg_temp
as $$
declare
    inserted uuid[];
    units bigint;
begin
    if cardinality(p_request_ids) > 10000
       or cardinality(p_user_ids) <> cardinality(p_request_ids)
       or cardinality(p_quantities) <> cardinality(p_request_ids) then
        raise exception 'not one batch: % request ids, % users, % quantities',
            cardinality(p_request_ids), cardinality(p_user_ids), cardinality(p_quantities)
            using errcode = 'invalid_parameter_value';
    end if;
    with confirmed as (
        insert into orders (request_id, activity_id, user_id, quantity, status,
                            unit_price_minor, currency)
        select r, a.id, u, q, 'confirmed', a.price_minor, a.currency
          from unnest(p_request_ids, p_user_ids, p_quantities) with ordinality as t(r, u, q, n)
          join activities a on a.id = p_activity_id
         order by t.n
        on conflict (request_id) do nothing
        returning orders.request_id, orders.quantity
    )
    select array_agg(confirmed.request_id), sum(confirmed.quantity)
      into inserted, units
      from confirmed;
    if inserted is null then
        return;
    end if;
    update activities set remaining_stock = remaining_stock - units, updated_at = now()
     where id = p_activity_id and remaining_stock >= units
       and (p_epoch is null or load_epoch = p_epoch);
    if not found then
        raise exception 'sale % cannot take % units under load epoch %',
            p_activity_id, units, p_epoch
            using errcode = 'SK002';
    end if;
    return query select unnest(inserted);
end
$$;

revoke execute on function confirm_orders(bigint, bigint, uuid[], text[], bigint[]) from public;
grant execute on function confirm_orders(bigint, bigint, uuid[], text[], bigint[])
    to seckill_consumer;
