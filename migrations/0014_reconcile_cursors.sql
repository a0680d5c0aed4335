-- Where reconcile's walks over a sale's largest collections stopped. Each run gives each due
-- sale a share of its time; a walk that runs out of it goes on from here next run, and starts
-- again from the beginning once it reached the end:
--   'users'   the HSCAN cursor of a bucket's `users` (the orphan check), per bucket;
--   'holders' the last user id of the live orders whose fields were checked (bucket 0).
-- A cursor is only a place to resume. A lost one makes the walk start over; one from before a
-- failover (the new primary hashes differently) may skip part of `users` for one lap, which the
-- next lap, from the beginning, covers: an orphan is dropped a lap later, nothing else.
create table reconcile_cursors (
    activity_id bigint  not null references activities (id),
    walk        text    not null check (walk in ('users', 'holders')),
    bucket      integer not null check (bucket >= 0),
    position    text    not null,
    primary key (activity_id, walk, bucket)
);

grant select, insert, update on reconcile_cursors to seckill_reconcile;

-- The order reconcile visits due sales in: the one checked longest ago first, so a sale that
-- takes a whole run never keeps the ones after it from their turn.
create index activity_stats_by_check on activity_stats (checked_at);
