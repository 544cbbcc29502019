-- Group-wide rate limit: reserve start times for runs from GCRA buckets.
--
-- A bucket is one number, its theoretical arrival time (tat, ms on the Redis clock):
-- the first run may start at max(now, tat - tolerance), and each run reserved pushes
-- tat one interval on. A member asks once per read batch for as many runs as it has
-- messages (per bucket: one bucket for the handler, or one per rate-limit key) and
-- gets how many start within the horizon and when the first may start; the i-th
-- (from 0) then waits base + i * interval - tolerance ms (streamworks/ratelimit.py,
-- whose reserve() is this algorithm in Python, with the same arithmetic). Messages are
-- never failed for want of a run: the member holds them until their start time, and
-- asks again for those beyond the horizon.
--
-- The buckets of one handler share a hash tag (one slot), so one call covers every
-- key of a batch. A bucket expires a second after its tat has passed: an expired bucket
-- and an idle one allow the same (a full burst; a tat in the past counts as now), and
-- the second of slack keeps a bucket whose clock a test moved (the offset) from
-- depending on how fast real time passes between two calls.
--
-- KEYS[1..n]  buckets
-- ARGV[1]     interval ms (period / count, decimal text)
-- ARGV[2]     tolerance ms ((burst - 1) * interval)
-- ARGV[3]     horizon ms: no run is reserved to start later than now + horizon
-- ARGV[4]     clock offset ms (0 in production; tests fast-forward with it)
-- ARGV[4+i]   runs wanted from KEYS[i]
--
-- Returns  {now, granted_1, base_1, granted_2, base_2, ...}: now and each base as
--          decimal text (ms; Lua numbers would be truncated to integers in the reply)
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local horizon = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000 + tonumber(ARGV[4])
local out = {string.format('%.6f', now)}
for i = 1, #KEYS do
  local wanted = tonumber(ARGV[4 + i])
  local tat = tonumber(redis.call('GET', KEYS[i]) or '')
  if (not tat) or tat < now then tat = now end
  local base = tat - now
  local granted = 0
  if base - tolerance <= horizon then
    granted = math.min(wanted, math.floor((horizon + tolerance - base) / interval) + 1)
  end
  if granted > 0 then
    tat = tat + granted * interval
    redis.call('SET', KEYS[i], string.format('%.6f', tat),
               'PX', math.floor(tat - now) + 1000)
  end
  out[#out + 1] = granted
  out[#out + 1] = string.format('%.6f', base)
end
return out
