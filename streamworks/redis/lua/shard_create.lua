-- Create a shard's stream key together with the consumer group of every registered
-- group, atomically, before any producer can route to it. This is the only use of
-- MKSTREAM in streamworks: the data plane never creates keys, so a retired shard is
-- never resurrected. Groups start at 0 with ENTRIESREAD 0, so `lag` is valid at once.
--
-- In the same script the groups are written to the shard's group set (the groups that
-- must exist on it: trim.lua and retire.lua refuse while one is missing). 'provisional'
-- also adds the '!unsealed' marker, which makes trim.lua refuse until the coordinator
-- has re-read the registry after committing the layout (shard_groups.lua): a group that
-- subscribed meanwhile is then on the list before anyone trims (scale-out, docs/protocol.md#migrations).
--
-- KEYS[1]  shard stream
-- KEYS[2]  the shard's group set
-- ARGV[1]  'sealed' | 'provisional'
-- ARGV[2..] group names (may be empty: the key is then created with no group, so
--          producers can write before any group subscribes)
--
-- Returns  1 created, 0 the key already existed (groups and set left as they are)
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if #ARGV == 1 then
  -- XGROUP CREATE ... MKSTREAM is the only way to create an empty stream; the helper
  -- group is destroyed at once and the empty key stays.
  redis.call('XGROUP', 'CREATE', KEYS[1], '__streamworks_init', '0', 'MKSTREAM')
  redis.call('XGROUP', 'DESTROY', KEYS[1], '__streamworks_init')
else
  for i = 2, #ARGV do
    if i == 2 then
      redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[i], '0', 'MKSTREAM', 'ENTRIESREAD', 0)
    else
      redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[i], '0', 'ENTRIESREAD', 0)
    end
  end
end
-- A leftover set of an aborted creation of this very key is replaced, not merged.
redis.call('DEL', KEYS[2])
if #ARGV > 1 then redis.call('SADD', KEYS[2], unpack(ARGV, 2)) end
if ARGV[1] == 'provisional' then redis.call('SADD', KEYS[2], '!unsealed') end
return 1
