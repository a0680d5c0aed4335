-- An order is live while it holds its units and its buyer's one order of the sale: confirmed
-- or paid. This function is the one place that says so: every statement and the
-- one-live-order-per-user index ask it. It is SQL and immutable, so the planner inlines it,
-- and a query's `order_is_live(status)` matches the index's predicate.
create function order_is_live(status text) returns boolean
    language sql immutable parallel safe
    as $$ select status in ('confirmed', 'paid') $$;

-- The one-live-order-per-user index, its predicate now the function's (same name: the
-- consumer tells a second order by it).
create unique index orders_one_per_user_live on orders (activity_id, user_id)
    where order_is_live(status);
drop index orders_one_per_user;
alter index orders_one_per_user_live rename to orders_one_per_user;
