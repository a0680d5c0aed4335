-- The cancel attempt that committed a cancellation. Each attempt announces itself in the Redis
-- ledger under its own id; only the attempt the row names may give the units back to Redis.
alter table orders add column cancel_id uuid;
-- Cancel attempts reconcile gave up on (their announcement was stale): they may not commit.
alter table orders add column aborted_cancel_ids uuid[] not null default '{}';
-- Bumped each time Redis loads the sale from scratch (new, or lost by Redis). Reservations and
-- cancels carry the epoch they were made under; their database commit requires it unchanged.
alter table activities add column load_epoch bigint not null default 0;
