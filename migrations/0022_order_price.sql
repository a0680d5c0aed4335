-- Each order carries the price it was bought at: the sale's price per unit and its currency,
-- written with the order's row by the statement that confirms it (the consumer's insert, single
-- or batched, and the drawer's chunk). A sale's price is fixed from 10 s before it starts, so
-- this is the price every buyer saw when they pressed buy; the payment is started from it, not
-- from the sale's row. A `failed` row never pays and has none.
alter table orders
    add column unit_price_minor bigint check (unit_price_minor between 0 and 99999999),
    add column currency         text   check (currency ~ '^[a-z]{3}$');

-- Orders from before the price was stored: the sale's price, which could not change after
-- they were made. `orders` forces its row-level security on its owner, the migrating user
-- (0017), who passes no policy: lifted for this one statement, inside this migration's
-- transaction (the table is locked by the `alter` above until it commits), so the backfill
-- sees every row.
alter table orders no force row level security;
update orders o set unit_price_minor = a.price_minor, currency = a.currency
  from activities a
 where a.id = o.activity_id and o.status <> 'failed';
alter table orders force row level security;

alter table orders add constraint orders_priced
    check (status = 'failed' or (unit_price_minor is not null and currency is not null));

grant insert (unit_price_minor, currency) on orders to seckill_consumer, seckill_reconcile;
