-- Reclaim space at the head of a shard without ever breaking `lag`.
--
-- Trims (XTRIM MINID) only entries that every consumer group has delivered and
-- acknowledged: below the low-water mark, the minimum over groups of the oldest
-- pending id, else the entry after last-delivered-id. Head trimming never moves
-- max-deleted-entry-id, so `lag` stays exact on Redis 7.x and Valkey 8.x; XDEL of
-- single entries would not (research brief, redis-streams.md section 1).
--
-- KEYS[1]  shard stream
-- ARGV[1]  optional cap id: never trim at or past it ('' for none); used by retention
--
-- Returns  number of entries trimmed; -1 when the stream has no groups (nothing is
--          trimmed: nobody has proven delivery); -2 when the stream does not exist
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
if #groups == 0 then return -1 end
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
