-- Server-side bounds for each function's login role, applied by the server at the start of
-- every session of the role (no client SET, so RDS Proxy can still share its connections):
--
-- - statement_timeout: the server cancels a statement running longer (SQLSTATE 57014). It is
--   what bounds a statement whose borrower gave up on it (a timeout around the call, a Lambda
--   killed mid-request): the pool's release check waits for the abandoned statement's answer
--   before the connection is lent again, so without this bound the slot is lost for as long as
--   the statement runs.
-- - idle_in_transaction_session_timeout: the server ends a session that sits inside an open
--   transaction longer than this (SQLSTATE 25P03): a client frozen or killed between two
--   statements of a transaction cannot keep its row locks (the sale's hot row among them).
--   Every transaction of these functions runs its statements back to back; the admin's also
--   calls Redis while it holds the sale's row, hence its longer bound.
-- - CONNECTION LIMIT: sessions the role may hold at once, the most its function's reserved
--   executions can open (reservation x DB_MAX_CONNECTIONS, template.yaml) plus 10 for
--   connections being replaced, a session the server has not yet seen end, an operator's
--   session and local test runs.
--
-- docs/capacity.md, "Time budgets" and "Database roles", derives each value;
-- scripts/check-template.py reads the rows below and checks them against the template.
--
-- Roles are cluster-wide: every database migrated on the server (the tests migrate many at
-- once) runs this against the same catalog rows, and two concurrent ALTER ROLEs of one role
-- fail with "tuple concurrently updated" (or a unique violation on the role's first setting).
-- So a role already as wanted is left alone, and a write that loses such a race is read again
-- (the winner wrote the same values), a few times before the error is let through.
do $$
declare
    wanted record;
    have_limit int;
    have_config text[];
    want_config text[];
begin
    for wanted in
        select * from (values
            -- role,              statement_timeout, idle_in_transaction_session_timeout, connection limit
            ('seckill_entry',     '500ms',           '1000ms',                            810),
            ('seckill_consumer',  '1000ms',          '2000ms',                            50),
            ('seckill_preheat',   '5000ms',          '5000ms',                            11),
            ('seckill_reconcile', '5000ms',          '5000ms',                            11),
            ('seckill_admin',     '5000ms',          '10000ms',                           12)
        ) as v(role_name, statement_timeout, idle_timeout, connection_limit)
    loop
        want_config := array['statement_timeout=' || wanted.statement_timeout,
                             'idle_in_transaction_session_timeout=' || wanted.idle_timeout];
        for attempt in 1..5 loop
            select rolconnlimit, coalesce(rolconfig, '{}') into have_limit, have_config
            from pg_roles where rolname = wanted.role_name;
            exit when have_limit = wanted.connection_limit and have_config @> want_config;
            begin
                execute format('alter role %I connection limit %s',
                               wanted.role_name, wanted.connection_limit);
                execute format('alter role %I set statement_timeout = %L',
                               wanted.role_name, wanted.statement_timeout);
                execute format('alter role %I set idle_in_transaction_session_timeout = %L',
                               wanted.role_name, wanted.idle_timeout);
            exception
                when internal_error or unique_violation then
                    if attempt = 5 then
                        raise;
                    end if;
                    perform pg_sleep(0.05 * attempt);
            end;
        end loop;
    end loop;
end
$$;
