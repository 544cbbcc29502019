-- Drain check of a removed shard, and its atomic retirement.
--
-- Drained means, for every group that must exist on the shard (the ones the registry
-- names in ARGV, and the ones in the shard's own group set): the group exists, has no
-- pending entries, reports lag == 0 (nil is *not* proven, E12), and its
-- last-delivered-id has reached the stream's last-generated-id (nothing was added after
-- what it read). Groups present on the shard but not registered are checked too. A
-- shard that still holds entries but has no consumer group at all is not drained
-- either: nobody has read those entries (a group that subscribes later from the
-- earliest entry would). No entry is read: the evidence is consumer-group metadata.
--
-- Repair (Redis < 7.4 forgets `entries-read` on an AOF reload, so `lag` stays above 0
-- or nil on a shard read to the end, PROTOCOL section 6 step 2): when every required
-- group is present, a group with no pending entries whose last-delivered-id is *equal*
-- to the stream's last-generated-id has delivered every entry ever added (no id is
-- above last-generated-id); if its lag is nil or above 0, its ENTRIESREAD is set to the
-- stream's entries-added here, so lag is exactly 0. Never `>=`: XSETID can lower
-- last-generated-id below a group's position, and an entry added after that sits
-- below the group's position, undelivered. A repaired shard is reported, not retired:
-- a later check retires it on the repaired evidence. 'retire' and 'repair' repair;
-- 'check' writes nothing and names the group as repairable. 'repair' never deletes:
-- it serves shards that stay (an ACTIVE shard whose lag a restart broke).
--
-- When ARGV[1] is 'retire' and the check passes, the shard key, its group set and its
-- fences and retry records are deleted in the same script, so a stale producer's
-- XADD NOMKSTREAM fails from then on (E16). Publish dedup records are left to expire:
-- they must outlive the shard (E18).
--
-- Replayed dead letters (``dlq replay``) wait in each group's redelivery stream of the
-- shard, read by the shard's owner and deleted once handled: one that still holds an
-- entry keeps the shard (retiring it would delete a message nobody handled). So does
-- the shard's delayed set (a sorted set among those keys, which XLEN refuses) while
-- it holds a delayed message: the shard's owner moves it into the stream when it is
-- due, and only then can it be read and the shard drained.
--
-- KEYS[1]   shard stream
-- KEYS[2]   the shard's group set (deleted with it)
-- KEYS[3..2+n] the groups' redelivery streams and the shard's delayed set (must be
--              empty; deleted with it)
-- KEYS[3+n..] more keys to delete with it (fences, retry records)
-- ARGV[1]   'check' | 'retire' | 'repair'
-- ARGV[2]   n, the number of those keys (redelivery streams, delayed set) in KEYS
-- ARGV[3..] groups the registry says must exist on the shard
--
-- Returns  {2}              the shard key is already gone
--          {1}              drained (and retired when asked; never for 'repair')
--          {0, reasons}     not (yet) proven drained; every group's reason, '; '-joined
--          {3, reasons}     lag repaired for the groups named (nothing retired; the
--                           reasons also name anything else still in the way)
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
local required, order = {}, {}
local redeliveries = tonumber(ARGV[2])
for i = 3, #ARGV do
  if not required[ARGV[i]] then required[ARGV[i]] = true; order[#order + 1] = ARGV[i] end
end
for _, name in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  -- '!unsealed' is for trimming: ARGV carries a registry read of this critical section.
  if name ~= '!unsealed' and not required[name] then
    required[name] = true; order[#order + 1] = name
  end
end
local reasons = {}
if #groups == 0 and stream['length'] > 0 then
  reasons[#reasons + 1] = 'no consumer group has read its ' .. stream['length'] .. ' entries'
end
local seen, rows = {}, {}
for _, g in ipairs(groups) do
  local f = {}
  for j = 1, #g, 2 do f[g[j]] = g[j + 1] end
  seen[f['name']] = true
  rows[#rows + 1] = f
end
local missing = false
for _, name in ipairs(order) do
  if not seen[name] then
    missing = true
    reasons[#reasons + 1] = 'group ' .. name .. ' missing on shard'
  end
end
for i = 3, 2 + redeliveries do
  local waiting = redis.pcall('XLEN', KEYS[i])
  if type(waiting) == 'table' then
    -- Not a stream (WRONGTYPE): the shard's delayed set (delay_add.lua), messages not
    -- in the stream yet. (Told apart this way, not with TYPE, so a caller that passes
    -- only redelivery streams needs no permission it did not need before.)
    local delayed = redis.call('ZCARD', KEYS[i])
    if delayed > 0 then
      local head = redis.call('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES')
      reasons[#reasons + 1] = KEYS[i] .. ' holds ' .. delayed
        .. ' delayed message(s) not in the stream yet (next due at ' .. head[2] .. ' ms)'
    end
  elseif waiting > 0 then
    reasons[#reasons + 1] = KEYS[i] .. ' holds ' .. waiting .. ' replayed dead letter(s) not handled yet'
  end
end
local repaired = {}
for _, f in ipairs(rows) do
  local name = 'group ' .. f['name']
  local wrong = (not f['lag']) or f['lag'] > 0
  local repairable = f['pending'] == 0 and wrong and not missing
    and cmp(f['last-delivered-id'], stream['last-generated-id']) == 0
  if repairable and ARGV[1] == 'check' then
    reasons[#reasons + 1] = name .. ' lag ' .. (f['lag'] or 'nil')
      .. ' although it delivered every entry (a retire call repairs it)'
  elseif repairable then
    redis.call('XGROUP', 'SETID', KEYS[1], f['name'], f['last-delivered-id'],
               'ENTRIESREAD', stream['entries-added'])
    repaired[#repaired + 1] = name .. ' lag ' .. (f['lag'] or 'nil') .. ' repaired to 0 (entries-read '
      .. (f['entries-read'] or 'nil') .. ' -> ' .. stream['entries-added'] .. ')'
  elseif f['pending'] > 0 then
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
if #repaired > 0 then
  for _, r in ipairs(reasons) do repaired[#repaired + 1] = r end
  return {3, table.concat(repaired, '; ')}
end
if #reasons > 0 then return {0, table.concat(reasons, '; ')} end
if ARGV[1] == 'retire' then redis.call('DEL', unpack(KEYS)) end
return {1}
