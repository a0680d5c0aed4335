#!/usr/bin/env bash
# Drops the per-test databases (seckill_test_<uuid>) earlier test runs left behind.
# Each integration test creates its own database so tests can run in parallel; they are not
# dropped at the end of the test (a failing test's data is worth a look), but at the start of
# the next `make test`. Eight at a time: each DROP DATABASE waits for a checkpoint, and
# PostgreSQL serves concurrent requests for one with one (one at a time, 770 took 71 s).
set -euo pipefail
psql_pg() { psql -w -X -q -h 127.0.0.1 -p 5432 -U postgres -v ON_ERROR_STOP=1 "$@"; }
dbs=$(psql_pg -tAc "select datname from pg_database where datname like 'seckill\_test\_%'")
if [ -z "$dbs" ]; then
    echo "[test] no stale test database"
    exit 0
fi
count=$(printf '%s\n' "$dbs" | wc -l)
printf '%s\n' "$dbs" | xargs -P 8 -I{} \
    psql -w -X -q -h 127.0.0.1 -p 5432 -U postgres -v ON_ERROR_STOP=1 \
    -c 'drop database if exists "{}" with (force)' >/dev/null
echo "[test] dropped $count stale test database(s)"
