-- Shared by every dedupd script. Time is the caller's clock (ARGV), in Unix
-- milliseconds, so a record whose stored expiry `e` is <= now reads as
-- absent whether or not Redis has expired the key yet. Redis's own expiry
-- (PEXPIRE, a little after `e`) only reclaims memory.
local function fmt(n)
  return string.format('%.0f', n)
end

-- A claim record: s = 'p' (processing) | 'd' (done), t = token, f = fence,
-- e = expires_at_ms, fp = fingerprint ('' for none). nil when absent or
-- expired at `now`.
local function live_claim(key, now)
  local r = redis.call('HMGET', key, 's', 't', 'f', 'e', 'fp')
  if not r[1] or tonumber(r[4]) <= now then
    return nil
  end
  r[5] = r[5] or ''
  return r
end

local function put_claim(key, s, t, f, e, fp, now, slack)
  redis.call('DEL', key)
  redis.call('HSET', key, 's', s, 't', t, 'f', f, 'e', fmt(e), 'fp', fp)
  redis.call('PEXPIRE', key, fmt(e - now + slack))
end
