# Shared by the scripts that run a throwaway dev server against the local stack
# (scripts/schemathesis.sh, scripts/browser-tests.sh, and the load checks through
# scripts/loadcheck-lib.sh). Source it after scripts/env.sh; it needs $REPO (the checkout), and
# defines:
#
#   run_queue create|delete NAME ENDPOINT   a queue NAME, the draw entries' NAME-entries and their
#                                           DLQ NAME-dlq (maxReceiveCount 5, visibility 30 s, as
#                                           the real stack has) on the SQS emulator at ENDPOINT;
#                                           create prints the queue URL (the entries' is it with
#                                           -entries), delete removes all three and ignores
#                                           missing ones
#   free_port                               a free loopback TCP port
#   start_devserver BIN LOG ARGS...         starts BIN --addr 127.0.0.1:<free port> ARGS... in
#                                           the background with its output in LOG; sets
#                                           SERVER_PID and URL, and returns once GET /health
#                                           answers (dies after 60 s, or if the server exits)
#   stop_devserver [PID]                    stops the server start_devserver started (or PID),
#                                           if any
#
# and expects the caller's own `die MESSAGE`.

run_queue() {
    ACTION="$1" NAME="$2" ENDPOINT="$3" "$REPO/.tools/venv/bin/python" - <<'PY'
import json, os
import boto3

sqs = boto3.client("sqs", endpoint_url=os.environ["ENDPOINT"], region_name="us-east-1",
                   aws_access_key_id="test", aws_secret_access_key="test")
name = os.environ["NAME"]
if os.environ["ACTION"] == "create":
    dlq = sqs.create_queue(QueueName=f"{name}-dlq")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    for queue in (f"{name}-entries", name):
        url = sqs.create_queue(QueueName=queue, Attributes={
            "VisibilityTimeout": "30",
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": "5"}),
        })["QueueUrl"]
    print(url)
else:
    for q in (name, f"{name}-entries", f"{name}-dlq"):
        try:
            sqs.delete_queue(QueueUrl=sqs.get_queue_url(QueueName=q)["QueueUrl"])
        except sqs.exceptions.QueueDoesNotExist:
            pass
PY
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

SERVER_PID=""
URL=""

start_devserver() {
    local bin="$1" log="$2" port
    shift 2
    port="$(free_port)"
    URL="http://127.0.0.1:$port"
    "$bin" --addr "127.0.0.1:$port" "$@" >"$log" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 1 120); do
        curl -sf -o /dev/null --max-time 2 "$URL/health" && return 0
        kill -0 "$SERVER_PID" 2>/dev/null || { tail -20 "$log" >&2; die "the dev server exited"; }
        sleep 0.5
    done
    tail -20 "$log" >&2
    die "no /health within 60 s"
}

stop_devserver() {
    local pid="${1:-$SERVER_PID}"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
}
