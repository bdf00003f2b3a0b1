-- One alert kind and source's interval, fleet-wide (`Fleet::alert_turn`).
-- KEYS[1] = P:{a:KIND:SOURCE} (one hash tag, one cluster slot): a hash of
--   since  when the fleet's current interval started (Unix ms)
--   n      alerts folded fleet-wide in it, not yet sent
-- ARGV: every_ms, mode ('raise' or 'flush'), local (alerts the caller
-- folded into this one itself), now (the caller's clock, never Redis's).
-- Answers {'send', suppressed}, {'fold', until} or {'gone'}. A write sets
-- PEXPIRE 2 x every: an idle kind's key goes away, and the next alert
-- finds no interval.
local key = KEYS[1]
local every = tonumber(ARGV[1])
local mode = ARGV[2]
local localn = tonumber(ARGV[3])
local now = tonumber(ARGV[4])

local function fmt(v)
  return string.format('%.0f', v)
end

local function start(suppressed)
  redis.call('HSET', key, 'since', fmt(now), 'n', '0')
  redis.call('PEXPIRE', key, fmt(2 * every))
  return {'send', fmt(suppressed)}
end

forget_unless_hash(key)
-- Read as an instance writes them, or as absent: a figure that is not a
-- number, not finite, negative, or an interval that starts more than one
-- interval ahead (a count no reader could parse, an interval that never
-- ends).
local since = tonumber(redis.call('HGET', key, 'since'))
if not (since and since >= 0 and since <= now + every) then
  since = nil
end
local n = tonumber(redis.call('HGET', key, 'n'))
if not (n and n >= 0 and n <= 1e15) then
  n = 0
end
n = math.floor(n)

if mode == 'raise' then
  -- The first alert of an interval goes at once, with whatever the
  -- previous interval folded and nobody flushed yet.
  if not since or now >= since + every then
    return start(n + localn)
  end
  redis.call('HSET', key, 'n', fmt(n + 1 + localn))
  redis.call('PEXPIRE', key, fmt(2 * every))
  return {'fold', fmt(since + every)}
elseif mode == 'flush' then
  -- The fleet's record is gone (it outlived 2 x every unflushed): nobody
  -- can have sent what this one carries, so it goes.
  if not since then
    return start(localn)
  end
  -- Another instance sent an alert that counted this one.
  if n == 0 then
    return {'gone'}
  end
  -- Sent as the last of those folded, counting the others; like a raise,
  -- it starts an interval.
  if now >= since + every then
    return start(n - 1)
  end
  -- A later interval (another instance sent meanwhile) folded more:
  -- this one waits for its end, to send them.
  return {'fold', fmt(since + every)}
end
return redis.error_reply('alert.lua: unknown mode ' .. tostring(mode))
