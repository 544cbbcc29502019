-- Drain check of a removed shard, and its atomic retirement.
--
-- Drained means, for every group the registry says must exist on the shard: the group
-- exists, has no pending entries, reports lag == 0 (nil is *not* proven, E12), and its
-- last-delivered-id has reached the stream's last-generated-id (nothing was added after
-- what it read). Groups present on the shard but not registered are checked too. A
-- shard that still holds entries but has no consumer group at all is not drained
-- either: nobody has read those entries (a group that subscribes later from the
-- earliest entry would). No entry is read: the evidence is consumer-group metadata.
-- When ARGV[1] is 'retire' and the check passes, the shard key and its fences and
-- retry records are deleted in the same script, so a stale producer's XADD NOMKSTREAM
-- fails from then on (E16). Publish dedup records are left to expire: they must
-- outlive the shard (E18).
--
-- KEYS[1]   shard stream
-- KEYS[2..] keys to delete with it (fences, retry records)
-- ARGV[1]   'check' | 'retire'
-- ARGV[2..] groups that must exist on the shard
--
-- Returns  {2}              the shard key is already gone
--          {1}              drained (and retired when asked)
--          {0, reasons}     not (yet) proven drained; every group's reason, '; '-joined
local function cmp(a, b) -- exact compare of "ms-seq" ids, no float math
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if #am ~= #bm then return (#am < #bm) and -1 or 1 end
  if am ~= bm then return (am < bm) and -1 or 1 end
  if #as ~= #bs then return (#as < #bs) and -1 or 1 end
  if as ~= bs then return (as < bs) and -1 or 1 end
  return 0
end
if redis.call('EXISTS', KEYS[1]) == 0 then return {2} end
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
local info = redis.call('XINFO', 'STREAM', KEYS[1])
local stream = {}
for j = 1, #info, 2 do stream[info[j]] = info[j + 1] end
local reasons = {}
if #groups == 0 and stream['length'] > 0 then
  reasons[#reasons + 1] = 'no consumer group has read its ' .. stream['length'] .. ' entries'
end
local seen = {}
for _, g in ipairs(groups) do
  local f = {}
  for j = 1, #g, 2 do f[g[j]] = g[j + 1] end
  seen[f['name']] = true
  local name = 'group ' .. f['name']
  if f['pending'] > 0 then
    reasons[#reasons + 1] = name .. ' has ' .. f['pending'] .. ' pending'
  elseif not f['lag'] then
    reasons[#reasons + 1] = name .. ' lag unknown (nil)'
  elseif f['lag'] > 0 then
    reasons[#reasons + 1] = name .. ' lag ' .. f['lag']
  elseif cmp(f['last-delivered-id'], stream['last-generated-id']) < 0 then
    reasons[#reasons + 1] = name .. ' has undelivered entries (delivered up to '
      .. f['last-delivered-id'] .. ', last entry ' .. stream['last-generated-id'] .. ')'
  end
end
for i = 2, #ARGV do
  if not seen[ARGV[i]] then reasons[#reasons + 1] = 'group ' .. ARGV[i] .. ' missing on shard' end
end
if #reasons > 0 then return {0, table.concat(reasons, '; ')} end
if ARGV[1] == 'retire' then
  redis.call('DEL', unpack(KEYS))
end
return {1}
