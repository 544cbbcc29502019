-- Owner side of delayed messages: move the due ones of a shard into its stream.
--
-- Run by a member that owns the shard for its group, under that group's owner fence
-- (as read.lua and read_gate.lua check it): a member whose ownership moved on moves
-- nothing. Any group's owner may move them (a stream read by several groups has one
-- owner per group): the move is one script, so two owners never move one message
-- twice, and a shard is moved for as long as any group owns it.
--
-- Each due message (due <= Redis TIME + offset), in due order and, for one due time,
-- publish order, is added to the stream (XADD: a new entry id, so it takes its place
-- in its key's order now) and removed from the delayed set and entries in the same
-- script: no second copy, and nothing lost if the owner dies before or after. An
-- entry that cannot be unpacked is added as it is, under the field
-- 'delayed-undecodable', so the consumer dead-letters it as poison: never dropped.
--
-- KEYS[1]  shard stream
-- KEYS[2]  owner fence of the caller's group on the shard
-- KEYS[3]  the shard's delayed set (zset: delay id -> due ms)
-- KEYS[4]  the shard's delayed entries (hash: delay id -> packed fields)
-- ARGV[1]  grant token ("<fence token>:<member id>")
-- ARGV[2]  clock offset ms (0 in production; tests fast-forward with it)
-- ARGV[3]  most messages to move in this call
--
-- Returns  {1, moved, remaining, next_due, now, oldest_due}
--              next_due: due ms of the earliest message left (-1: none left);
--              oldest_due: due ms of the earliest message moved (-1: none moved)
--          {-1, current_fence}   fenced: the token does not match ('' if none)
--          {-2}                  the shard key does not exist (retired)
if redis.call('EXISTS', KEYS[1]) == 0 then return {-2} end
local fence = redis.call('GET', KEYS[2])
if fence ~= ARGV[1] then return {-1, fence or ''} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
local due = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'WITHSCORES',
                       'LIMIT', 0, tonumber(ARGV[3]))
local moved, oldest = 0, -1
for i = 1, #due, 2 do
  local id = due[i]
  local packed = redis.call('HGET', KEYS[4], id)
  if packed then
    local ok, fields = pcall(cmsgpack.unpack, packed)
    if ok and type(fields) == 'table' and #fields > 0 and #fields % 2 == 0 then
      redis.call('XADD', KEYS[1], 'NOMKSTREAM', '*', unpack(fields))
    else
      redis.call('XADD', KEYS[1], 'NOMKSTREAM', '*', 'delayed-undecodable', packed)
    end
    moved = moved + 1
    if oldest < 0 then oldest = tonumber(due[i + 1]) end
  end
  redis.call('ZREM', KEYS[3], id)
  redis.call('HDEL', KEYS[4], id)
end
local head = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
local next_due = -1
if #head > 0 then next_due = tonumber(head[2]) end
return {1, moved, redis.call('ZCARD', KEYS[3]), next_due, now, oldest}
