-- KEYS[1] claim. ARGV: now, ttl_ms, token, slack_ms.
local now = tonumber(ARGV[1])
local r = live_claim(KEYS[1], now)
if not r then
  return {'lost'}
end
if r[1] == 'd' then
  return {'done', r[4]}
end
if r[2] ~= ARGV[3] then
  return {'not_owner', r[4]}
end
local e = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'e', fmt(e))
redis.call('PEXPIRE', KEYS[1], fmt(e - now + tonumber(ARGV[4])))
return {'extended', fmt(e)}
