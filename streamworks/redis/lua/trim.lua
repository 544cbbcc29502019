-- Reclaim space at the head of a shard without ever breaking `lag`.
--
-- Trims (XTRIM MINID) only entries that every consumer group that must exist on the
-- shard has delivered and acknowledged: below the low-water mark, the minimum over
-- groups of the oldest pending id, else the entry after last-delivered-id. The groups
-- are those in the shard's group set (written with the shard and with each group, in
-- this slot) together with any other group present: while one in the set is missing,
-- or the set is not known yet, nothing is trimmed (SPEC section 5, Ack), so a group
-- whose consumer group is created late still finds every entry. Head trimming never
-- moves max-deleted-entry-id, so `lag` stays exact on Redis 7.x and Valkey 8.x; XDEL
-- of single entries would not (research brief, redis-streams.md section 1).
--
-- KEYS[1]  shard stream
-- KEYS[2]  the shard's group set
-- ARGV[1]  optional cap id: never trim at or past it ('' for none); used by retention
--
-- Returns  number of entries trimmed, or (nothing trimmed):
--          -1  the stream has no groups and none must exist (nobody proved delivery)
--          -2  the stream does not exist
--          -3  a group in the set is missing on the shard (created late, or lost)
--          -4  the set is not known: not confirmed since a scale-out created the shard
--              ('!unsealed'), or missing while groups exist (a shard created before
--              the set existed, until the coordinator backfills it)
local function full(id) -- "ms" is shorthand for "ms-0", as XTRIM accepts it
  if not string.find(id, '-', 1, true) then return id .. '-0' end
  return id
end
local function cmp(a, b) -- exact compare of "ms-seq" ids, no float math
  a, b = full(a), full(b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if #am ~= #bm then return (#am < #bm) and -1 or 1 end
  if am ~= bm then return (am < bm) and -1 or 1 end
  if #as ~= #bs then return (#as < #bs) and -1 or 1 end
  if as ~= bs then return (as < bs) and -1 or 1 end
  return 0
end
local function after(id) -- the smallest id greater than `id`
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  if #seq > 15 then return id end -- beyond exact doubles: keep one entry, stay safe
  return ms .. '-' .. string.format('%d', tonumber(seq) + 1)
end
if redis.call('EXISTS', KEYS[1]) == 0 then return -2 end
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
local required = redis.call('SMEMBERS', KEYS[2])
if #required == 0 then
  if #groups == 0 then return -1 end
  return -4
end
local present = {}
for _, g in ipairs(groups) do
  for j = 1, #g, 2 do
    if g[j] == 'name' then present[g[j + 1]] = true end
  end
end
for _, name in ipairs(required) do
  if name == '!unsealed' then return -4 end
end
for _, name in ipairs(required) do
  if not present[name] then return -3 end
end
local lwm
for _, g in ipairs(groups) do
  local f = {}
  for j = 1, #g, 2 do f[g[j]] = g[j + 1] end
  local cand = after(f['last-delivered-id'])
  if f['pending'] > 0 then
    local p = redis.call('XPENDING', KEYS[1], f['name'])
    if cmp(p[2], cand) < 0 then cand = p[2] end
  end
  if (not lwm) or cmp(cand, lwm) < 0 then lwm = cand end
end
if ARGV[1] and ARGV[1] ~= '' and cmp(ARGV[1], lwm) < 0 then lwm = ARGV[1] end
return redis.call('XTRIM', KEYS[1], 'MINID', lwm)
