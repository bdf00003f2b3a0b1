-- KEYS[1] stream head, KEYS[2] the event's record in this stream, KEYS[3]
-- the event id's marker (another slot in a cluster, so it is checked and
-- set by mark.lua before this runs; here it is not touched).
-- ARGV: now, created_at seconds, created_at nanoseconds, event id,
--       retention_ms, slack_ms.
-- created_at is compared as (seconds, nanoseconds): nanoseconds since the
-- epoch do not fit Lua's doubles exactly.
local now = tonumber(ARGV[1])
local sec, nsec = tonumber(ARGV[2]), tonumber(ARGV[3])
local retention, slack = tonumber(ARGV[5]), tonumber(ARGV[6])
local h = redis.call('HMGET', KEYS[1], 'cs', 'cn', 'id', 'e')
if not h[1] or tonumber(h[4]) <= now then
  h = nil
end
local ev = redis.call('HGET', KEYS[2], 'e')
if ev and tonumber(ev) > now then
  if h then
    return {'duplicate', h[1], h[2], h[3]}
  end
  return {'duplicate'}
end
local e = now + retention
local stale = h and (sec < tonumber(h[1]) or (sec == tonumber(h[1]) and nsec < tonumber(h[2])))
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'e', fmt(e), 'o', stale and 's' or 'a')
redis.call('PEXPIRE', KEYS[2], fmt(retention + slack))
if stale then
  return {'stale', h[1], h[2], h[3]}
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'cs', ARGV[2], 'cn', ARGV[3], 'id', ARGV[4], 'e', fmt(e))
redis.call('PEXPIRE', KEYS[1], fmt(retention + slack))
return {'applied', ARGV[2], ARGV[3], ARGV[4]}
