-- KEYS[1] claim, KEYS[2] its slot's fence counter.
-- ARGV: now, ttl_ms, fingerprint ('' none), new token, slack_ms, fence floor.
local now = tonumber(ARGV[1])
local r = live_claim(KEYS[1], now)
if r then
  if r[1] == 'p' and r[2] == ARGV[4] then
    -- The same claim again: a retry after a lost answer. Idempotent.
    return {'claimed', r[3], r[4]}
  end
  if r[5] ~= '' and ARGV[3] ~= '' and r[5] ~= ARGV[3] then
    return {'mismatch', r[1], r[4]}
  end
  if r[1] == 'p' then
    return {'busy', r[1], r[4]}
  end
  return {'done', r[1], r[4], r[6]}
end
local fence = next_fence(KEYS[2], tonumber(ARGV[6]))
local e = now + tonumber(ARGV[2])
put_claim(KEYS[1], 'p', ARGV[4], fence, e, ARGV[3], now, tonumber(ARGV[5]))
return {'claimed', fmt(fence), fmt(e)}
