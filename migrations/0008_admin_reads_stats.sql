-- The operator page (`GET /admin/ops`, the admin function) shows reconcile's latest check of
-- each sale: the admin role reads the stats reconcile writes.
grant select on activity_stats to seckill_admin;
