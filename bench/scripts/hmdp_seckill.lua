-- hmdp_seckill.lua: the widely copied "hmdp" (黑马点评) voucher seckill script, as in
-- github.com/zhangz1w3nCode/hm-dianping `hm-dianping/src/main/resources/seckill.lua` (the same
-- script is in many forks). For the benchmark's side-by-side script rows only.
--
-- The original builds its key names inside the script ('seckill:stock:' .. voucherId,
-- 'seckill:order:' .. voucherId, and the fixed stream 'stream.orders'); here the three keys
-- come in KEYS so each bench row has keys of its own, under one hash tag, and deletes them
-- afterwards. The commands, their order and the stream fields are the original's.
--
-- KEYS[1] stock key (string integer)
-- KEYS[2] order set: users who bought this voucher
-- KEYS[3] the order stream (`stream.orders` in the original)
-- ARGV[1] voucher id
-- ARGV[2] user id
-- ARGV[3] order id
--
-- Returns 0 bought (stock taken, user added, order appended to the stream); 1 no stock
-- left; 2 the user already bought.
local voucherId = ARGV[1]
local userId = ARGV[2]
local orderId = ARGV[3]
if tonumber(redis.call('get', KEYS[1])) <= 0 then
  return 1
end
if redis.call('sismember', KEYS[2], userId) == 1 then
  return 2
end
redis.call('incrby', KEYS[1], -1)
redis.call('sadd', KEYS[2], userId)
redis.call('xadd', KEYS[3], '*', 'userId', userId, 'voucherId', voucherId, 'id', orderId)
return 0
