#!/usr/bin/env bash
# `make draw-check`: a draw sale at real size through the dev server (`make serve`'s binary, on
# fauxqs), as a new user would try it.
#
# Like scripts/wrk-check.sh it starts what it needs (the stack with fauxqs, wrk), builds the dev
# server and its token tool, and runs the server on a free port against a fresh database, key
# prefix and queue, all removed at the end. It signs DRAW_ENTRANTS user tokens, creates a draw
# sale (DRAW_STOCK units, one per order, a window of DRAW_WINDOW_SECS) through the admin API and
# lets wrk enter every user once (scripts/wrk-accepted.lua: each request a different user) while
# the window is open. Once the window has closed it starts a PING loop on its own connection to
# the sale's Redis (about one a millisecond) while the drawer (the dev server's reconcile, every
# 5 s) runs the draw, polling one entrant's status read and the public view until the view
# reveals the secret. It fails unless
#   - every entry was answered 202 and none 5xx, and at least DRAW_ENTRANTS were in the pool;
#   - no PING waited more than DRAW_PING_MAX_MS (25) while the draw ran;
#   - once the queue is drained, every winner is a live order (the time from the window's close
#     to the last one is printed): the orders are exactly
#     min(stock, entrants), none failed, and each order's user holds a winning entry.
#
# Usage: bash scripts/draw-check.sh
#   DRAW_ENTRANTS=120000 DRAW_STOCK=1000 DRAW_WINDOW_SECS=40 DRAW_PING_MAX_MS=25
#   WRK_CONNECTIONS=256 WRK_THREADS=2   the wrk run (it runs until the window is nearly over)
#   WRK_PROFILE=release   cargo profile of the dev server
#   WRK_KEEP=1            keep the database, queue and files (target/draw-check) for a look
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

ENTRANTS="${DRAW_ENTRANTS:-120000}"
STOCK="${DRAW_STOCK:-1000}"
WINDOW="${DRAW_WINDOW_SECS:-40}"
PING_MAX_MS="${DRAW_PING_MAX_MS:-25}"
CONNECTIONS="${WRK_CONNECTIONS:-256}"
THREADS="${WRK_THREADS:-2}"
PROFILE="${WRK_PROFILE:-release}"
DRAIN_SECS=180
# shellcheck source=scripts/loadcheck-lib.sh
source scripts/loadcheck-lib.sh draw
# The PING loop stops first, so it never outlives the run.
before_cleanup() { touch "$WORK/stop-pinging" 2>/dev/null || true; }
prepare_run
start_run_devserver

log "signing $ENTRANTS user tokens"
"$BIN/seckill-token" --users "$ENTRANTS" --prefix "${PREFIX#seckill:}-u" --ttl-secs 3600 >"$WORK/tokens.txt"
TRIGGER_TOKEN="$(head -1 "$WORK/tokens.txt")"
ADMIN_TOKEN="$("$BIN/seckill-token" --user draw-admin --admin --ttl-secs 3600)"

# The window opens a few seconds from now (the sale is loaded at once, within the preheat lead).
open_at="$(date -u -d '+4 seconds' +%s)"
start="$(date -u -d "@$open_at" +%Y-%m-%dT%H:%M:%SZ)"
end="$(date -u -d '+1 hour' +%Y-%m-%dT%H:%M:%SZ)"
created="$(curl -sf --max-time 10 -X POST "$URL/admin/activities" \
    -H "Authorization: Bearer $ADMIN_TOKEN" -H 'Content-Type: application/json' \
    -d "{\"title\":\"draw check\",\"totalStock\":$STOCK,\"perOrderLimit\":1,\"priceMinor\":1999,\"currency\":\"usd\",\"startAt\":\"$start\",\"endAt\":\"$end\",\"admission\":\"draw\",\"drawWindowMs\":$((WINDOW * 1000)),\"perUserRatePerSec\":0}")" \
    || die "could not create the draw sale"
ACTIVITY="$(printf '%s' "$created" | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])')"
close_at=$((open_at + WINDOW))
while [ "$(date +%s)" -lt "$open_at" ]; do sleep 0.2; done

duration=$((close_at - $(date +%s) - 3))
[ "$duration" -ge 5 ] || die "the window is too short for wrk (DRAW_WINDOW_SECS=$WINDOW)"
log "sale $ACTIVITY (draw, $STOCK units, window ${WINDOW}s); wrk -t$THREADS -c$CONNECTIONS -d${duration}s"
wrk -t"$THREADS" -c"$CONNECTIONS" -d"${duration}s" --timeout 5s --latency \
    -s scripts/wrk-accepted.lua "$URL" -- "$ACTIVITY" "$WORK/tokens.txt" "$WORK/accepted" "$THREADS" \
    | tee "$WORK/wrk.txt"
read_wrk_result

pool="$PREFIX:{$ACTIVITY}:pool"
entrants="$(redis-cli -u "$REDIS_URL" hlen "$pool")"
entrants=$((entrants - 1)) # the sentinel field
log "$entrants entrants in the pool; waiting for the window to close"
while [ "$(date +%s)" -le "$close_at" ]; do sleep 0.2; done

