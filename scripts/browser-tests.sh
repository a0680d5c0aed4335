#!/usr/bin/env bash
# The storefront and operator pages in a real browser (`make test-browser`): pytest +
# Playwright (tests/browser/) driving Debian's headless Chromium against a dev server.
#
# Installs what it needs (scripts/stack.sh up, then `stack.sh browser`: chromium from apt,
# pinned playwright + pytest in .tools/venv), builds the debug dev server, and starts it on a
# free loopback port against the local stack with a fresh database, Redis key prefix and
# queue (as scripts/schemathesis.sh does), so nothing of `make serve`'s data is touched. The
# tests create their sales through the admin API and sign in through POST /dev/token.
#
# A second dev server takes payments with the `stripe` provider against localstripe (the fake
# of Stripe's API that scripts/stack.sh runs on 127.0.0.1:8420), with a database, key prefix,
# queue and PAYMENT_STACK of its own: the storefront loads localstripe's Stripe.js mock, and a
# webhook registered at localstripe under this run's name (payment_intent.succeeded only)
# brings that server the events localstripe signs. localstripe's webhooks are one list for
# every client and it cannot delete one: at the end this run's is registered again with no
# event, so it sends nothing more (the entry stays in localstripe's memory until it restarts).
#
# Screenshots land in target/browser/*.png. The servers are always stopped, the databases
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
# The Stripe server's.
STRIPE_DB="${DB}_stripe"
STRIPE_LOG="$WORK/devserver-stripe.log"
LOCALSTRIPE="http://127.0.0.1:8420"
LOCALSTRIPE_KEY="sk_test_browser_$RUN_ID"
WEBHOOK_NAME="seckill-browser-$RUN_ID"
WEBHOOK_SECRET="whsec_browser_$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"

log() { printf '[browser] %s\n' "$*" >&2; }
die() { printf '[browser] ERROR: %s\n' "$*" >&2; exit 1; }
psql_pg() { psql -w -X -q -h 127.0.0.1 -p 5432 -U postgres -v ON_ERROR_STOP=1 "$@"; }

bash scripts/stack.sh up >/dev/null
bash scripts/stack.sh browser >/dev/null
mkdir -p "$WORK"
rm -f "$WORK"/*.png

# shellcheck source=scripts/devserver-lib.sh
source scripts/devserver-lib.sh
sqs() { run_queue "$1" "browser-$RUN_ID${2:-}" "$AWS_ENDPOINT_URL_SQS"; }

# webhook URL EVENTS: (re-)registers this run's webhook at localstripe, for EVENTS (a JSON list).
webhook() {
    curl -sf -o /dev/null --max-time 5 -H 'content-type: application/json' \
        -d "{\"url\": \"$1\", \"secret\": \"$WEBHOOK_SECRET\", \"events\": $2}" \
        "$LOCALSTRIPE/_config/webhooks/$WEBHOOK_NAME"
}

LOCAL_PID=""
STRIPE_URL=""
cleanup() {
    local rc=$?
    [ -z "$STRIPE_URL" ] || webhook "$STRIPE_URL/payments/webhook" '[]' || true
    stop_devserver "$LOCAL_PID"
    stop_devserver
    for db in "$DB" "$STRIPE_DB"; do
        psql_pg -c "drop database if exists \"$db\" with (force)" >/dev/null 2>&1 || true
    done
    sqs delete >/dev/null 2>&1 || true
    sqs delete -stripe >/dev/null 2>&1 || true
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
BIN="${CARGO_TARGET_DIR:-target}/debug/seckill-devserver"
RUST_LOG="${RUST_LOG:-warn}" start_devserver "$BIN" "$LOG" \
    --pollers 2 --poll-wait-secs 1 --preheat-every 1 --reconcile-every 2
LOCAL_PID="$SERVER_PID"
LOCAL_URL="$URL"
log "dev server on $URL (database $DB, log $LOG)"

psql_pg -c "create database \"$STRIPE_DB\"" >/dev/null
STRIPE_QUEUE_URL="$(sqs create -stripe)"
DATABASE_URL="postgres://postgres@127.0.0.1:5432/$STRIPE_DB" SECKILL_KEY_PREFIX="$SECKILL_KEY_PREFIX-stripe" \
    ORDER_QUEUE_URL="$STRIPE_QUEUE_URL" ORDER_DLQ_URL="$STRIPE_QUEUE_URL-dlq" \
    ENTRY_QUEUE_URL="$STRIPE_QUEUE_URL-entries" \
    PAYMENT_PROVIDER=stripe PAYMENT_API_BASE="$LOCALSTRIPE" PAYMENT_API_KEY="$LOCALSTRIPE_KEY" \
    PAYMENT_PUBLISHABLE_KEY="pk_test_browser_$RUN_ID" PAYMENT_JS_URL="$LOCALSTRIPE/js.stripe.com/v3/" \
    PAYMENT_WEBHOOK_SECRET="$WEBHOOK_SECRET" PAYMENT_STACK="browser-$RUN_ID" \
    RUST_LOG="${RUST_LOG:-warn}" start_devserver "$BIN" "$STRIPE_LOG" \
    --pollers 2 --poll-wait-secs 1 --preheat-every 1 --reconcile-every 2
STRIPE_URL="$URL"
webhook "$STRIPE_URL/payments/webhook" '["payment_intent.succeeded"]' \
    || die "localstripe at $LOCALSTRIPE did not take the webhook $WEBHOOK_NAME"
log "stripe dev server on $STRIPE_URL (database $STRIPE_DB, log $STRIPE_LOG, webhook $WEBHOOK_NAME at $LOCALSTRIPE)"

started=$SECONDS
status=0
SECKILL_URL="$LOCAL_URL" SECKILL_STRIPE_URL="$STRIPE_URL" LOCALSTRIPE_URL="$LOCALSTRIPE" \
    LOCALSTRIPE_KEY="$LOCALSTRIPE_KEY" BROWSER_OUT="$WORK" CHROMIUM="${CHROMIUM:-/usr/bin/chromium}" \
    PYTHONDONTWRITEBYTECODE=1 \
    "$VENV/bin/python" -m pytest -c tests/browser/pytest.ini tests/browser "$@" || status=$?
log "browser suite: $((SECONDS - started)) s, screenshots in $WORK"
[ "$status" -eq 0 ] || log "failed (dev server logs: $LOG, $STRIPE_LOG)"
exit "$status"
