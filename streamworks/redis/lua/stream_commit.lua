-- Compare-and-set commit of a stream's metadata (PROTOCOL section 3, step 5).
--
-- The new revision is max(rev + 1, Redis time in ms) with the caller's new commit id
-- (`cid`); the write happens only if `rev` and `cid` still equal what the caller
-- loaded. Replicas cache stream metadata by the pair (rev, cid): `rev` alone can repeat
-- after Redis lost writes (a failover to a replica whose clock is behind, a restore),
-- a commit id is unique to one commit of one writer (E19; see group_commit.lua).
--
-- KEYS[1]  stream metadata hash (fields `rev`, `cid`, `doc`)
-- KEYS[2]  registry of streams (set)
-- ARGV[1]  expected rev (0 for a new stream)   ARGV[2]  expected cid ('0': none)
-- ARGV[3]  new cid   ARGV[4]  stream name   ARGV[5]  metadata JSON
--
-- Returns  {1, new_rev}           committed (with the caller's new cid)
--          {0, current_rev}       conflict
local stored = redis.call('HMGET', KEYS[1], 'rev', 'cid')
local cur = tonumber(stored[1] or '0')
if cur ~= tonumber(ARGV[1]) or (stored[2] or '0') ~= ARGV[2] then return {0, cur} end
local t = redis.call('TIME')
local rev = math.max(cur + 1, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
redis.call('HSET', KEYS[1], 'rev', rev, 'cid', ARGV[3], 'doc', ARGV[5])
redis.call('SADD', KEYS[2], ARGV[4])
return {1, rev}
