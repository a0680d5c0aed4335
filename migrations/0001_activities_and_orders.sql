-- The system of record. Redis decides purchases fast; these tables decide what is true.

create table activities (
    id                bigint generated always as identity primary key,
    title             text        not null check (length(title) between 1 and 200),
    total_stock       integer     not null check (total_stock > 0),
    -- total_stock minus confirmed/paid quantity; the consumer decrements it with
    -- "where remaining_stock >= quantity", so it can never go below zero.
    remaining_stock   integer     not null check (remaining_stock >= 0),
    per_order_limit   integer     not null check (per_order_limit >= 1),
    start_at          timestamptz not null,
    end_at            timestamptz not null,
    state             text        not null default 'published'
                                  check (state in ('draft', 'published', 'closed')),
    -- bumped by every admin change; Redis meta only accepts a newer version
    config_version    bigint      not null default 1,
    -- highest fencing token this row has accepted; writes need a strictly higher one
    last_fence_token  bigint      not null default 0,
    created_at        timestamptz not null default now(),
    updated_at        timestamptz not null default now(),
    check (start_at < end_at),
    check (remaining_stock <= total_stock)
);

create index activities_window on activities (start_at, end_at) where state = 'published';

create table orders (
    id              bigint generated always as identity primary key,
    -- the request id the entry function issued; redeliveries of its message hit this key
    request_id      uuid        not null unique,
    activity_id     bigint      not null references activities (id),
    user_id         text        not null,
    quantity        integer     not null check (quantity > 0),
    status          text        not null
                                check (status in ('confirmed', 'paid', 'cancelled', 'failed')),
    failure_reason  text,
    created_at      timestamptz not null default now(),
    updated_at      timestamptz not null default now(),
    paid_at         timestamptz,
    cancelled_at    timestamptz
);

-- One order per user per activity, the database's half of invariant 2. Cancelled and failed
-- requests do not count, so a user who cancelled may buy again.
create unique index orders_one_per_user on orders (activity_id, user_id)
    where status in ('confirmed', 'paid');
create index orders_unpaid on orders (created_at) where status = 'confirmed';
create index orders_by_activity on orders (activity_id, status);

-- What reconcile saw last, per activity (participants, sold, remaining, drift).
create table activity_stats (
    activity_id      bigint      primary key references activities (id),
    participants     bigint      not null,
    sold             bigint      not null,
    db_remaining     bigint      not null,
    redis_stock      bigint,
    pending_qty      bigint      not null,
    drift            bigint      not null,
    repairs          bigint      not null default 0,
    checked_at       timestamptz not null default now()
);
