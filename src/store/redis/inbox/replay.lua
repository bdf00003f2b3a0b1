-- ARGV: T, now, id, job. Puts a delivered, stale or dead event back to
-- pending for bulk job `job`: its attempts stay, and its replay mark names
-- the job and the attempts it had. Answers 'requeued', 'not_found' or the
-- status (pending or erased, or the job replayed it already).
local now, id, job = tonumber(ARGV[2]), ARGV[3], ARGV[4]
local ek = k('e', id)
local f = redis.call('HMGET', ek, 'st', 'hs', 'ca', 'r2', 'ls', 'at', 'rj')
if not f[1] then
  return 'not_found'
end
if f[7] == job or (f[1] ~= '1' and f[1] ~= '2' and f[1] ~= '3') then
  return f[1]
end
unindex_status(id, f[1], f[4])
redis.call('ZREM', k('x'), id)
-- A delivered or stale event is sent again whatever the head says (the
-- head never moves back); a dead one still yields to newer events, as its
-- redeliver does.
local fo = '1'
if f[1] == '3' then
  fo = '0'
end
-- A new lease generation: a turn still in flight finds its lease gone.
redis.call('HSET', ek, 'st', '0', 'fo', fo, 'du', fmt(now), 'ex', '0',
  'ls', fmt(tonumber(f[5]) + 1), 'rj', job, 'rb', f[6])
redis.call('HDEL', ek, 'lu')
index_status(id, '0', f[4])
enqueue(id, f[2], f[3], f[4], now, now)
return 'requeued'
