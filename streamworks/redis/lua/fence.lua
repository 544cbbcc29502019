-- Monotonic owner-fence write, done by the coordinator before it answers a grant.
--
-- A fence names the grant "<epoch>:<member id>". It is replaced only by a grant of a
-- strictly newer epoch (or rewritten with the very same token), so a replica acting
-- on stale state can never fence out a newer owner.
--
-- A shard that no longer exists (retired by a migration that raced with this grant)
-- gets no fence: it would be an orphan key, and the member's fenced read reports the
-- shard retired anyway.
--
-- KEYS[1]  owner fence of a group on a shard
-- KEYS[2]  the shard's stream (same slot)
-- ARGV[1]  grant epoch (integer)   ARGV[2]  member id
--
-- Returns  {1, token}          written (or already equal)
--          {0, current}        refused: the current fence has a newer or equal epoch
--          {-2}                the shard does not exist: nothing written
if redis.call('EXISTS', KEYS[2]) == 0 then return {-2} end
local token = ARGV[1] .. ':' .. ARGV[2]
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= token then
  local e = tonumber(string.match(cur, '^(%d+):'))
  if e and e >= tonumber(ARGV[1]) then return {0, cur} end
end
redis.call('SET', KEYS[1], token)
return {1, token}
