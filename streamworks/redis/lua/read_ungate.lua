-- The end of a fenced read (see read_gate.lua): a shard the gate moved aside to its
-- hold key is moved back, in the same transaction.
--
-- KEYS[1]  shard stream
-- KEYS[2]  the shard's hold key
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('RENAME', KEYS[2], KEYS[1]) end
return 1
