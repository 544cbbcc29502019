-- Remove one group from a shard for good (unsubscribe): destroy its consumer group
-- (positions and pending entries), take it off the shard's group set, and delete its
-- owner fence and retry records, all in one script, so trimming and retirement never
-- see the set and the consumer groups disagree.
--
-- KEYS[1]  shard stream
-- KEYS[2]  the shard's group set
-- KEYS[3..] keys of the group on the shard to delete (owner fence, retry records)
-- ARGV[1]  group
--
-- Returns  1 destroyed, 0 the group did not exist on the shard (set and keys cleaned
--          anyway), -2 the shard key does not exist
local exists = redis.call('EXISTS', KEYS[1]) == 1
redis.call('SREM', KEYS[2], ARGV[1])
if #KEYS > 2 then redis.call('DEL', unpack(KEYS, 3)) end
if not exists then return -2 end
return redis.call('XGROUP', 'DESTROY', KEYS[1], ARGV[1])
