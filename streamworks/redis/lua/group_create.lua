-- Create one consumer group on an existing shard, never the shard key itself.
--
-- `earliest` starts before the first entry still in the stream; `latest` starts at
-- the tail. Either way ENTRIESREAD is seeded from XINFO STREAM in the same script
-- (entries-added minus what is still readable), so `lag` is valid immediately
-- instead of nil until the first read (research brief, redis-streams.md 1.3 B/H).
-- The group is added to the shard's group set in the same script (also when it
-- already existed), so trimming and retirement wait for it from now on.
--
-- KEYS[1]  shard stream
-- KEYS[2]  the shard's group set
-- ARGV[1]  group   ARGV[2]  'earliest' | 'latest'
--
-- Returns  1 created, 0 already existed, -2 the shard key does not exist
if redis.call('EXISTS', KEYS[1]) == 0 then return -2 end
redis.call('SADD', KEYS[2], ARGV[1])
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  for j = 1, #g, 2 do
    if g[j] == 'name' and g[j + 1] == ARGV[1] then return 0 end
  end
end
local info = redis.call('XINFO', 'STREAM', KEYS[1])
local f = {}
for j = 1, #info, 2 do f[info[j]] = info[j + 1] end
if ARGV[2] == 'latest' then
  redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], f['last-generated-id'],
             'ENTRIESREAD', f['entries-added'])
else
  redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0',
             'ENTRIESREAD', f['entries-added'] - f['length'])
end
return 1
