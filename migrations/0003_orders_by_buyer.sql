-- A buyer's orders in one sale, whatever their status: `GET .../orders/me` once the ledger entry
-- is gone (after the order settles, and for everyone who never bought), and the pay and cancel
-- paths. `orders_one_per_user` holds live orders only and `orders_by_activity` is keyed by
-- status, so without this index the lookup reads every order of the sale (a parallel sequential
-- scan, tens of milliseconds at a few hundred thousand orders, growing with cancel-and-rebuy).
create index orders_by_buyer on orders (activity_id, user_id);
