-- The fence of a fenced read, run just before the read in one transaction:
--
--   MULTI
--   EVAL read_gate 3 <shard> <fence> <hold> <token>
--   XREADGROUP GROUP <group> <member> COUNT <n> STREAMS <shard> >
--   EVAL read_ungate 2 <shard> <hold>
--   EXEC
--
-- A transaction runs as one step, so nothing happens between this check and the read.
-- The entries go to the client straight from XREADGROUP: a script that read them itself
-- (read.lua) converts every entry to Lua values and back, which costs the server more
-- than the read does.
--
-- When the fence names another grant, the shard is moved aside to the hold key (same
-- slot) for the rest of the transaction: the read finds no stream (NOGROUP) and takes
-- nothing, and read_ungate moves it back before anyone else can see it missing.
-- Sent with EVAL, not EVALSHA: a script missing from the cache (a restarted server)
-- would fail inside the transaction while the read after it ran unchecked.
--
-- KEYS[1]  shard stream
-- KEYS[2]  owner fence of the group on the shard
-- KEYS[3]  the shard's hold key
-- ARGV[1]  grant token ("<fence token>:<member id>")
--
-- Returns  {1, last_entry_id}   the read is the owner's ('0-0' when the stream is
--                               empty; a caller that reads nothing waits for entries
--                               after it)
--          {-1, current_fence}  fenced ('' if none): the read takes nothing
--          {-2}                 the shard key does not exist (retired)
if redis.call('EXISTS', KEYS[1]) == 0 then
  -- Defensive: a transaction is all or nothing, so a held stream cannot outlive one.
  if redis.call('EXISTS', KEYS[3]) == 0 then return {-2} end
  redis.call('RENAME', KEYS[3], KEYS[1])
end
local fence = redis.call('GET', KEYS[2])
if fence ~= ARGV[1] then
  redis.call('RENAME', KEYS[1], KEYS[3])
  return {-1, fence or ''}
end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #last == 0 then return {1, '0-0'} end
return {1, last[1][1]}
