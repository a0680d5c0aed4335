# shellcheck shell=bash
# Shared by the load checks scripts/wrk-check.sh and scripts/draw-check.sh: a run of the dev
# server (`make serve`'s binary, on fauxqs) under wrk, against a database, Redis key prefix and
# fauxqs queue of its own, all of it removed at the end (WRK_KEEP=1 keeps them, and the run's
# files, for a look). Source it from the checkout's root as
#
#   source scripts/loadcheck-lib.sh NAME        (NAME: wrk, draw)
#
# with REPO and PROFILE (the dev server's cargo profile) set. It names the run: RUN_ID, DB
# (seckill_NAME_<id>), PREFIX (seckill:NAME<id>: under the functions' Redis users' key
# pattern), QUEUE (NAME-<id>), WORK (target/NAME-check), LOG (the dev server's log in WORK) and
# FAUXQS, and defines
#
#   log, die              lines tagged [NAME-check] on stderr; die exits 1
#   psql_pg, psql_run     psql as postgres on the local server; psql_run on the run's database
#   sqs create|delete     the run's queue and its DLQ on fauxqs (create prints the queue URL)
#   prepare_run           starts the stack with fauxqs (scripts/stack.sh serve), installs wrk,
#                         sources scripts/env.sh and scripts/devserver-lib.sh, empties WORK, and
#                         sets the traps: on exit the server is stopped and the run removed (after
#                         the caller's before_cleanup, when it defines one)
#   start_run_devserver   builds the dev server and seckill-token (sets BIN), creates the run's
#                         database and queue, points the environment at them and at fauxqs, and
#                         starts the server (sets URL)
#   read_wrk_result       wrk's result line (scripts/wrk-accepted.lua's done()) from WORK/wrk.txt:
#                         sets line and rps (wrk's requests/s); dies when there is none
#   field NAME            a field of that line (s202, s5xx, timeouts, p99_ms, ...)
#   live_orders           the confirmed and paid orders of the sale ACTIVITY

LOADCHECK="$1"
RUN_ID="$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')"
DB="seckill_${LOADCHECK}_$RUN_ID"
PREFIX="seckill:$LOADCHECK$RUN_ID"
QUEUE="$LOADCHECK-$RUN_ID"
WORK="$REPO/target/$LOADCHECK-check"
LOG="$WORK/devserver.log"
FAUXQS="http://127.0.0.1:4567"

log() { printf '[%s-check] %s\n' "$LOADCHECK" "$*" >&2; }
die() { printf '[%s-check] ERROR: %s\n' "$LOADCHECK" "$*" >&2; exit 1; }
psql_pg() { psql -w -X -q -h 127.0.0.1 -p 5432 -U postgres -v ON_ERROR_STOP=1 "$@"; }
psql_run() { psql_pg -d "$DB" "$@"; }

# A queue of this run's own on fauxqs.
sqs() { run_queue "$1" "$QUEUE" "$FAUXQS"; }

prepare_run() {
    bash scripts/stack.sh serve
    bash scripts/stack.sh wrk
    # shellcheck source=scripts/env.sh
    source scripts/env.sh
    rm -rf "$WORK"
    mkdir -p "$WORK"
    # shellcheck source=scripts/devserver-lib.sh
    source scripts/devserver-lib.sh
    trap cleanup EXIT
    trap 'exit 130' INT TERM
}

cleanup() {
    local rc=$?
    if declare -F before_cleanup >/dev/null; then before_cleanup; fi
    stop_devserver
    if [ "${WRK_KEEP:-}" != 1 ]; then
        psql_pg -c "drop database if exists \"$DB\" with (force)" >/dev/null 2>&1 || true
        sqs delete >/dev/null 2>&1 || true
        redis-cli -u "$REDIS_URL" --scan --pattern "$PREFIX:*" 2>/dev/null \
            | xargs -r redis-cli -u "$REDIS_URL" del >/dev/null 2>&1 || true
        rm -f "$WORK"/tokens.txt "$WORK"/accepted.*
    else
        log "kept: database $DB, queue $QUEUE, key prefix $PREFIX, files in $WORK"
    fi
    exit "$rc"
}

start_run_devserver() {
    log "building the dev server and seckill-token ($PROFILE)"
    cargo build --profile "$([ "$PROFILE" = debug ] && echo dev || echo "$PROFILE")" -q -p seckill-devserver --bins
    BIN="$REPO/target/$PROFILE"

    # Every client connection and every connection to the stack is a descriptor: lift the soft
    # limit to the hard one for the server and wrk (a default of 1024 is close to 256 clients +
    # 256 sends).
    ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

    psql_pg -c "create database \"$DB\"" >/dev/null
    export DATABASE_URL="postgres://postgres@127.0.0.1:5432/$DB"
    export SECKILL_KEY_PREFIX="$PREFIX"
    export AWS_ENDPOINT_URL_SQS="$FAUXQS"
    ORDER_QUEUE_URL="$(sqs create)"
    export ORDER_QUEUE_URL ORDER_DLQ_URL="$ORDER_QUEUE_URL-dlq" ENTRY_QUEUE_URL="$ORDER_QUEUE_URL-entries"
    # warn: at info the server logs a line per accepted purchase, which is not what is measured here.
    LOG_LEVEL="${LOG_LEVEL:-warn}" start_devserver "$BIN/seckill-devserver" "$LOG"
    log "dev server on $URL (queue $ORDER_QUEUE_URL, database $DB, log $LOG)"
}

read_wrk_result() {
    line="$(grep '^wrk-check: ' "$WORK/wrk.txt" || true)"
    [ -n "$line" ] || die "wrk printed no result line (see $WORK/wrk.txt)"
    rps="$(sed -n 's/^Requests\/sec: *//p' "$WORK/wrk.txt")"
}

field() { printf '%s\n' "$line" | tr ' ' '\n' | sed -n "s/^$1=//p"; }

live_orders() {
    psql_run -tAc "select count(*) from orders where activity_id = $ACTIVITY and status in ('confirmed', 'paid')"
}
