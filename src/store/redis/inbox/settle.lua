-- ARGV: T, now, id, lease generation, kind ('delivered', 'stale', 'retry'
-- or 'dead'), attempted ('1' or '0'), error, retry at, expiry, attempt
-- (JSON, '' for none), attempts kept, then for a delivered event with a
-- stream: its hs, ca and the head's expiry ('' for no head to move), slack.
local now, id = tonumber(ARGV[2]), ARGV[3]
local ek = k('e', id)
local exists = redis.call('EXISTS', ek) == 1
if exists and ARGV[10] ~= '' then
  redis.call('RPUSH', k('t', id), ARGV[10])
  redis.call('LTRIM', k('t', id), -tonumber(ARGV[11]), -1)
end
if ARGV[12] ~= '' then
  -- The head moves before the settle, as one write, whatever becomes of
  -- the settle: the application has the event, even if the inbox reaped
  -- it meanwhile (as the data file's inbox does).
  local hs, ca, head_until = ARGV[12], ARGV[13], tonumber(ARGV[14])
  local slack = tonumber(ARGV[15])
  local seen = redis.call('GET', k('a', id))
  if not (seen and tonumber(seen) > now) then
    redis.call('SET', k('a', id), fmt(head_until), 'PX', fmt(head_until - now + slack))
    local head = live_head(hs, now)
    if not (head and ca < head) then
      local hk = k('h', hs)
      redis.call('DEL', hk)
      redis.call('HSET', hk, 'c', ca, 'i', id, 'e', fmt(head_until))
      redis.call('PEXPIRE', hk, fmt(head_until - now + slack))
    end
  end
end
if not exists then
  return 'gone'
end
local f = redis.call('HMGET', ek, 'st', 'ls', 'at', 'hs', 'ca', 'r2', 'du')
if f[1] ~= '0' or f[2] ~= ARGV[4] then
  -- A later turn or a redeliver owns the event now.
  return 'ignored'
end
local kind = ARGV[5]
if ARGV[6] == '1' then
  redis.call('HSET', ek, 'at', fmt(tonumber(f[3]) + 1))
end
if ARGV[7] ~= '' and (kind == 'retry' or kind == 'dead') then
  redis.call('HSET', ek, 'er', ARGV[7])
elseif kind == 'delivered' then
  redis.call('HDEL', ek, 'er')
end
if kind == 'retry' then
  local retry_at = ARGV[8]
  redis.call('HSET', ek, 'du', retry_at)
  redis.call('HDEL', ek, 'lu')
  if redis.call('ZSCORE', k('run'), id) then
    redis.call('ZADD', k('run'), retry_at, id)
  end
  if f[4] ~= '' then
    fix_stream(f[4], now)
  end
  return 'done'
end
local st = '1'
if kind == 'stale' then
  st = '2'
elseif kind == 'dead' then
  st = '3'
end
finish(id, f[4], f[5], f[6], st, tonumber(ARGV[9]), now)
return 'done'
