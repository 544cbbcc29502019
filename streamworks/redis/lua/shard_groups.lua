-- Confirm (seal) a shard's group set: add the groups the registry lists and drop the
-- '!unsealed' marker, so trimming may run again.
--
-- Sound only with a registry read taken *after* the layout holding this shard was
-- committed: a group that subscribes later loads that layout and creates its consumer
-- group here itself (group_create.lua adds it to the set). The set is only ever added
-- to: a listed group whose consumer group is not created yet keeps trimming refused
-- until it is. Also the backfill of shards created before the set existed.
--
-- KEYS[1]  shard stream
-- KEYS[2]  the shard's group set
-- ARGV     groups registered on the stream (from a registry read after the commit)
--
-- Returns  number of groups added to the set; -2 the shard key does not exist
--          (nothing written: no orphan set for a retired shard)
if redis.call('EXISTS', KEYS[1]) == 0 then return -2 end
local added = 0
if #ARGV > 0 then added = redis.call('SADD', KEYS[2], unpack(ARGV)) end
redis.call('SREM', KEYS[2], '!unsealed')
return added
