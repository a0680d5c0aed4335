-- The cancel attempt that committed a cancellation. Each attempt announces itself in the Redis
-- ledger under its own id; only the attempt the row names may give the units back to Redis.
alter table orders add column cancel_id uuid;
