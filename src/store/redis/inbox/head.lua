-- ARGV: T, now, hs, ca, event id, until, slack ms. Sets stream hs's head
-- unless a live one is as new or newer: 1 when set, 0 when kept.
local now, hs, ca = tonumber(ARGV[2]), ARGV[3], ARGV[4]
local head = live_head(hs, now)
if head and ca <= head then
  return 0
end
local hk = k('h', hs)
local until_ms = tonumber(ARGV[6])
redis.call('DEL', hk)
redis.call('HSET', hk, 'c', ca, 'i', ARGV[5], 'e', fmt(until_ms))
redis.call('PEXPIRE', hk, fmt(until_ms - now + tonumber(ARGV[7])))
return 1
