-- Producer side of a delayed message: store it in its shard's slot until it is due.
--
-- The message waits in the shard's delayed set (delay id -> due ms) with its entry in
-- the shard's delayed entries (delay id -> the entry's fields, cmsgpack-packed), both
-- beside the stream in its slot, until the shard's owner moves it into the stream
-- (delay_move.lua). Due time is on the Redis clock: 'in' adds the delay to Redis TIME
-- here, 'at' is an absolute instant; a message already due enters the stream now.
-- The entry gets one more field, 'd' (its due ms), so a handler can tell how late it
-- ran. Delay ids come from a counter in the slot: ties of one due time keep their
-- publish order (ZSET members of one score sort by bytes; ids are fixed-width hex).
--
-- Like XADD NOMKSTREAM, nothing is written to a shard key that no longer exists (a
-- scale-in retired it): the producer refreshes its routing and re-routes. A retired
-- shard cannot gain a delayed message either, so retirement (retire.lua refuses while
-- the delayed set holds one) never strands one.
--
-- When the new message is the shard's earliest (the head of the delayed set), one
-- entry is added to the shard's delay wake stream (MAXLEN 1, never read by a group):
-- an idle owner's wait for new entries covers that key too (same slot), so it learns
-- of an earlier due time without polling (BullMQ's delay marker, bee-queue's head
-- notice: the same idea, on the wait streamworks already has).
--
-- With an event id and a dedup window, KEYS[6] is the shard's dedup record of the
-- event (as in publish_dedup.lua, and shared with it: an event published at once and
-- again delayed, or the other way round, is one message). It is checked before the
-- shard's existence, so a retry of an event a retired shard already took is reported
-- as a duplicate, not re-routed. Its value is the entry id, or 'delayed:<id>' while the
-- message waits; it lives until the message is due plus the window.
--
-- KEYS[1]  shard stream
-- KEYS[2]  the shard's delayed set (zset)
-- KEYS[3]  the shard's delayed entries (hash)
-- KEYS[4]  the shard's delay id counter
-- KEYS[5]  the shard's delay wake stream
-- KEYS[6]  (optional) dedup record of the event id on this shard
-- ARGV[1]  'in' | 'at'
-- ARGV[2]  ms: after Redis now ('in'), or since the Unix epoch ('at')
-- ARGV[3]  clock offset ms (0 in production; tests fast-forward with it)
-- ARGV[4]  dedup window ms (with KEYS[6]; ignored without)
-- ARGV[5..] field, value, ... of the entry
--
-- Returns  {1, entry_id, due}   due already: added to the stream now
--          {2, delay_id, due}   stored: it enters the stream when due
--          {0, previous}        duplicate: the dedup record's value (see above)
--          {-1}                 the shard key does not exist (retired): re-route
local dedup = KEYS[6]
if dedup then
  local prev = redis.call('GET', dedup)
  if prev then
    -- Rewritten as it is: a write, so a WAIT after this call covers the earlier one
    -- (see publish_dedup.lua).
    redis.call('SET', dedup, prev, 'KEEPTTL')
    return {0, prev}
  end
end
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[3])
local due = tonumber(ARGV[2])
if ARGV[1] == 'in' then due = now + due end
local fields = {}
for i = 5, #ARGV do fields[#fields + 1] = ARGV[i] end
fields[#fields + 1] = 'd'
fields[#fields + 1] = string.format('%d', due)
local window = tonumber(ARGV[4]) or 0
if due <= now then
  local id = redis.call('XADD', KEYS[1], 'NOMKSTREAM', '*', unpack(fields))
  if dedup and window > 0 then redis.call('SET', dedup, id, 'PX', window) end
  return {1, id, due}
end
local id = string.format('%016x', redis.call('INCR', KEYS[4]))
redis.call('ZADD', KEYS[2], due, id)
redis.call('HSET', KEYS[3], id, cmsgpack.pack(fields))
local head = redis.call('ZRANGE', KEYS[2], 0, 0)
if head[1] == id then
  redis.call('XADD', KEYS[5], 'MAXLEN', '1', '*', 'due', string.format('%d', due))
end
if dedup and window > 0 then
  redis.call('SET', dedup, 'delayed:' .. id, 'PX', due - now + window)
end
return {2, id, due}
