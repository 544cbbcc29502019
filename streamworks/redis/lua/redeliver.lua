-- Replay one dead letter to one group only: add it to the group's redelivery stream
-- of a live shard (``streamworks dlq replay``).
--
-- The redelivery stream shares the shard's slot and is read only by the group's owner
-- of the shard (fenced like the shard itself), so no other group sees the message
-- again. The consumer group on it is created on first use, from the beginning ('0').
-- Refused when the shard key no longer exists (retired by a scale-in): the caller
-- fetches fresh routing and routes the message by its key again.
--
-- KEYS[1]  shard stream (must exist)
-- KEYS[2]  redelivery stream of the group on the shard
-- ARGV[1]  group
-- ARGV[2…] entry fields: name, value, name, value, ...
--
-- Returns  {1, entry_id}   added
--          {-2}            the shard key does not exist (retired)
if redis.call('EXISTS', KEYS[1]) == 0 then return {-2} end
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[1], '0', 'MKSTREAM')
end
local fields = {}
for i = 2, #ARGV do fields[#fields + 1] = ARGV[i] end
return {1, redis.call('XADD', KEYS[2], '*', unpack(fields))}
