#!/usr/bin/env bash
# `make wrk-check`: the dev server (`make serve`'s binary, on fauxqs) under a standard load tool.
#
# On a fresh clone it starts the stack with fauxqs (scripts/stack.sh serve), installs wrk (Debian)
# if missing, builds the dev server and its token tool (release), and starts the server in the
# background on a free loopback port, against a fresh database, Redis key prefix and fauxqs queue
# (nothing of `make serve`'s data is touched; all of it is removed at the end). It creates a
# running sale through the admin API with one unit per pre-signed user token, then runs
#
#   wrk -t2 -c256 -d10s --timeout 2s -s scripts/wrk-accepted.lua   (POST /activities/{id}/orders)
#
# where every request carries a different user's token, so every one is accepted. It fails unless
# wrk saw no timeouts, no socket errors and no 5xx (and nothing but 202s), and unless, once the
# queue is drained, every 202's requestId is an order in the database or a pending reservation
# in Redis (no accepted click lost). It reports requests/s, latency and the counts.
#
# Usage: bash scripts/wrk-check.sh
#   WRK_DURATION=10s WRK_CONNECTIONS=256 WRK_THREADS=2 WRK_TIMEOUT=2s   the wrk run
#   WRK_TOKENS=N          users (= tokens = units on sale); default 150000, more than the dev
#                         server answers in 10 s on a 2-core machine
#   WRK_DRAIN_SECS=120    how long the consumer may take to drain the queue afterwards
#   WRK_PROFILE=release   cargo profile of the dev server (debug: quicker to build, slower to serve)
#   WRK_KEEP=1            keep the database, queue and files (target/wrk-check) for a look
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

DURATION="${WRK_DURATION:-10s}"
CONNECTIONS="${WRK_CONNECTIONS:-256}"
THREADS="${WRK_THREADS:-2}"
WRK_TIMEOUT="${WRK_TIMEOUT:-2s}"
TOKENS="${WRK_TOKENS:-150000}"
DRAIN_SECS="${WRK_DRAIN_SECS:-120}"
PROFILE="${WRK_PROFILE:-release}"
# shellcheck source=scripts/loadcheck-lib.sh
source scripts/loadcheck-lib.sh wrk
prepare_run
start_run_devserver

ADMIN_TOKEN="$("$BIN/seckill-token" --user wrk-admin --admin --ttl-secs 3600)"
start="$(date -u -d '-1 minute' +%Y-%m-%dT%H:%M:%SZ)"
end="$(date -u -d '+1 hour' +%Y-%m-%dT%H:%M:%SZ)"
created="$(curl -sf --max-time 10 -X POST "$URL/admin/activities" \
    -H "Authorization: Bearer $ADMIN_TOKEN" -H 'Content-Type: application/json' \
    -d "{\"title\":\"wrk check\",\"totalStock\":$TOKENS,\"perOrderLimit\":1,\"priceMinor\":1999,\"currency\":\"usd\",\"startAt\":\"$start\",\"endAt\":\"$end\"}")" \
    || die "could not create the sale"
ACTIVITY="$(printf '%s' "$created" | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])')"
for _ in $(seq 1 60); do
    curl -sf --max-time 2 "$URL/activities/$ACTIVITY" | grep -q '"remainingStock":[0-9]' && break
    sleep 0.5
done
curl -sf --max-time 2 "$URL/activities/$ACTIVITY" | grep -q '"remainingStock":[0-9]' \
    || die "sale $ACTIVITY is not loaded into Redis"

log "signing $TOKENS user tokens"
"$BIN/seckill-token" --users "$TOKENS" --prefix "${PREFIX#seckill:}-u" --ttl-secs 3600 >"$WORK/tokens.txt"

log "sale $ACTIVITY ($TOKENS units); wrk -t$THREADS -c$CONNECTIONS -d$DURATION --timeout $WRK_TIMEOUT"
wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" --timeout "$WRK_TIMEOUT" --latency \
    -s scripts/wrk-accepted.lua "$URL" -- "$ACTIVITY" "$WORK/tokens.txt" "$WORK/accepted" "$THREADS" \
    | tee "$WORK/wrk.txt"

# The figures: the script's done() line, and wrk's own summary lines as a cross-check.
read_wrk_result
socket_errors="$(grep -o 'Socket errors:.*' "$WORK/wrk.txt" || true)"
non2xx="$(sed -n 's/^ *Non-2xx or 3xx responses: *//p' "$WORK/wrk.txt")"

