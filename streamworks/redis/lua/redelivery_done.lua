-- Remove a group's redelivery stream of a shard once every replayed dead letter in it
-- has been handled, so that the shard's owner stops reading it (``dlq replay`` writes
-- it; see runtime/redelivery.py).
--
-- One script in the shard's slot, like redeliver.lua: a replay that comes first leaves
-- an entry here and nothing is removed; a replay that comes after finds no stream and
-- creates it again (with its consumer group, from the beginning), and the owner's next
-- look finds it. Only the shard's owner removes it (its fence is checked), and only
-- when nothing is left in it: no entry, and nothing pending for the group.
--
-- KEYS[1]  redelivery stream of the group on the shard
-- KEYS[2]  owner fence of the group on the shard
-- KEYS[3]  retry records of the redelivery stream (deleted with it)
-- ARGV[1]  group   ARGV[2]  grant token ("<fence token>:<member id>")
--
-- Returns  1 removed
--          0 not empty (an entry, or one pending): kept
--          -1 fenced: the caller does not own the shard (nothing done)
--          -2 no redelivery stream
if redis.call('EXISTS', KEYS[1]) == 0 then return -2 end
if redis.call('GET', KEYS[2]) ~= ARGV[2] then return -1 end
if redis.call('XLEN', KEYS[1]) > 0 then return 0 end
local pending = redis.call('XPENDING', KEYS[1], ARGV[1])
if tonumber(pending[1]) > 0 then return 0 end
redis.call('DEL', KEYS[1], KEYS[3])
return 1
