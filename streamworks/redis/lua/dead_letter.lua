-- Write one dead-letter entry at most once per (group, source key, entry id).
--
-- The markers of a group's dead-letter stream are one sorted set beside it (same hash
-- tag, so the check and the write run in one script in that slot): member
-- "<source key>|<entry id>", score the time (ms, Redis clock) until which the marker is
-- kept. A second write of the same entry (the next owner completing a dead-lettering
-- its predecessor recorded and may have written before it crashed, or a stale member
-- that recorded it before it lost the shard) finds the marker and writes nothing.
--
-- Bounded: one key per dead-letter stream, not one per dead letter; every call first
-- drops the markers whose time ran out (each is dropped once), and the key itself
-- expires with its last marker. A marker is kept ARGV[1] ms: far longer than an entry
-- stays pending between its final failure and its ack, whoever acks it.
--
-- KEYS[1]  the markers of the dead-letter stream (Keyspace.dead_letter_markers)
-- KEYS[2]  dead-letter stream of the group and stream
-- KEYS[3]  the entry's marker as earlier versions wrote it (a string key of its own,
--          Keyspace.dead_letter_marker): read only, so that an entry an older worker
--          dead-lettered is not written again after an upgrade
-- ARGV[1]  marker TTL (ms)
-- ARGV[2]  the marker: "<source key>|<entry id>"
-- ARGV[3..] field, value, field, value, ... of the entry
--
-- Returns  {1, entry_id}   written now
--          {0, entry_id}   written before ('' when only the new marker says so)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[2]) then return {0, ''} end
local legacy = redis.call('GET', KEYS[3])
if legacy then return {0, legacy} end
local id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 3))
local ttl = tonumber(ARGV[1])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
redis.call('PEXPIRE', KEYS[1], ttl)
return {1, id}
