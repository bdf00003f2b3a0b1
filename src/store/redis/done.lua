-- KEYS[1] claim, KEYS[2] its slot's fence counter.
-- ARGV: now, ttl_ms, token, slack_ms, fence floor, result (JSON text, '' for
-- none). A repeated done keeps the first done's expiry and result.
local now = tonumber(ARGV[1])
local e = now + tonumber(ARGV[2])
local r = live_claim(KEYS[1], now)
if not r then
  -- The work finished although the claim lapsed: record it, with a fence.
  local fence = next_fence(KEYS[2], tonumber(ARGV[5]))
  put_claim(KEYS[1], 'd', ARGV[3], fence, e, '', now, tonumber(ARGV[4]), ARGV[6])
  return {'done', fmt(e)}
end
if r[2] ~= ARGV[3] then
  return {'not_owner', r[1], r[4]}
end
if r[1] == 'd' then
  return {'done', r[4]}
end
put_claim(KEYS[1], 'd', r[2], r[3], e, r[5], now, tonumber(ARGV[4]), ARGV[6])
return {'done', fmt(e)}
