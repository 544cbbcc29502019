-- Compare-and-set commit of a stream's metadata (PROTOCOL section 3, step 5).
--
-- The new revision is max(rev + 1, Redis time in ms), so a revision is never issued
-- twice even after Redis lost writes (a failover or restore put an older revision
-- back): replicas cache stream metadata by revision (E19).
--
-- KEYS[1]  stream metadata hash (fields `rev`, `doc`)
-- KEYS[2]  registry of streams (set)
-- ARGV[1]  expected rev (0 for a new stream)   ARGV[2]  stream name
-- ARGV[3]  metadata JSON
--
-- Returns  {1, new_rev}           committed
--          {0, current_rev}       conflict
local cur = tonumber(redis.call('HGET', KEYS[1], 'rev') or '0')
if cur ~= tonumber(ARGV[1]) then return {0, cur} end
local t = redis.call('TIME')
local rev = math.max(cur + 1, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
redis.call('HSET', KEYS[1], 'rev', rev, 'doc', ARGV[3])
redis.call('SADD', KEYS[2], ARGV[2])
return {1, rev}
