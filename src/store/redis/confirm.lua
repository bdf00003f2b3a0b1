-- KEYS[1] an event id's marker. ARGV: now, stream, retention_ms, slack_ms.
-- Extends the marker to the retention once its stream recorded the event.
local now = tonumber(ARGV[1])
if redis.call('HGET', KEYS[1], 's') ~= ARGV[2] then
  return 0
end
local retention = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'e', fmt(now + retention))
redis.call('PEXPIRE', KEYS[1], fmt(retention + tonumber(ARGV[4])))
return 1
