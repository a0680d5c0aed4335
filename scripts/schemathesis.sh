#!/usr/bin/env bash
# Fuzzes the HTTP API with schemathesis against docs/openapi.json (`make test` runs it).
#
# Starts a dev server (target/debug/seckill-devserver) on a free loopback port against the
# local stack, on a fresh database, Redis key prefix and queue, so nothing of `make serve`'s
# data is touched and nothing is left behind. Seeds one running, published sale and the user's
# confirmed order in it (both id 1 of the fresh database, so the generated ids reach real ones),
# then runs schemathesis once with a user token and once with an admin token:
#   checks  not_a_server_error, status_code_conformance, content_type_conformance,
#           response_schema_conformance
#   phases  coverage, fuzzing
# Any finding fails the script. The server is always stopped, the database dropped and the
# queues deleted, also on failure or Ctrl-C.
#
# Usage: bash scripts/schemathesis.sh   (after `make stack`; builds the dev server if needed)
#   SCHEMATHESIS_MAX_EXAMPLES=N   fuzzing examples per operation (default 100: ≈1,100 requests
#                                 and 20-30 s per token on a 2-core machine)
#   SCHEMATHESIS_SEED=N           a fixed seed, to replay a run (default: random, printed)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
# shellcheck source=scripts/env.sh
source scripts/env.sh

VENV="$REPO/.tools/venv"
ST="$VENV/bin/schemathesis"
MAX_EXAMPLES="${SCHEMATHESIS_MAX_EXAMPLES:-100}"
SEED="${SCHEMATHESIS_SEED:-$RANDOM$RANDOM}"
RUN_ID="$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
DB="seckill_test_fuzz_$RUN_ID"
WORK="$REPO/target/schemathesis"
LOG="$WORK/devserver.log"

log() { printf '[schemathesis] %s\n' "$*" >&2; }
die() { printf '[schemathesis] ERROR: %s\n' "$*" >&2; exit 1; }
psql_pg() { psql -w -X -q -h 127.0.0.1 -p 5432 -U postgres -v ON_ERROR_STOP=1 "$@"; }

[ -x "$ST" ] || die "$ST not found: run 'make stack' (scripts/stack.sh installs it)"
mkdir -p "$WORK"

# shellcheck source=scripts/devserver-lib.sh
source scripts/devserver-lib.sh
# The SQS emulator's queues for this run (moto).
sqs() { run_queue "$1" "fuzz-$RUN_ID" "$AWS_ENDPOINT_URL_SQS"; }

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
cargo build -q -p seckill-devserver --bins

psql_pg -c "create database \"$DB\"" >/dev/null
export DATABASE_URL="postgres://postgres@127.0.0.1:5432/$DB"
export SECKILL_KEY_PREFIX="seckill:fuzz$RUN_ID"
ORDER_QUEUE_URL="$(sqs create)"
export ORDER_QUEUE_URL ORDER_DLQ_URL="$ORDER_QUEUE_URL-dlq" ENTRY_QUEUE_URL="$ORDER_QUEUE_URL-entries"
# One token fuzzes every route as fast as it can: the per-user database rate would answer most
# of it 429 (documented, so conformant) and leave the routes' own answers unexplored.
export USER_DB_RATE_PER_SEC=0
RUST_LOG="${RUST_LOG:-warn}" start_devserver "${CARGO_TARGET_DIR:-target}/debug/seckill-devserver" "$LOG" \
    --pollers 2 --preheat-every 2 --reconcile-every 5
log "dev server on $URL (database $DB, log $LOG)"

USER_TOKEN="$("${CARGO_TARGET_DIR:-target}"/debug/seckill-token --user fuzz-user --ttl-secs 3600)"
ADMIN_TOKEN="$("${CARGO_TARGET_DIR:-target}"/debug/seckill-token --user fuzz-admin --admin --ttl-secs 3600)"

# A sale running now: created through the API, loaded into Redis by the create itself.
start="$(date -u -d '-1 minute' +%Y-%m-%dT%H:%M:%SZ)"
end="$(date -u -d '+2 hours' +%Y-%m-%dT%H:%M:%SZ)"
seeded="$(curl -sf --max-time 10 -X POST "$URL/admin/activities" \
    -H "Authorization: Bearer $ADMIN_TOKEN" -H 'Content-Type: application/json' \
    -d "{\"title\":\"fuzzed sale\",\"totalStock\":100000,\"perOrderLimit\":5,\"priceMinor\":1999,\"currency\":\"usd\",\"startAt\":\"$start\",\"endAt\":\"$end\"}")" \
    || die "could not seed the sale"
case "$seeded" in *'"id":1,'*) ;; *) die "the seeded sale is not id 1: $seeded" ;; esac
# And the user's order in it, confirmed by the dev server's poller: order 1, for pay and cancel.
curl -sf -o /dev/null --max-time 10 -X POST "$URL/activities/1/orders" \
    -H "Authorization: Bearer $USER_TOKEN" -H 'Content-Type: application/json' -d '{"quantity":1}' \
    || die "could not seed the order"
for _ in $(seq 1 60); do
    mine="$(curl -sf --max-time 5 "$URL/activities/1/orders/me" -H "Authorization: Bearer $USER_TOKEN" || true)"
    case "$mine" in *'"status":"confirmed"'*) break ;; esac
    sleep 0.5
done
case "$mine" in *'"orderId":1,'*) ;; *) die "the seeded order is not confirmed as order 1: $mine" ;; esac
log "seeded sale 1 (running until $end) and the user's confirmed order 1"

fuzz() {
    local who="$1" token="$2"
    log "$who token: coverage + fuzzing, --max-examples $MAX_EXAMPLES, --seed $SEED"
    # From target/schemathesis: its cache of past crashes (.schemathesis/) stays out of the tree.
    # One worker: with two, hypothesis's lambda descriptions call ast.parse from two threads at
    # once, and this machine's CPython 3.11.7 then fails the run with "SystemError: AST
    # constructor recursion depth mismatch" (a thread race in its ast module, not a finding).
    (cd "$WORK" && "$ST" run "$REPO/docs/openapi.json" --url "$URL" \
        -H "Authorization: Bearer $token" \
        --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
        --phases coverage,fuzzing \
        --max-examples "$MAX_EXAMPLES" --seed "$SEED" \
        --workers 1 --request-timeout 15 \
        --report junit --report-junit-path "$WORK/$who.junit.xml")
}

status=0
fuzz user "$USER_TOKEN" || status=1
fuzz admin "$ADMIN_TOKEN" || status=1
if [ "$status" -ne 0 ]; then
    log "findings above (dev server log: $LOG); replay with SCHEMATHESIS_SEED=$SEED"
    exit 1
fi
log "no findings with either token"
