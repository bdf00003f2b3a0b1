-- ARGV: T, now, id. Answers 'requeued', 'not_found' or the status.
local now, id = tonumber(ARGV[2]), ARGV[3]
local ek = k('e', id)
local f = redis.call('HMGET', ek, 'st', 'hs', 'ca', 'r2', 'ls')
if not f[1] then
  return 'not_found'
end
if f[1] ~= '2' and f[1] ~= '3' then
  return f[1]
end
unindex_status(id, f[1], f[4])
redis.call('ZREM', k('x'), id)
-- Only a stale event is delivered despite the head: the operator asked
-- for it. A dead one still yields to newer events.
local fo = '0'
if f[1] == '2' then
  fo = '1'
end
redis.call('HSET', ek, 'st', '0', 'fo', fo, 'at', '0', 'du', fmt(now), 'ex', '0',
  'ls', fmt(tonumber(f[5]) + 1))
-- The operator's redeliver starts afresh: no bulk job's replay any more.
redis.call('HDEL', ek, 'rj', 'rb')
index_status(id, '0', f[4])
enqueue(id, f[2], f[3], f[4], now, now)
return 'requeued'
