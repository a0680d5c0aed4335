#!/usr/bin/env bash
# Drops the per-test databases (seckill_test_<uuid>) earlier test runs left behind.
# Each integration test creates its own database so tests can run in parallel; they are not
# dropped at the end of the test (a failing test's data is worth a look), but at the start of
# the next `make test`.
set -euo pipefail
psql_pg() { psql -w -X -q -h 127.0.0.1 -p 5432 -U postgres -v ON_ERROR_STOP=1 "$@"; }
dbs=$(psql_pg -tAc "select datname from pg_database where datname like 'seckill\_test\_%'")
count=0
for db in $dbs; do
    psql_pg -c "drop database if exists \"$db\" with (force)" >/dev/null
    count=$((count + 1))
done
echo "[test] dropped $count stale test database(s)"
