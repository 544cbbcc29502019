-- Monotonic owner-fence write, done by the coordinator before it answers a grant.
--
-- A fence names the grant "<token>:<member id>" (the token: coordinator/core/tokens.py).
-- It is replaced only by a grant with a strictly higher token (or rewritten with the very
-- same value), so a replica acting on stale state can never fence out a newer owner,
-- and a shard's token never goes down.
--
-- The writer also says which tokens its metadata knows were issued: every token up to
-- ARGV[3]. A fence naming another member with a token above that was written from
-- metadata Redis has since lost (a failover or restore that lost writes while the
-- shard's slot kept its fence): that member may still be running the shard, so the
-- write is refused and the coordinator treats the loss (it fences and quarantines its
-- grantee, raises its token floor: core/recovery.py).
--
-- A shard that no longer exists (retired by a migration that raced with this grant)
-- gets no fence: it would be an orphan key, and the member's fenced read reports the
-- shard retired anyway.
--
-- KEYS[1]  owner fence of a group on a shard
-- KEYS[2]  the shard's stream (same slot)
-- ARGV[1]  the grant's token (integer)   ARGV[2]  member id
-- ARGV[3]  the highest token the writer's metadata recorded before this grant
--          (optional: without it only the monotonic rule applies)
--
-- Returns  {1, token}          written (or already equal)
--          {0, current}        refused: a newer or equal token of another member, or a
--                              token of another member the metadata never recorded
--          {2, current}        nothing written: a newer grant to the same member holds
--          {-2}                the shard does not exist: nothing written
if redis.call('EXISTS', KEYS[2]) == 0 then return {-2} end
local token = ARGV[1] .. ':' .. ARGV[2]
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= token then
  local held, owner = string.match(cur, '^(%d+):(.*)$')
  held = tonumber(held)
  if held then
    if held >= tonumber(ARGV[1]) then
      if owner == ARGV[2] then return {2, cur} end
      return {0, cur}
    end
    if ARGV[3] and held > tonumber(ARGV[3]) and owner ~= ARGV[2] then return {0, cur} end
  end
end
redis.call('SET', KEYS[1], token)
return {1, token}
