-- Create a shard's stream key together with the consumer group of every registered
-- group, atomically, before any producer can route to it. This is the only use of
-- MKSTREAM in streamworks: the data plane never creates keys, so a retired shard is
-- never resurrected. Groups start at 0 with ENTRIESREAD 0, so `lag` is valid at once.
--
-- KEYS[1]  shard stream
-- ARGV     group names (at least one)
--
-- Returns  1 created, 0 the key already existed (groups left as they are)
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
for i, g in ipairs(ARGV) do
  if i == 1 then
    redis.call('XGROUP', 'CREATE', KEYS[1], g, '0', 'MKSTREAM', 'ENTRIESREAD', 0)
  else
    redis.call('XGROUP', 'CREATE', KEYS[1], g, '0', 'ENTRIESREAD', 0)
  end
end
return 1
