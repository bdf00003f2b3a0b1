-- ARGV: T, now, then either 'settled' and a limit: deletes up to that many
-- settled events whose expiry passed (answers {deleted, more}); or
-- 'pending' and event ids: deletes those of them still pending (answers
-- {deleted, 0}). Their dedupe records stay.
local now = tonumber(ARGV[2])
local ids
if ARGV[3] == 'settled' then
  ids = redis.call('ZRANGEBYSCORE', k('x'), '-inf', now, 'LIMIT', 0, tonumber(ARGV[4]))
else
  ids = {}
  for i = 4, #ARGV do
    ids[#ids + 1] = ARGV[i]
  end
end
local n = 0
for _, id in ipairs(ids) do
  local f = redis.call('HMGET', k('e', id), 'st', 'hs', 'ca', 'r2')
  if not f[1] then
    drop_ghost(id, now)
  elseif ARGV[3] == 'settled' or f[1] == '0' then
    if f[1] == '0' then
      dequeue(id, f[2], f[3], f[4], now)
    end
    unindex_status(id, f[1], f[4])
    redis.call('ZREM', k('x'), id)
    redis.call('DEL', k('e', id), k('t', id))
    n = n + 1
  end
end
local more = 0
if ARGV[3] == 'settled' and redis.call('ZCOUNT', k('x'), '-inf', now) > 0 then
  more = 1
end
return {n, more}
