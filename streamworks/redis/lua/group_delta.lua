-- What changed in a group's metadata since a revision the caller holds (an
-- incremental reload; see group_commit.lua for the changelog it walks).
--
-- The changelog lists commits newest first, each naming its revision and the one it
-- replaced. Walking it from the hash's current revision back to the caller's, every
-- entry must name the revision the previous one replaced: a gap (an entry trimmed
-- away, a writer that kept no changelog, Redis having lost writes so the caller's
-- revision is not in this history) answers 2 and the caller reads the whole hash.
-- Everything is read in this one script, so the answer is exactly the hash at the
-- revision it reports. When more than half of the members changed, the whole hash is
-- as cheap, so the script answers 2 as well.
--
-- KEYS[1]  group metadata hash          KEYS[2]  the group's changelog (list)
-- ARGV[1]  the caller's revision "<rev>:<cid>"
-- ARGV[2]  most entries to walk
--
-- Returns  {0}                           the hash is still at ARGV[1]
--          {-1}                          there is no hash
--          {2}                           cannot catch up: read the whole hash
--          {1, rev, cid, header or false, id1, member JSON or false (deleted), ...}
local stored = redis.call('HMGET', KEYS[1], 'rev', 'cid')
if not stored[1] then return {-1} end
local current = stored[1] .. ':' .. (stored[2] or '0')
if current == ARGV[1] then return {0} end
local entries = redis.call('LRANGE', KEYS[2], 0, tonumber(ARGV[2]) - 1)
local limit = redis.call('HLEN', KEYS[1]) / 2
local expect = current
local ids, seen = {}, {}
local header = false
local function note(list)
  for _, id in ipairs(list) do
    if not seen[id] then
      seen[id] = true
      ids[#ids + 1] = id
    end
  end
end
for _, raw in ipairs(entries) do
  local entry = cjson.decode(raw)
  if entry.r ~= expect then return {2} end
  if entry.h == 1 then header = true end
  note(entry.u)
  note(entry.d)
  if #ids > limit then return {2} end
  if entry.p == ARGV[1] then
    local reply = {1, stored[1], stored[2] or '0', false}
    if header then reply[4] = redis.call('HGET', KEYS[1], 'header') end
    for _, id in ipairs(ids) do
      reply[#reply + 1] = id
      reply[#reply + 1] = redis.call('HGET', KEYS[1], 'm:' .. id)
    end
    return reply
  end
  expect = entry.p
end
return {2}
