-- Extend a mutex only if we still hold it (compare-and-PEXPIRE of our token): a long
-- operation (an unsubscribe over thousands of shards, a drain check of every removed
-- shard) keeps its exclusion for as long as it runs, and learns the moment it lost it
-- (expired during a pause and maybe taken by another replica), before its next step.
--
-- KEYS[1]  mutex key   ARGV[1]  our token   ARGV[2]  TTL (ms) from now
-- Returns  1 extended, 0 not ours (expired, maybe taken by another replica)
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
