-- Least-privilege login roles, one per function, so that a function's credentials can do no
-- more than its own statements need (the migrate function keeps the master user).
--
-- Roles are cluster-wide but this migration runs once per database, and the tests migrate many
-- databases at once: CREATE ROLE is skipped when the role exists (duplicate_object) or when a
-- concurrent migration is creating it (unique_violation on pg_authid). The GRANTs are per
-- database and run every time. No password is set here: `seckill-migrate` sets each role's
-- from its Secrets Manager secret (DATABASE_ROLE_SECRET_ARNS); locally trust auth needs none.
--
-- What each role may do is what its function's SQL (all of it in shared/src) reads and writes:
-- SELECT is granted on whole tables (a column a later migration adds is readable with no new
-- grant), INSERT and UPDATE only on the columns the statements write. Identity columns need
-- no grant on their sequences: PostgreSQL takes the next value without a privilege check.
-- Foreign keys are checked with the referenced table owner's rights.
do $$
declare
    role_name text;
begin
    foreach role_name in array array['seckill_entry', 'seckill_consumer', 'seckill_preheat',
                                     'seckill_reconcile', 'seckill_admin']
    loop
        begin
            execute format('create role %I login nosuperuser nocreatedb nocreaterole '
                           'noreplication nobypassrls', role_name);
        exception
            when duplicate_object or unique_violation then
                null;
        end;
    end loop;
end
$$;

-- No role but the owner creates anything: not in public (already so from PostgreSQL 15, and
-- revoked only where the migrating user would keep CREATE as the schema's owner), and no
-- temporary tables (which would also pin a session to one RDS Proxy connection).
do $$
begin
    if pg_has_role(current_user,
                   (select nspowner from pg_namespace where nspname = 'public'), 'usage') then
        revoke create on schema public from public;
    end if;
    execute format('revoke temporary on database %I from public', current_database());
end
$$;

grant usage on schema public
    to seckill_entry, seckill_consumer, seckill_preheat, seckill_reconcile, seckill_admin;

-- seckill-entry, internet-facing: reads sales and orders (the public view, a buyer's order,
-- the pay and cancel checks); writes a `failed` claim row after a failed send or an unanswered
-- script (giveback::claim), a pay, a cancel (the order row, and its units back to the sale's
-- remaining stock). Row-level security below keeps its inserts to `failed` rows and its
-- updates to confirmed orders becoming paid or cancelled.
grant select on activities, orders to seckill_entry;
grant update (remaining_stock, updated_at) on activities to seckill_entry;
grant insert (request_id, activity_id, user_id, quantity, status, failure_reason)
    on orders to seckill_entry;
grant update (status, paid_at, cancelled_at, cancel_id, updated_at) on orders to seckill_entry;

-- order-consumer: the order insert (single and batched) or the `failed` row of a refusal, the
-- conditional stock decrement, the load epoch check, reads of a request's row.
grant select on activities, orders to seckill_consumer;
grant update (remaining_stock, updated_at) on activities to seckill_consumer;
grant insert (request_id, activity_id, user_id, quantity, status, failure_reason)
    on orders to seckill_consumer;

-- preheat: the sales due, the fencing token and load epoch it records under the lock
-- (load::fence_and_read), and the live orders' holders it rebuilds a lost sale's users from.
grant select on activities to seckill_preheat;
grant update (last_fence_token, load_epoch) on activities to seckill_preheat;
grant select (activity_id, user_id, request_id, status) on orders to seckill_preheat;

-- reconcile: everything preheat does (it reloads lost sales), the stock check and repair
-- (select ... for update, set remaining_stock), the payment timeout's cancel, aborting stale
-- cancel attempts, `failed` claims of orphaned reservations, and its stats row per sale.
grant select on activities, orders to seckill_reconcile;
grant update (remaining_stock, updated_at, last_fence_token, load_epoch)
    on activities to seckill_reconcile;
grant insert (request_id, activity_id, user_id, quantity, status, failure_reason)
    on orders to seckill_reconcile;
grant update (status, cancelled_at, cancel_id, updated_at, aborted_cancel_ids)
    on orders to seckill_reconcile;
grant select, insert, update on activity_stats to seckill_reconcile;

-- admin: creates and changes sales (every column of its own rows, so whole-table INSERT and
-- UPDATE), records its fencing token, and reads the orders it checks a change against (any
-- order of the sale, the sold quantity, the live holders of a reload).
grant select, insert, update on activities to seckill_admin;
grant select (activity_id, user_id, request_id, status, quantity) on orders to seckill_admin;

-- Which order rows the entry may write. The other roles are bounded by their grants alone
-- (one permissive policy each); the table's owner, which migrates, is not subject to these.
alter table orders enable row level security;
create policy orders_by_grant on orders
    to seckill_consumer, seckill_preheat, seckill_reconcile, seckill_admin
    using (true) with check (true);
create policy orders_entry_reads on orders for select to seckill_entry using (true);
create policy orders_entry_claims_failed on orders for insert to seckill_entry
    with check (status = 'failed');
create policy orders_entry_settles_confirmed on orders for update to seckill_entry
    using (status = 'confirmed') with check (status in ('paid', 'cancelled'));
