-- Compare-and-set commit of a group's metadata (PROTOCOL section 3, step 5).
--
-- The group hash holds a `rev` field (storeRevision), a `cid` field (the commit id of
-- the last commit), a `header` field (JSON) and one field per member
-- (`m:<member id>`, JSON), so a commit writes only what changed. The write happens only
-- if `rev` and `cid` still equal what the caller loaded (0 and '0' for a group that does
-- not exist yet); it then raises `rev` to max(rev + 1, now) and stores the caller's new
-- commit id. The revision a replica caches by is the pair: `rev` alone can repeat when
-- Redis lost writes (a failover to a replica whose clock is behind, or a restore, put
-- an older `rev` back and the next commits count up through the lost values), but a
-- commit id is unique to one commit of one writer (its random writer id and a counter
-- it never reuses), so (rev, cid) never names two contents (E19). In the same script
-- the group is recorded in the registry (so a later loss of its metadata is detected,
-- E21) and member leases are set or removed (expiry = now + TTL).
--
-- A commit also records, per member whose heartbeat it acts on, the request's sequence
-- number in the group's sequence hash, refusing (-3) when that member's stored number is
-- already as high: a newer request of the member was acted on since the caller loaded
-- (the no-change road, lease_renew.lua, records it without a commit), so the caller's
-- request is stale. Members whose record is deleted lose their entry.
--
-- Every commit also prepends an entry to the group's changelog (a list, newest first,
-- trimmed to ARGV's last value): {r = new "<rev>:<cid>", p = the revision it replaced,
-- h = 1 if the header was written, u = member ids written, d = member ids deleted}, so
-- another replica holding the group at revision R reads only what changed since R
-- (group_delta.lua) instead of the whole hash.
--
-- KEYS[1]  group metadata hash          KEYS[2]  registry of groups (set)
-- KEYS[3]  member leases (sorted set: member -> expiry ms)
-- KEYS[4]  the group's changelog (list of JSON entries, newest first)
-- KEYS[5]  the group's sequence hash (member id -> newest sequence acted on)
-- ARGV[1]  expected rev                 ARGV[2]  expected cid ('0': none)
-- ARGV[3]  new cid                      ARGV[4]  group name
-- ARGV[5]  header JSON ('' = unchanged) ARGV[6]  lease TTL ms
-- ARGV[7]  now (ms, Redis time read by the caller in this critical section)
-- ARGV[8]  n upserts, then n pairs (member id, member JSON)
-- then     m deletes, then m member ids
-- then     k lease renewals, then k member ids
-- then     z lease removals (members no longer live), then z member ids
-- then     e expected-expired members: the commit is refused if any of them renewed
--          its lease in the meantime (score in the future)
-- then     q sequence updates, then q pairs (member id, sequence number)
-- then     the changelog's length (entries kept; 0: keep no changelog)
--
-- Returns  {1, new_rev, now_ms}   committed (with the caller's new cid)
--          {0, current_rev}       conflict: someone else committed first
--          {-2, member}           a member expected expired holds a live lease
--          {-3, member}           a newer request of the member was acted on: stale
local stored = redis.call('HMGET', KEYS[1], 'rev', 'cid')
local cur = tonumber(stored[1] or '0')
if cur ~= tonumber(ARGV[1]) or (stored[2] or '0') ~= ARGV[2] then return {0, cur} end
local now = tonumber(ARGV[7])
local i = 8
local n = tonumber(ARGV[i]); i = i + 1
local upserts = {}
for _ = 1, n do
  upserts[#upserts + 1] = 'm:' .. ARGV[i]
  upserts[#upserts + 1] = ARGV[i + 1]
  i = i + 2
end
local m = tonumber(ARGV[i]); i = i + 1
local deletes = {}
for _ = 1, m do deletes[#deletes + 1] = 'm:' .. ARGV[i]; i = i + 1 end
local k = tonumber(ARGV[i]); i = i + 1
local renew = {}
for _ = 1, k do renew[#renew + 1] = ARGV[i]; i = i + 1 end
local z = tonumber(ARGV[i]); i = i + 1
local unlease = {}
for _ = 1, z do unlease[#unlease + 1] = ARGV[i]; i = i + 1 end
local e = tonumber(ARGV[i]); i = i + 1
for _ = 1, e do
  local score = redis.call('ZSCORE', KEYS[3], ARGV[i])
  if score and tonumber(score) > now then return {-2, ARGV[i]} end
  i = i + 1
end
local q = tonumber(ARGV[i]); i = i + 1
local sequences = {}
for _ = 1, q do
  local stored = tonumber(redis.call('HGET', KEYS[5], ARGV[i]) or '0')
  if stored >= tonumber(ARGV[i + 1]) then return {-3, ARGV[i]} end
  sequences[#sequences + 1] = ARGV[i]
  sequences[#sequences + 1] = ARGV[i + 1]
  i = i + 2
end
-- One command per 1,000 values: Lua's unpack refuses more than ~8,000, and a commit
-- of a large group (a mass expiry, a wide reassignment) writes more records than that.
local function each_chunk(command, key, values)
  for j = 1, #values, 1000 do
    redis.call(command, key, unpack(values, j, math.min(j + 999, #values)))
  end
end
local rev = math.max(cur + 1, now)
redis.call('HSET', KEYS[1], 'rev', rev, 'cid', ARGV[3])
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'header', ARGV[5]) end
each_chunk('HSET', KEYS[1], upserts)  -- 1,000 values: 500 (field, value) pairs
each_chunk('HDEL', KEYS[1], deletes)
redis.call('SADD', KEYS[2], ARGV[4])
local ttl = tonumber(ARGV[6])
for _, member in ipairs(renew) do redis.call('ZADD', KEYS[3], now + ttl, member) end
for j = 1, m do
  redis.call('ZREM', KEYS[3], string.sub(deletes[j], 3))
  redis.call('HDEL', KEYS[5], string.sub(deletes[j], 3))
end
each_chunk('ZREM', KEYS[3], unlease)
each_chunk('HSET', KEYS[5], sequences)
local keep = tonumber(ARGV[i] or '0')
if keep > 0 then
  local written = {}
  for j = 1, #upserts, 2 do written[#written + 1] = string.sub(upserts[j], 3) end
  local deleted = {}
  for j = 1, m do deleted[#deleted + 1] = string.sub(deletes[j], 3) end
  local entry = cjson.encode({
    r = redis.call('HGET', KEYS[1], 'rev') .. ':' .. ARGV[3],
    p = ARGV[1] .. ':' .. ARGV[2],
    h = (ARGV[5] ~= '') and 1 or 0,
    u = written,
    d = deleted,
  })
  redis.call('LPUSH', KEYS[4], entry)
  redis.call('LTRIM', KEYS[4], 0, keep - 1)
end
return {1, rev, now}
