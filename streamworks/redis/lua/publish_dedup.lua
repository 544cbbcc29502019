-- Shard-level idempotent publish: XADD unless this event id was already written to
-- this shard within the dedup window.
--
-- The dedup record lives beside the shard (same slot) rather than inside the stream
-- key, so it survives the shard's retirement: a stale producer retrying an event the
-- retired shard already took gets "duplicate", not a resurrected key (E18). There is
-- no deduplication across shards or layouts.
--
-- KEYS[1]  shard stream
-- KEYS[2]  dedup record of the event id on this shard
-- ARGV[1]  dedup window (ms)
-- ARGV[2..] field, value, ... of the entry
--
-- Returns  {1, id}   added          {0, id}   duplicate of entry `id`
--          {-1}      the shard key does not exist (retired): refresh routing
local prev = redis.call('GET', KEYS[2])
if prev then
  -- Rewritten as it is (same value, same expiry): a write, so a WAIT sent after this
  -- call (durable publishing) covers the replication of everything before it on this
  -- node, the earlier entry included. A call that wrote nothing would leave WAIT
  -- answering for the connection's older writes only.
  redis.call('SET', KEYS[2], prev, 'KEEPTTL')
  return {0, prev}
end
local id = redis.call('XADD', KEYS[1], 'NOMKSTREAM', '*', unpack(ARGV, 2))
if not id then return {-1} end
redis.call('SET', KEYS[2], id, 'PX', ARGV[1])
return {1, id}
