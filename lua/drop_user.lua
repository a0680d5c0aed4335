-- drop_user.lua: the last step of reconcile's orphan check (see mark_users.lua).
--
-- Removes the check's mark and, when the database showed no live order, the user: both only
-- while the mark is still this check's, so a user who did anything since the mark is kept.
--
-- KEYS[1] users   KEYS[2] ledger
-- ARGV[1] user id   ARGV[2] token   ARGV[3] "drop" = remove the user too, "keep" = mark only
--
-- Returns 1 = user removed, 0 = kept.
local v = redis.call('HGET', KEYS[2], ARGV[1])
if not v then return 0 end
local kind, token = string.match(v, '^(%a)|([^|]+)|')
if kind ~= 'x' or token ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
if ARGV[3] ~= 'drop' then return 0 end
return redis.call('HDEL', KEYS[1], ARGV[1])
