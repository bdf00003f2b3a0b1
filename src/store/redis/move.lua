-- KEYS[1] a claim in the cluster layout, KEYS[2] its moved marker (same
-- slot). ARGV[1] the Redis expiry left on the claim's record in the one-slot
-- layout (PTTL, ms; -1 none), ARGV[2..] that record's fields and values
-- (HGETALL).
-- Copies the record, but over no claim taken since, and only once: the
-- marker lives as long as the old record, and while it is set nothing is
-- copied. So two instances moving at once cannot bring back a claim released
-- between their copies. Returns 1 when copied.
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
local pttl = tonumber(ARGV[1])
if pttl > 0 then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[1])
else
  redis.call('SET', KEYS[2], '1')
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
if pttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return 1
