-- drop_user.lua: remove a user from the activity's set when nothing stands behind them.
--
-- Reconcile found the user in the set with neither a ledger entry nor an active order; the
-- ledger is re-checked here so a purchase the user made meanwhile is never undone.
--
-- KEYS[1] users   KEYS[2] ledger
-- ARGV[1] user id
--
-- Returns 1 = removed, 0 = kept (ledger entry appeared, or not a member).
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 0 end
return redis.call('SREM', KEYS[1], ARGV[1])
