-- A draw sale's entries and its outcome, kept by the database so that the loss of the sale's
-- Redis keys loses neither (docs/invariants.md, "Draw admission", "What the database keeps").
--
-- Every entry Redis put in a pool and the entry answered 202 `queued` is also sent to the
-- order queue; the consumer writes it here (once per request id) and a load from scratch
-- rebuilds the pool from these rows, in id order and in bounded chunks.
create table draw_entries (
    id bigint generated always as identity primary key,
    activity_id bigint not null references activities (id),
    user_id text not null,
    request_id uuid not null unique,
    quantity bigint not null check (quantity > 0),
    created_at timestamptz not null default now()
);
create index draw_entries_by_sale on draw_entries (activity_id, id);
-- A user's entries in a sale: one who entered again after a 503 (or after Redis lost the
-- sale, before her entry was put back) has several; only her newest live one goes back.
create index draw_entries_by_user on draw_entries (activity_id, user_id);

-- The draw's outcome, written before the first winner's order message is sent: the last
-- ticket it looked at, and each winner. A sale that has one is never drawn again; a load
-- from scratch marks it drawn and puts the winners without an order back in Redis, their
-- units held.
create table draw_outcomes (
    activity_id bigint primary key references activities (id),
    cutoff text not null,
    winners bigint not null,
    units bigint not null,
    drawn_at timestamptz not null default now()
);
create table draw_winners (
    request_id uuid primary key,
    activity_id bigint not null references activities (id),
    user_id text not null,
    quantity bigint not null check (quantity > 0)
);
create index draw_winners_by_sale on draw_winners (activity_id);

grant select on draw_entries to seckill_entry, seckill_preheat, seckill_reconcile, seckill_admin;
grant select, insert on draw_entries to seckill_consumer;
grant select on draw_outcomes, draw_winners to seckill_consumer, seckill_preheat, seckill_admin;
grant select, insert on draw_outcomes, draw_winners to seckill_entry, seckill_reconcile;
