-- Create a shard's stream key together with the consumer group of every registered
-- group, atomically, before any producer can route to it. This is the only use of
-- MKSTREAM in streamworks: the data plane never creates keys, so a retired shard is
-- never resurrected. Groups start at 0 with ENTRIESREAD 0, so `lag` is valid at once.
--
-- KEYS[1]  shard stream
-- ARGV     group names (may be empty: the key is then created with no group, so
--          producers can write before any group subscribes)
--
-- Returns  1 created, 0 the key already existed (groups left as they are)
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if #ARGV == 0 then
  -- XGROUP CREATE ... MKSTREAM is the only way to create an empty stream; the helper
  -- group is destroyed at once and the empty key stays.
  redis.call('XGROUP', 'CREATE', KEYS[1], '__streamworks_init', '0', 'MKSTREAM')
  redis.call('XGROUP', 'DESTROY', KEYS[1], '__streamworks_init')
  return 1
end
for i, g in ipairs(ARGV) do
  if i == 1 then
    redis.call('XGROUP', 'CREATE', KEYS[1], g, '0', 'MKSTREAM', 'ENTRIESREAD', 0)
  else
    redis.call('XGROUP', 'CREATE', KEYS[1], g, '0', 'ENTRIESREAD', 0)
  end
end
return 1
