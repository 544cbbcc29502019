-- The no-change heartbeat: renew a member's lease in one round trip, without the
-- group mutex, if and only if the coordinator's cached view is still current.
--
-- The caller decided from its cached group (at revision ARGV[3]) and cached stream
-- metadata (at revisions ARGV[5..]) that the heartbeat changes nothing. A revision is
-- "<rev>:<cid>", both fields of the hash (see group_commit.lua: `rev` alone can repeat
-- after Redis lost writes; with the commit id it names one commit). If every
-- revision still matches, that decision is exactly what a full critical section
-- would have computed, so the lease is renewed (Redis time + TTL) and the caller
-- answers from its cache. Otherwise nothing is written and the caller takes the
-- full path.
--
-- KEYS[1]   group metadata hash     KEYS[2]  member leases (sorted set)
-- KEYS[3..] stream metadata hashes of the group's subscribed streams
-- ARGV[1]   member id   ARGV[2]  lease TTL ms   ARGV[3]  expected group "<rev>:<cid>"
-- ARGV[4]   clock offset ms (0 in production; tests fast-forward with it)
-- ARGV[5..] expected stream "<rev>:<cid>", in KEYS order
--
-- Returns  {1, now_ms}   renewed
--          {0, now_ms}   a revision moved (or the member has no lease): not renewed
local function moved(key, expected) -- whether the hash is no longer at "<rev>:<cid>"
  local r = redis.call('HMGET', key, 'rev', 'cid')
  local rev, cid = string.match(expected, '^(%d+):(%d+)$')
  return tonumber(r[1] or '0') ~= tonumber(rev) or (r[2] or '0') ~= cid
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[4])
if moved(KEYS[1], ARGV[3]) then
  return {0, now}
end
for i = 3, #KEYS do
  if moved(KEYS[i], ARGV[i + 2]) then
    return {0, now}
  end
end
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score or tonumber(score) <= now then return {0, now} end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
return {1, now}
