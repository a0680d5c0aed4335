-- wrk script of `make wrk-check` (scripts/wrk-check.sh): purchases on the accepted path.
--
--   wrk -t2 -c256 -d10s -s scripts/wrk-accepted.lua URL -- ACTIVITY_ID TOKENS_FILE OUT_PREFIX THREADS
--
-- THREADS is wrk's -t again (a thread's Lua state cannot see how many threads there are).
-- TOKENS_FILE holds one signed user token a line (`seckill-token --users N --prefix P`). Thread k
-- of n takes lines k, k+n, k+2n, ... and sends each once, so every request is a distinct buyer
-- and is accepted while stock lasts; a thread that runs out starts over (`wrapped` counts it: those
-- requests answer already_purchased, so the run needed more tokens).
-- Each thread writes the requestId of every 202 to OUT_PREFIX.<k> (line buffered), so the
-- caller can check that each accepted click became an order. done() prints one line the caller
-- parses:
--   wrk-check: requests=N timeouts=N connect=N read=N write=N s202=N s4xx=N s5xx=N other=N wrapped=N ...

local threads = {}
local next_id = 0

function setup(thread)
    thread:set("id", next_id)
    next_id = next_id + 1
    table.insert(threads, thread)
end

function init(args)
    local activity, tokens_file, out_prefix = args[1], args[2], args[3]
    local nthreads = tonumber(args[4])
    assert(activity and tokens_file and out_prefix and nthreads,
        "args: ACTIVITY_ID TOKENS_FILE OUT_PREFIX THREADS")
    -- `id` was set by setup() in the main state, before this init.
    path = "/activities/" .. activity .. "/orders"
    body = '{"quantity":1}'
    tokens = {}
    local n = 0
    for line in io.lines(tokens_file) do
        if n % nthreads == id then
            tokens[#tokens + 1] = line
        end
        n = n + 1
    end
    assert(#tokens > 0, "no tokens for thread " .. id .. " in " .. tokens_file)
    accepted_ids = assert(io.open(out_prefix .. "." .. id, "w"))
    accepted_ids:setvbuf("line")
    cursor, wrapped = 0, 0
    s202, s4xx, s5xx, other = 0, 0, 0, 0
end

function request()
    cursor = cursor + 1
    if cursor > #tokens then
        cursor, wrapped = 1, wrapped + 1
    end
    return wrk.format("POST", path, {
        ["Authorization"] = "Bearer " .. tokens[cursor],
        ["Content-Type"] = "application/json",
    }, body)
end

function response(status, headers, resp_body)
    if status == 202 then
        s202 = s202 + 1
        local rid = resp_body and resp_body:match('"requestId"%s*:%s*"([%x%-]+)"')
        if rid then accepted_ids:write(rid, "\n") end
    elseif status >= 500 then
        s5xx = s5xx + 1
    elseif status >= 400 then
        s4xx = s4xx + 1
    else
        other = other + 1
    end
end

function done(summary, latency, requests)
    local t = { s202 = 0, s4xx = 0, s5xx = 0, other = 0, wrapped = 0 }
    for _, thread in ipairs(threads) do
        for k in pairs(t) do
            t[k] = t[k] + (thread:get(k) or 0)
        end
    end
    local e = summary.errors
    io.write(string.format(
        "wrk-check: requests=%d duration_us=%d rps=%.0f timeouts=%d connect=%d read=%d write=%d "
            .. "status_errors=%d s202=%d s4xx=%d s5xx=%d other=%d wrapped=%d "
            .. "p50_ms=%.2f p99_ms=%.2f max_ms=%.2f\n",
        summary.requests, summary.duration, summary.requests / (summary.duration / 1e6),
        e.timeout, e.connect, e.read, e.write, e.status,
        t.s202, t.s4xx, t.s5xx, t.other, t.wrapped,
        latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency.max / 1000))
end
