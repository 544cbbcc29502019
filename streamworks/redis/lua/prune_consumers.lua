-- Remove the group's consumers that own nothing, after a takeover claimed their
-- pending entries. Atomic, so a consumer is deleted only while its pending list is
-- empty (XGROUP DELCONSUMER drops a consumer's pending entries for good).
--
-- KEYS[1]  shard stream
-- ARGV[1]  group   ARGV[2]  consumer to keep (the caller)
--
-- Returns  number of consumers removed; -2 when the stream does not exist
if redis.call('EXISTS', KEYS[1]) == 0 then return -2 end
local removed = 0
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local f = {}
  for j = 1, #c, 2 do f[c[j]] = c[j + 1] end
  if f['name'] ~= ARGV[2] and f['pending'] == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], f['name'])
    removed = removed + 1
  end
end
return removed
