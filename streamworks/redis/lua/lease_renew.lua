-- The no-change heartbeat: renew a member's lease in one round trip, without the
-- group mutex, if and only if the coordinator's cached view is still current and the
-- request is not stale.
--
-- The caller decided from its cached group (at revision ARGV[3]) and cached stream
-- metadata (at revisions ARGV[6..]) that the heartbeat changes nothing. A revision is
-- "<rev>:<cid>", both fields of the hash (see group_commit.lua: `rev` alone can repeat
-- after Redis lost writes; with the commit id it names one commit). If every
-- revision still matches, that decision is exactly what a full critical section
-- would have computed, so the lease is renewed (Redis time + TTL) and the caller
-- answers from its cache. Otherwise nothing is written and the caller takes the
-- full path.
--
-- A request numbered at or below the newest sequence number acted on for the member
-- (a duplicate, a re-send, a request delayed in a replica while the member moved on)
-- renews nothing: a lease the member may have given up is not extended by a request
-- it sent long ago. Otherwise its number is recorded with the renewal.
--
-- KEYS[1]   group metadata hash     KEYS[2]  member leases (sorted set)
-- KEYS[3]   the group's sequence hash (member id -> newest sequence acted on)
-- KEYS[4..] stream metadata hashes of the group's subscribed streams
-- ARGV[1]   member id   ARGV[2]  lease TTL ms   ARGV[3]  expected group "<rev>:<cid>"
-- ARGV[4]   clock offset ms (0 in production; tests fast-forward with it)
-- ARGV[5]   the request's sequence number ('' when the client sends none)
-- ARGV[6..] expected stream "<rev>:<cid>", in KEYS order
--
-- Returns  {1, now_ms}   renewed
--          {0, now_ms}   a revision moved (or the member has no lease): not renewed
--          {-1, now_ms}  the request is stale: nothing written
local function moved(key, expected) -- whether the hash is no longer at "<rev>:<cid>"
  local r = redis.call('HMGET', key, 'rev', 'cid')
  local rev, cid = string.match(expected, '^(%d+):(%d+)$')
  return tonumber(r[1] or '0') ~= tonumber(rev) or (r[2] or '0') ~= cid
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[4])
if ARGV[5] ~= '' then
  local stored = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
  if stored >= tonumber(ARGV[5]) then return {-1, now} end
end
if moved(KEYS[1], ARGV[3]) then
  return {0, now}
end
for i = 4, #KEYS do
  if moved(KEYS[i], ARGV[i + 2]) then
    return {0, now}
  end
end
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score or tonumber(score) <= now then return {0, now} end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
if ARGV[5] ~= '' then redis.call('HSET', KEYS[3], ARGV[1], ARGV[5]) end
return {1, now}
