-- Where the payment timeout's release of unpaid orders stopped. Reconcile walks the orders
-- past their deadline in (created_at, id) order, one batch per run, from where the last run
-- stopped, and starts again from the oldest once it reached the end: an order it cannot
-- release yet (its sale being reloaded, another entry of its buyer in flight) is tried again
-- on the next lap and never holds back the orders behind it, whichever sale they belong to.
-- One row at most; no row is the walk's beginning.
create table release_cursor (
    only_row    boolean     primary key default true check (only_row),
    created_at  timestamptz not null,
    order_id    bigint      not null
);

grant select, insert, update on release_cursor to seckill_reconcile;

-- The walk's order: the unpaid orders by (created_at, id), replacing the index by created_at.
create index orders_unpaid_in_order on orders (created_at, id) where status = 'confirmed';
drop index orders_unpaid;
