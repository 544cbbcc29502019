-- Write one dead-letter entry at most once per (group, shard, entry id).
--
-- The marker key shares the dead-letter stream's hash tag, so the check and the
-- write run in one script in that slot. A second write of the same entry (the next
-- owner completing a dead-lettering its predecessor recorded and may have written
-- before it crashed) finds the marker and writes nothing. The marker expires after
-- ARGV[1] ms: longer than an entry stays pending between its final failure and its
-- ack, whoever acks it.
--
-- KEYS[1]  marker of the entry (Keyspace.dead_letter_marker)
-- KEYS[2]  dead-letter stream of the group and stream
-- ARGV[1]  marker TTL (ms)
-- ARGV[2..] field, value, field, value, ... of the entry
--
-- Returns  {1, entry_id}   written now
--          {0, entry_id}   written before (the marker holds its id)
local written = redis.call('GET', KEYS[1])
if written then return {0, written} end
local id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 2))
redis.call('SET', KEYS[1], id, 'PX', ARGV[1])
return {1, id}
