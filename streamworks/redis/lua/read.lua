-- Fenced read of new entries for one consumer group on one shard.
--
-- The read is refused unless the shard's owner fence for the group still holds the
-- caller's grant token, so a member whose ownership moved on (e.g. it was paused past
-- its lease) cannot pull entries into its pending list. Never blocks (BLOCK is not
-- allowed in scripts on Redis <= 7.2); the caller waits for new entries separately,
-- from the last entry id this script returns.
--
-- KEYS[1]  shard stream
-- KEYS[2]  owner fence of the group on the shard
-- ARGV[1]  group            ARGV[2]  consumer (member id)
-- ARGV[3]  grant token ("<fence token>:<member id>")
-- ARGV[4]  COUNT
--
-- Returns  {1, entries}           new entries ([id, fields] pairs)
--          {0, last_entry_id}     nothing new; wait for entries after this id
--          {-1, current_fence}    fenced: the token does not match ('' if none)
--          {-2}                   the shard key does not exist (retired)
if redis.call('EXISTS', KEYS[1]) == 0 then return {-2} end
local fence = redis.call('GET', KEYS[2])
if fence ~= ARGV[3] then return {-1, fence or ''} end
local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[4],
                     'STREAMS', KEYS[1], '>')
if r then return {1, r[1][2]} end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #last == 0 then return {0, '0-0'} end
return {0, last[1][1]}
