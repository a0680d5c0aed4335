#!/usr/bin/env bash
# The storefront and operator pages in a real browser (`make test-browser`): pytest +
# Playwright (tests/browser/) driving Debian's headless Chromium against a dev server.
#
# Installs what it needs (scripts/stack.sh up, then `stack.sh browser`: chromium from apt,
# pinned playwright + pytest in .tools/venv), builds the debug dev server, and starts it on a
# free loopback port against the local stack with a fresh database, Redis key prefix and
# queue (as scripts/schemathesis.sh does), so nothing of `make serve`'s data is touched. The
# tests create their sales through the admin API and sign in through POST /dev/token.
# Screenshots land in target/browser/*.png. The server is always stopped, the database
# dropped and the queues deleted, also on failure or Ctrl-C.
#
# Usage: bash scripts/browser-tests.sh [PYTEST ARGS...]   e.g. -k draw, -x
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
# shellcheck source=scripts/env.sh
source scripts/env.sh

VENV="$REPO/.tools/venv"
RUN_ID="$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
DB="seckill_test_browser_$RUN_ID"
WORK="$REPO/target/browser"
LOG="$WORK/devserver.log"

log() { printf '[browser] %s\n' "$*" >&2; }
die() { printf '[browser] ERROR: %s\n' "$*" >&2; exit 1; }
psql_pg() { psql -w -X -q -h 127.0.0.1 -p 5432 -U postgres -v ON_ERROR_STOP=1 "$@"; }

bash scripts/stack.sh up >/dev/null
bash scripts/stack.sh browser >/dev/null
mkdir -p "$WORK"
rm -f "$WORK"/*.png

# shellcheck source=scripts/devserver-lib.sh
source scripts/devserver-lib.sh
sqs() { run_queue "$1" "browser-$RUN_ID" "$AWS_ENDPOINT_URL_SQS"; }

cleanup() {
    local rc=$?
    stop_devserver
    psql_pg -c "drop database if exists \"$DB\" with (force)" >/dev/null 2>&1 || true
    sqs delete >/dev/null 2>&1 || true
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "building the dev server"
cargo build -q -p seckill-devserver --bin seckill-devserver

psql_pg -c "create database \"$DB\"" >/dev/null
export DATABASE_URL="postgres://postgres@127.0.0.1:5432/$DB"
export SECKILL_KEY_PREFIX="seckill:browser$RUN_ID"
ORDER_QUEUE_URL="$(sqs create)"
export ORDER_QUEUE_URL ORDER_DLQ_URL="$ORDER_QUEUE_URL-dlq" ENTRY_QUEUE_URL="$ORDER_QUEUE_URL-entries"
# Reconcile every 2 s so the operator page has reconcile rows to show.
RUST_LOG="${RUST_LOG:-warn}" start_devserver "${CARGO_TARGET_DIR:-target}/debug/seckill-devserver" "$LOG" \
    --pollers 2 --poll-wait-secs 1 --preheat-every 1 --reconcile-every 2
log "dev server on $URL (database $DB, log $LOG)"

started=$SECONDS
status=0
SECKILL_URL="$URL" BROWSER_OUT="$WORK" CHROMIUM="${CHROMIUM:-/usr/bin/chromium}" PYTHONDONTWRITEBYTECODE=1 \
    "$VENV/bin/python" -m pytest -c tests/browser/pytest.ini tests/browser "$@" || status=$?
log "browser suite: $((SECONDS - started)) s, screenshots in $WORK"
[ "$status" -eq 0 ] || log "failed (dev server log: $LOG)"
exit "$status"
