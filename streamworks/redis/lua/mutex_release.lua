-- Release a mutex only if we still hold it (compare-and-delete of our token), so a
-- replica whose mutex expired during a pause cannot release someone else's.
--
-- KEYS[1]  mutex key   ARGV[1]  our token
-- Returns  1 released, 0 not ours (expired and maybe taken by another replica)
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
