# shellcheck shell=bash
# Sourced by scripts/stack.sh: localstripe (PyPI), a stateful fake of Stripe's API on
# 127.0.0.1:8420 (PaymentIntents that confirm, cancel and refund, webhooks it signs, a Stripe.js
# mock), for the tests of the Stripe provider. Uses stack.sh's settings (HOST, STACK_DIR, VENV)
# and its log, die and summary, and sqs.sh's stop_started.

LOCALSTRIPE_PORT=8420
LOCALSTRIPE_VERSION=1.15.10
LOCALSTRIPE_PID="$STACK_DIR/localstripe.pid"
LOCALSTRIPE_LOG="$STACK_DIR/localstripe.log"

localstripe_up() {
    curl -sf -o /dev/null --max-time 2 "http://$HOST:$LOCALSTRIPE_PORT/js.stripe.com/v3/"
}

ensure_localstripe() {
    if [ ! -x "$VENV/bin/localstripe" ] \
        || [ "$("$VENV/bin/python" -m pip show localstripe 2>/dev/null | sed -n 's/^Version: //p')" != "$LOCALSTRIPE_VERSION" ]; then
        log "pip install localstripe==$LOCALSTRIPE_VERSION into $VENV (≈5 s)"
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            "localstripe==$LOCALSTRIPE_VERSION"
    fi
    if localstripe_up; then
        summary localstripe "$HOST:$LOCALSTRIPE_PORT already running"
        return
    fi
    mkdir -p "$STACK_DIR"
    log "starting localstripe on $HOST:$LOCALSTRIPE_PORT (log $LOCALSTRIPE_LOG)"
    # It listens on every address (it has no option for one); --from-scratch: a restart forgets
    # every payment instead of loading the last run's from its file in /tmp.
    setsid nohup "$VENV/bin/localstripe" --port "$LOCALSTRIPE_PORT" --from-scratch \
        >>"$LOCALSTRIPE_LOG" 2>&1 </dev/null &
    echo $! >"$LOCALSTRIPE_PID"
    for _ in $(seq 1 80); do localstripe_up && break; sleep 0.25; done
    localstripe_up || { tail -20 "$LOCALSTRIPE_LOG" >&2; die "localstripe did not answer on $HOST:$LOCALSTRIPE_PORT"; }
    summary localstripe "$HOST:$LOCALSTRIPE_PORT started (pid $(cat "$LOCALSTRIPE_PID"))"
}

stop_localstripe() { stop_started "$LOCALSTRIPE_PID" localstripe_up "$LOCALSTRIPE_PORT"; }
