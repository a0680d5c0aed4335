-- ours_commands.lua: lua/purchase.lua's success path as its Redis commands alone, on ours'
-- keys and arguments and writing what it writes: the meta's HMGET (the fields ours reads when
-- its caller carries the sale's terms), TIME, the user's HGET, the
-- user's field, the ledger's `r` entry, the stock with its sequence. No function is made and
-- nothing is checked: what the commands a reservation needs cost the server, under which no
-- script that keeps the ledger entry, the window, the epoch and the one-order rule can go.
--
-- KEYS[1] meta  KEYS[2] users  KEYS[3] ledger
-- ARGV[1] user id  ARGV[2] quantity  ARGV[3] request id
local meta = redis.call('HMGET', KEYS[1], 'terms', 'version', 'stock', 'buckets', 'epoch', 'seq')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HGET', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[3], ARGV[1], 'r|' .. ARGV[3] .. '|' .. ARGV[2] .. '|' .. now)
redis.call('HSET', KEYS[1], 'stock', tonumber(meta[3]) - tonumber(ARGV[2]), 'seq',
  tonumber(meta[6] or '0') + 1)
return 0
