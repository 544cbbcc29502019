-- Fenced write of one retry record of a group on a shard.
--
-- Only the shard's owner may record an attempt, a due time or a final failure: the
-- write is refused unless the shard's owner fence for the group still holds the
-- caller's grant token (as in read.lua), so a member that lost the shard (paused past
-- its lease, fenced) cannot overwrite what the next owner relies on. A retired shard
-- has no fence: refused too, so nothing is written into its slot.
--
-- KEYS[1]  owner fence of the group on the shard
-- KEYS[2]  retry records of the group on the shard (hash)
-- ARGV[1]  grant token ("<fence token>:<member id>")
-- ARGV[2]  'set' | 'incr'
-- ARGV[3]  field (entry id, or "<entry id>:runs")
-- ARGV[4]  value ('set') or increment ('incr')
--
-- Returns  {1, value}            written ('set': 1; 'incr': the new count)
--          {-1, current_fence}   fenced: the token does not match ('' if none)
local fence = redis.call('GET', KEYS[1])
if fence ~= ARGV[1] then return {-1, fence or ''} end
if ARGV[2] == 'incr' then
  return {1, redis.call('HINCRBY', KEYS[2], ARGV[3], ARGV[4])}
end
redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
return {1, 1}
