-- A draw sale's tickets come from a secret of its own: an entrant's ticket is
-- HMAC-SHA1(secret, user id), so a retry gets the same ticket and no entry can improve its
-- odds. The secret is made with the row (32 bytes from PostgreSQL's strong random source, as
-- 64 hex digits), never changes, and is published only after the draw; the public view shows
-- its SHA-256 from the start, so the secret revealed after the draw is checkably the one the
-- tickets were made with. Every sale gets one; a first-come sale never uses it.
alter table activities
    add column draw_secret text not null
        default replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '')
        check (draw_secret ~ '^[0-9a-f]{64}$');

-- The purchases answered 503 of a sale, in id order: before a draw they leave its pool, a
-- bounded batch per run from where the last run stopped.
create index orders_unanswered on orders (activity_id, id)
    where status = 'failed' and failure_reason = 'unavailable';

-- The most entrants a draw sale's pool takes; past it a purchase in the window is refused
-- (409 `pool_full`) and nothing is written. It bounds the pool's Redis memory (about 250 B an
-- entrant, `make bench`).
alter table activities
    add column max_entrants bigint not null default 1000000
        check (max_entrants between 1 and 10000000);
