-- A periodic schedule's tick state, kept by the member that owns the schedule shard.
--
-- A schedule belongs to its group's owner of the schedule shard (shard 0 of the
-- internal stream 'sw-schedules'); every write here is fenced by that group's owner
-- fence on it, so a member whose ownership moved on changes nothing. Publishing a
-- tick cannot share a script with this state (the target shard has its own slot), so
-- a tick goes through three steps, each atomic (docs/design/scheduling.md):
--
--   claim   record the tick as pending together with the target shard it is
--           published to: from then on every attempt, by any owner, publishes it
--           to that shard with the tick's event id (publish_dedup.lua), so the
--           shard's dedup record keeps one message however often it is retried;
--   reroute only if that shard was retired before the tick reached it (the dedup
--           record there says whether it did): move the pending tick to the shard
--           now routed, compare-and-set, so every retrier ends on one shard;
--   done    the publish was acknowledged: the tick becomes the last one, nothing
--           is pending, and a tick at or before it is never claimed again.
--
-- A tick is never claimed before it is due on the Redis clock (no early publish).
-- 'open' initialises a new schedule at now (ticks before it existed are not owed),
-- records its definition and target for status, and reports the state; 'plan'
-- records the next tick for status.
--
-- KEYS[1]  owner fence of the group on the schedule shard
-- KEYS[2]  the schedule's state (hash)
-- KEYS[3]  the group's schedule names on the shard (set, for status)
-- ARGV[1]  grant token ("<fence token>:<member id>")
-- ARGV[2]  clock offset ms (0 in production; tests fast-forward with it)
-- ARGV[3]  'open' | 'plan' | 'claim' | 'reroute' | 'done'
-- ARGV[4]  schedule name
-- ARGV[5..] open:    definition text, target stream
--           plan:    next tick ms
--           claim:   tick ms, target shard id, ticks skipped before it (catch-up)
--           reroute: tick ms, shard it was claimed for, shard now routed
--           done:    tick ms, entry id, 'published' | 'duplicate', next tick ms
--
-- Returns  {-1, current_fence}          fenced ('' if none): nothing written
--          open:    {1, now, last, pending tick or '', its shard or ''}
--          plan:    {1, now}
--          claim:   {1, now}             claimed: publish it to the shard given
--                   {0, pending, shard}  another tick is pending: finish it first
--                   {2, last}            already done (at or before the last tick)
--                   {-3, now}            not due yet
--          reroute: {1, shard}           moved to the new shard
--                   {0, shard}           already moved (by another attempt) to shard
--                   {2, last}            no longer pending (done)
--          done:    {1, now}             recorded
--                   {2, last}            already recorded
--                   {0, pending or ''}   that tick was not claimed: nothing written
local fence = redis.call('GET', KEYS[1])
if fence ~= ARGV[1] then return {-1, fence or ''} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
local mode, name, state = ARGV[3], ARGV[4], KEYS[2]
if mode == 'open' then
  redis.call('HSETNX', state, 'last', string.format('%d', now))
  redis.call('HSET', state, 'spec', ARGV[5], 'stream', ARGV[6])
  redis.call('SADD', KEYS[3], name)
  local s = redis.call('HMGET', state, 'last', 'pending', 'shard')
  return {1, now, s[1], s[2] or '', s[3] or ''}
end
if mode == 'plan' then
  redis.call('HSET', state, 'next', ARGV[5])
  return {1, now}
end
local tick = tonumber(ARGV[5])
local s = redis.call('HMGET', state, 'last', 'pending', 'shard')
local last, pending, shard = tonumber(s[1] or ''), s[2], s[3]
if pending == '' then pending = nil end
if mode == 'claim' then
  if tick > now then return {-3, now} end
  if pending then return {0, pending, shard or ''} end
  if last and tick <= last then return {2, s[1]} end
  redis.call('HSET', state, 'pending', ARGV[5], 'shard', ARGV[6],
             'claimed_at', string.format('%d', now))
  redis.call('HINCRBY', state, 'skipped', tonumber(ARGV[7]))
  return {1, now}
end
if mode == 'reroute' then
  if pending ~= ARGV[5] then return {2, s[1] or ''} end
  if shard ~= ARGV[6] then return {0, shard or ''} end
  redis.call('HSET', state, 'shard', ARGV[7])
  return {1, ARGV[7]}
end
if mode == 'done' then
  local outcome = ARGV[7]
  if outcome ~= 'published' and outcome ~= 'duplicate' then
    return redis.error_reply('schedule_tick: unknown outcome ' .. tostring(outcome))
  end
  if pending == ARGV[5] then
    redis.call('HSET', state, 'last', ARGV[5], 'pending', '', 'last_shard', shard or '',
               'last_entry', ARGV[6], 'last_at', string.format('%d', now), 'next', ARGV[8])
    redis.call('HDEL', state, 'shard', 'claimed_at')
    redis.call('HINCRBY', state, outcome, 1)
    return {1, now}
  end
  if last and tick <= last then return {2, s[1]} end
  return {0, pending or ''}
end
return redis.error_reply('schedule_tick: unknown mode ' .. tostring(mode))
