-- KEYS[1] an event id's marker: which stream it was first applied to.
-- ARGV: now, stream, lifetime_ms, slack_ms.
-- Returns 1 when the event may be applied to this stream, 0 when a live
-- marker names another stream (a duplicate). A new marker lives only
-- `lifetime_ms` (a short pending time) until confirm.lua extends it to the
-- retention once the stream recorded the event: a failed apply leaves no
-- long-lived marker behind.
local now = tonumber(ARGV[1])
local m = redis.call('HMGET', KEYS[1], 's', 'e')
if m[1] and tonumber(m[2]) > now then
  if m[1] == ARGV[2] then
    return 1
  end
  return 0
end
local retention = tonumber(ARGV[3])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 's', ARGV[2], 'e', fmt(now + retention))
redis.call('PEXPIRE', KEYS[1], fmt(retention + tonumber(ARGV[4])))
return 1
