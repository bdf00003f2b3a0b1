-- ARGV: T, now, id, until (or 'ghost': only drop the id if its row is
-- gone), stale check ('1' or '0'), expiry if stale.
-- Answers {'leased', generation, attempts, forced, replay job, its base
-- attempts} (the last two '' without a replay mark), {'stale'} or {}.
-- An id without its row is dropped from the indexes.
local now, id, until_ms = tonumber(ARGV[2]), ARGV[3], ARGV[4]
local ek = k('e', id)
local f = redis.call('HMGET', ek, 'st', 'du', 'hs', 'ca', 'r2', 'ls', 'at', 'fo', 'rj', 'rb')
if not f[1] then
  drop_ghost(id, now)
  return {}
end
if until_ms == 'ghost' then
  -- Only the clean-up of an id whose row was missing at a read.
  return {}
end
if f[1] ~= '0' or tonumber(f[2]) > now or not redis.call('ZSCORE', k('run'), id) then
  return {}
end
local hs = f[3]
if hs ~= '' then
  -- A lease that ran out hands the stream's turn to its oldest event.
  fix_stream(hs, now)
  if redis.call('HGET', k('rn'), hs) ~= id then
    return {}
  end
end
local ls = tonumber(f[6]) + 1
redis.call('HSET', ek, 'du', until_ms, 'lu', until_ms, 'ls', fmt(ls))
redis.call('ZADD', k('run'), until_ms, id)
if ARGV[5] == '1' and hs ~= '' and f[8] ~= '1' then
  local head = live_head(hs, now)
  if head and f[4] < head then
    finish(id, hs, f[4], f[5], '2', tonumber(ARGV[6]), now)
    return {'stale'}
  end
end
return {'leased', fmt(ls), f[7], f[8], f[9] or '', f[10] or ''}