# The PING loop: its own connection, one PING about every millisecond, the slowest answer.
python3 - "$REDIS_URL" "$WORK/stop-pinging" >"$WORK/pings.txt" <<'PY' &
import os, socket, sys, time, urllib.parse
url = urllib.parse.urlparse(sys.argv[1])
s = socket.create_connection((url.hostname or "127.0.0.1", url.port or 6379))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
def call(cmd):
    s.sendall(cmd)
    return s.recv(256)
if url.password:
    user = urllib.parse.unquote(url.username or "default")
    pw = urllib.parse.unquote(url.password)
    call(f"*3\r\n$4\r\nAUTH\r\n${len(user)}\r\n{user}\r\n${len(pw)}\r\n{pw}\r\n".encode())
worst, count = 0.0, 0
while not os.path.exists(sys.argv[2]):
    t = time.perf_counter()
    call(b"PING\r\n")
    worst = max(worst, time.perf_counter() - t)
    count += 1
    time.sleep(0.001)
print(f"{count} {worst * 1000:.2f}")
PY
PINGER=$!
sleep 0.3

log "window closed; waiting for the drawer (reconcile)"
draw_started=$(date +%s.%N)
answers=()
for _ in $(seq 1 240); do
    code="$(curl -s -o "$WORK/status.json" -w '%{http_code}' --max-time 10 \
        -H "Authorization: Bearer $TRIGGER_TOKEN" "$URL/activities/$ACTIVITY/orders/me")"
    answers+=("$code")
    curl -sf --max-time 5 "$URL/activities/$ACTIVITY" >"$WORK/view.json" || true
    if python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))["draw"]; sys.exit(0 if d.get("secret") else 1)' "$WORK/view.json" 2>/dev/null; then
        break
    fi
    sleep 0.25
done
draw_secs="$(python3 -c "import time; print(f'{time.time() - $draw_started:.1f}')")"
sleep 2
touch "$WORK/stop-pinging"
wait "$PINGER"
read -r pings ping_max <"$WORK/pings.txt"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))["draw"]; sys.exit(0 if d.get("secret") else 1)' "$WORK/view.json" \
    || die "the draw did not finish within a minute (answers: ${answers[*]})"

want=$((entrants < STOCK ? entrants : STOCK))
drain_start=$SECONDS
while [ "$(live_orders)" -lt "$want" ] && [ $((SECONDS - drain_start)) -lt "$DRAIN_SECS" ]; do sleep 0.2; done
# The drawer writes the winners' orders itself (no message): from the window's close to the
# last one, to within a poll.
orders_secs="$(python3 -c "import time; print(f'{time.time() - $draw_started:.1f}')")"
sleep 2
orders="$(live_orders)"
failed="$(psql_run -tAc "select count(*) from orders where activity_id = $ACTIVITY and status = 'failed'")"
# Each order's user must hold a winning entry in the pool (`requestId|qty|rank|w`).
psql_run -tAc "select user_id from orders where activity_id = $ACTIVITY and status in ('confirmed', 'paid')" \
    >"$WORK/order-users.txt"
not_won=0
while read -r batch; do
    [ -n "$batch" ] || continue
    # shellcheck disable=SC2086
    not_won=$((not_won + $(redis-cli -u "$REDIS_URL" hmget "$pool" $batch | grep -vc '|w$' || true)))
done < <(xargs -n 500 <"$WORK/order-users.txt")

problems=()
[ "$(field s5xx)" = 0 ] || problems+=("$(field s5xx) 5xx answers to entries")
[ "$(field timeouts)" = 0 ] || problems+=("$(field timeouts) wrk timeouts")
[ "$entrants" -ge "$ENTRANTS" ] || problems+=("only $entrants of $ENTRANTS entered in the window (raise DRAW_WINDOW_SECS)")
awk -v m="$ping_max" -v lim="$PING_MAX_MS" 'BEGIN { exit !(m <= lim) }' \
    || problems+=("a PING waited $ping_max ms during the draw (limit $PING_MAX_MS)")
[ "$orders" = "$want" ] || problems+=("$orders live orders after ${DRAIN_SECS}s, want $want")
[ "$failed" = 0 ] || problems+=("$failed failed orders")
[ "$not_won" = 0 ] || problems+=("$not_won orders of users without a winning entry")

printf '\n== draw-check: %s entrants, %s units ==\n' "$entrants" "$STOCK"
printf 'entries           %s requests/s, 202 %s, 4xx %s (re-entries once tokens ran out: %s), 5xx %s, p99 %s ms\n' \
    "$rps" "$(field s202)" "$(field s4xx)" "$(field wrapped)" "$(field s5xx)" "$(field p99_ms)"
printf 'draw              done %s s after the first status read (answers %s)\n' "$draw_secs" "${answers[*]}"
printf 'PING              max %s ms over %s PINGs while the draw ran\n' "$ping_max" "$pings"
printf 'orders            %s live (want %s) %s s after the close, %s failed, %s of users without a winning entry\n' \
    "$orders" "$want" "$orders_secs" "$failed" "$not_won"
if [ "${#problems[@]}" -gt 0 ]; then
    for p in "${problems[@]}"; do log "FAIL: $p"; done
    exit 1
fi
log "ok: every entry answered, the draw never held Redis past ${PING_MAX_MS} ms, every winner is an order"