# Quiescence: the order count and the ledger stopped moving (normally the ledger is empty: each
# reservation became an order; one whose give-back could not be claimed waits for reconcile).
ledger="$PREFIX:{$ACTIVITY}:ledger"
pending_ids() { redis-cli -u "$REDIS_URL" hvals "$ledger" | sed -n 's/^r|\([^|]*\)|.*/\1/p'; }
drain_start=$SECONDS
last="" still=0
while :; do
    pending="$(pending_ids | wc -l)"
    orders="$(live_orders)"
    if [ "$orders $pending" = "$last" ]; then still=$((still + 1)); else still=0; fi
    if [ "$still" -ge 1 ] && { [ "$pending" -eq 0 ] || [ "$still" -ge 5 ]; }; then break; fi
    if [ $((SECONDS - drain_start)) -ge "$DRAIN_SECS" ]; then
        log "not quiet after $DRAIN_SECS s ($orders orders, $pending pending)"
        break
    fi
    last="$orders $pending"
    sleep 1
done
drain_secs=$((SECONDS - drain_start))

# Every 202's requestId must be an order (any status: its fate is decided) or a reservation.
cat "$WORK"/accepted.* >"$WORK/accepted-ids.txt"
pending_ids >"$WORK/pending-ids.txt"
psql_run -c "create table wrk_accepted (request_id uuid)" -c "create table wrk_pending (request_id uuid)"
psql_run -c "\\copy wrk_accepted from '$WORK/accepted-ids.txt'" -c "\\copy wrk_pending from '$WORK/pending-ids.txt'"
lost="$(psql_run -tAc "select count(*) from wrk_accepted a where not exists (select 1 from orders o where o.request_id = a.request_id) and not exists (select 1 from wrk_pending p where p.request_id = a.request_id)")"
failed_orders="$(psql_run -tAc "select count(*) from orders o join wrk_accepted a using (request_id) where o.status = 'failed'")"
ids="$(wc -l <"$WORK/accepted-ids.txt")"

s202="$(field s202)"
problems=()
[ "$(field timeouts)" = 0 ] || problems+=("$(field timeouts) timeouts")
for e in connect read write; do
    [ "$(field "$e")" = 0 ] || problems+=("$(field "$e") socket $e errors")
done
[ -z "$socket_errors" ] || problems+=("wrk reported $socket_errors")
[ "$(field s5xx)" = 0 ] || problems+=("$(field s5xx) 5xx responses")
[ "$(field s4xx)" = 0 ] || problems+=("$(field s4xx) 4xx responses")
[ "$(field other)" = 0 ] || problems+=("$(field other) responses neither 202 nor an error")
[ "$(field wrapped)" = 0 ] || problems+=("tokens ran out (raise WRK_TOKENS above $TOKENS)")
[ "$ids" = "$s202" ] || problems+=("$s202 202s but $ids requestIds recorded")
[ "$lost" = 0 ] || problems+=("$lost accepted requests are neither an order nor pending (lost)")
[ "$failed_orders" = 0 ] || problems+=("$failed_orders accepted requests ended as failed orders")
[ "$s202" -gt 0 ] || problems+=("no request was accepted")

orders="$(live_orders)"
pending="$(wc -l <"$WORK/pending-ids.txt")"
printf '\n== wrk-check: %s x %s connections, %s threads, accepted path ==\n' "$DURATION" "$CONNECTIONS" "$THREADS"
printf 'requests/s        %s (%s requests, p50 %s ms, p99 %s ms, max %s ms)\n' \
    "$rps" "$(field requests)" "$(field p50_ms)" "$(field p99_ms)" "$(field max_ms)"
printf '202s              %s (4xx %s, 5xx %s, non-2xx/3xx per wrk: %s)\n' \
    "$s202" "$(field s4xx)" "$(field s5xx)" "${non2xx:-0}"
printf 'errors            timeouts %s, connect %s, read %s, write %s\n' \
    "$(field timeouts)" "$(field connect)" "$(field read)" "$(field write)"
printf 'after %3s s       orders %s + pending %s = %s; 202s %s (the %s more were in flight when wrk stopped)\n' \
    "$drain_secs" "$orders" "$pending" "$((orders + pending))" "$s202" "$((orders + pending - s202))"
printf 'lost              %s of the %s accepted requestIds\n' "$lost" "$ids"
if [ "${#problems[@]}" -gt 0 ]; then
    for p in "${problems[@]}"; do log "FAIL: $p"; done
    log "dev server log: $LOG"
    exit 1
fi
log "ok: no timeouts, no socket errors, no 5xx, every accepted click is an order or pending"
