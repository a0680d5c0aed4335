-- drop_user.lua: the last step of reconcile's orphan check (see mark_users.lua and
-- docs/invariants.md, "Reconcile", step 3): removes the check's mark and, when the database
-- showed no live order, the user, both only while the mark is still this check's.
--
-- KEYS[1] users   KEYS[2] ledger
-- ARGV[1] user id   ARGV[2] token   ARGV[3] "drop" = remove the user too, "keep" = mark only
--
-- Returns:
local KEPT = 0
local DROPPED = 1 -- the user is out of `users`
local v = redis.call('HGET', KEYS[2], ARGV[1])
if not v then return KEPT end
local kind, token = entry_fields(v)
if kind ~= 'x' or token ~= ARGV[2] then return KEPT end
redis.call('HDEL', KEYS[2], ARGV[1])
if ARGV[3] ~= 'drop' then return KEPT end
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return KEPT end
return DROPPED
