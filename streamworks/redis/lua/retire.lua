-- Drain check of a removed shard, and its atomic retirement.
--
-- Drained means, for every group the registry says must exist on the shard: the group
-- exists, has no pending entries, reports lag == 0 (nil is *not* proven, E12), and no
-- entry exists after its last-delivered-id. Groups present on the shard but not
-- registered are checked too. A shard that still holds entries but has no consumer
-- group at all is not drained either: nobody has read those entries (a group that
-- subscribes later from the earliest entry would). When ARGV[1] is 'retire' and the check passes, the shard
-- key and its fences and retry records are deleted in the same script, so a stale
-- producer's XADD NOMKSTREAM fails from then on (E16). Publish dedup records are left
-- to expire: they must outlive the shard (E18).
--
-- KEYS[1]   shard stream
-- KEYS[2..] keys to delete with it (fences, retry records)
-- ARGV[1]   'check' | 'retire'
-- ARGV[2..] groups that must exist on the shard
--
-- Returns  {2}              the shard key is already gone
--          {1}              drained (and retired when asked)
--          {0, reason}      not (yet) proven drained
if redis.call('EXISTS', KEYS[1]) == 0 then return {2} end
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
if #groups == 0 then
  local n = redis.call('XLEN', KEYS[1])
  if n > 0 then return {0, 'no consumer group has read its ' .. n .. ' entries'} end
end
local seen = {}
for _, g in ipairs(groups) do
  local f = {}
  for j = 1, #g, 2 do f[g[j]] = g[j + 1] end
  seen[f['name']] = true
  if f['pending'] > 0 then
    return {0, 'group ' .. f['name'] .. ' has ' .. f['pending'] .. ' pending'}
  end
  if not f['lag'] then return {0, 'group ' .. f['name'] .. ' lag unknown (nil)'} end
  if f['lag'] > 0 then return {0, 'group ' .. f['name'] .. ' lag ' .. f['lag']} end
  local rest = redis.call('XRANGE', KEYS[1], '(' .. f['last-delivered-id'], '+', 'COUNT', 1)
  if #rest > 0 then return {0, 'group ' .. f['name'] .. ' has undelivered entries'} end
end
for i = 2, #ARGV do
  if not seen[ARGV[i]] then return {0, 'group ' .. ARGV[i] .. ' missing on shard'} end
end
if ARGV[1] == 'retire' then
  redis.call('DEL', unpack(KEYS))
end
return {1}
