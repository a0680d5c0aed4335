-- outbox_done.lua: drop the winners a drainer's send put on the queue, and end its lease
-- (docs/invariants.md, "Draw admission", step 5).
--
-- KEYS[1] outbox
-- ARGV[1] drainer token   ARGV[2] 1 = end the lease (the drainer stops), 0 = keep it
-- ARGV[3..] request ids that were sent
--
-- Returns the outbox entries left (the lease and the sentinel not counted).
for i = 3, #ARGV do redis.call('HDEL', KEYS[1], ARGV[i]) end
if ARGV[2] == '1' then
  local lease = redis.call('HGET', KEYS[1], ' lease')
  if lease and lease_fields(lease) == ARGV[1] then
    redis.call('HDEL', KEYS[1], ' lease')
  end
end
return redis.call('HLEN', KEYS[1]) - redis.call('HEXISTS', KEYS[1], '')
  - redis.call('HEXISTS', KEYS[1], ' lease')
