-- Shared by every dedupd script. Time is the caller's clock (ARGV), in Unix
-- milliseconds, so a record whose stored expiry `e` is <= now reads as
-- absent whether or not Redis has expired the key yet. Redis's own expiry
-- (PEXPIRE, a little after `e`) only reclaims memory.
local function fmt(n)
  return string.format('%.0f', n)
end

-- A claim record: s = 'p' (processing) | 'd' (done), t = token, f = fence,
-- e = expires_at_ms, fp = fingerprint ('' for none), r = the result a done
-- keeps (JSON text; absent for none). nil when absent or expired at `now`;
-- otherwise {s, t, f, e, fp, r}, with '' for no fingerprint or result.
local function live_claim(key, now)
  local r = redis.call('HMGET', key, 's', 't', 'f', 'e', 'fp', 'r')
  if not r[1] or tonumber(r[4]) <= now then
    return nil
  end
  r[5] = r[5] or ''
  r[6] = r[6] or ''
  return r
end

-- `result`: JSON text, or '' or nil for none.
local function put_claim(key, s, t, f, e, fp, now, slack, result)
  redis.call('DEL', key)
  if result and result ~= '' then
    redis.call('HSET', key, 's', s, 't', t, 'f', f, 'e', fmt(e), 'fp', fp, 'r', result)
  else
    redis.call('HSET', key, 's', s, 't', t, 'f', f, 'e', fmt(e), 'fp', fp)
  end
  redis.call('PEXPIRE', key, fmt(e - now + slack))
end

-- The next fence from `counter`, never at or below `floor`: in a cluster
-- each slot has a counter, and each starts above the one counter of the
-- one-slot layout that earlier versions used (see upgrade.rs).
local function next_fence(counter, floor)
  if floor > 0 and tonumber(redis.call('GET', counter) or '0') < floor then
    redis.call('SET', counter, fmt(floor))
  end
  return redis.call('INCR', counter)
end
