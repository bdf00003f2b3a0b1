-- ARGV: T, now, id, expiry. Erases an event: its body goes, its headers
-- become [], its status erased (4), kept until the expiry and reaped as
-- settled events are (its dedupe record, written at ingest, stays). A
-- pending event leaves its stream's queue and the runnable index, and its
-- stream's turn passes on. Answers 'erased', 'already' or 'not_found'.
local now, id = tonumber(ARGV[2]), ARGV[3]
local ek = k('e', id)
local f = redis.call('HMGET', ek, 'st', 'hs', 'ca', 'r2', 'ls')
if not f[1] then
  return 'not_found'
end
if f[1] == '4' then
  return 'already'
end
if f[1] == '0' then
  dequeue(id, f[2], f[3], f[4], now)
else
  redis.call('ZREM', k('x'), id)
end
unindex_status(id, f[1], f[4])
-- A new lease generation: a turn still in flight finds its lease gone
-- (and the status not pending), so its settle is ignored.
redis.call('HSET', ek, 'st', '4', 'hd', '[]', 'bb', '0', 'fo', '0', 'du', fmt(now),
  'ex', ARGV[4], 'ls', fmt(tonumber(f[5]) + 1))
redis.call('HDEL', ek, 'bd', 'lu', 'rj', 'rb')
index_status(id, '4', f[4])
redis.call('ZADD', k('x'), ARGV[4], id)
return 'erased'
