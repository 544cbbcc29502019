-- Fenced takeover: claim a slice of the group's pending entries on one shard.
--
-- A member that gains a shard first claims every pending entry of the group on it
-- (previous owners' and its own), min-idle 0 because ownership is exclusive, and
-- processes them before reading new ones. The caller loops on the returned cursor
-- until it is '0-0'. Each claimed entry comes with its retry record so the attempt
-- count and backoff survive the previous owner's crash.
--
-- KEYS[1]  shard stream
-- KEYS[2]  owner fence of the group on the shard
-- KEYS[3]  retry records of the group on the shard (hash id -> "attempts:due_ms")
-- ARGV[1]  group            ARGV[2]  consumer (member id)
-- ARGV[3]  grant token      ARGV[4]  cursor ('0-0' to start)
-- ARGV[5]  COUNT
--
-- Returns  {1, next_cursor, entries, retry_records}  ('' where an entry has none)
--          {-1, current_fence}   fenced
--          {-2}                  the shard key does not exist
if redis.call('EXISTS', KEYS[1]) == 0 then return {-2} end
local fence = redis.call('GET', KEYS[2])
if fence ~= ARGV[3] then return {-1, fence or ''} end
local r = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[4], 'COUNT', ARGV[5])
local entries = r[2]
local records = {}
for i, e in ipairs(entries) do
  records[i] = redis.call('HGET', KEYS[3], e[1]) or ''
end
-- Entries deleted from the stream were dropped from the PEL by XAUTOCLAIM (7.0+);
-- forget their retry records too.
local deleted = r[3]
if deleted then
  for _, id in ipairs(deleted) do redis.call('HDEL', KEYS[3], id) end
end
return {1, r[1], entries, records}
