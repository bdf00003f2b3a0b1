-- A delivery lane's state shared by the fleet (store::lanes). KEYS[1] is
-- the lane's hash, P:{d:LANE}: one key, one slot, so every decision about
-- a lane is one atomic step, on a cluster too. Time is the caller's.
-- Fields (all absent: nothing held, breaker closed, bucket empty):
--   ra  held until (Retry-After)
--   tk  tokens (a float), ta when they were counted, tr rate per ms and tb
--       burst they are counted with (a change keeps the tokens, up to the
--       new burst: instances that disagree for a while, during a rolling
--       reload, must not keep emptying it)
--   dd  the destination the breaker and hold are about (reset.lua's id)
--   bs  'o' while the breaker is open; bu its pause's end; bt its openings
--       in a row; bf consecutive failed attempts
--   bp  the instance holding the probe, bq when its hold ends
-- ARGV[1] op, ARGV[2] now, then:
--   gate:   want, rate per ms ('' none), burst, me, probe until
--   report: outcome ('fail', 'ok', 'neutral', 'refund'), me, pause_after,
--           backoff min ms, backoff max ms, hold until (0 none), refund n
--   reset:  destination id: forgets the lane's state unless it is already
--           about that destination (so the second instance of a rolling
--           reload does not undo what the new destination earned since)
-- Gate and report answer {granted, state, until, failures, transition};
-- reset answers 1 if it forgot, 0 if not.
local key = KEYS[1]
local op, now = ARGV[1], tonumber(ARGV[2])
forget_unless_hash(key)
-- No time this script writes is further ahead than this (a pause or a
-- hold is at most backoff_max, 30 days at most; a probe's hold a
-- forward's timeout).
local HORIZON = 31 * 86400000
-- A field read as what an instance writes, or as absent: a value that is
-- not a number, not finite, negative, or a time past the horizon (another
-- build's, a hand edit, a clock far ahead) would hold the lane forever or
-- fail every answer (NaN fails every comparison).
local function time(v)
  local n = tonumber(v)
  if n and n >= 0 and n <= now + HORIZON then
    return n
  end
  return nil
end
local function count(v)
  local n = tonumber(v)
  if n and n >= 0 and n <= 1e15 then
    return n
  end
  return nil
end
local function rate_of(v)
  local n = tonumber(v)
  if n and n > 0 and n <= 1e15 then
    return n
  end
  return nil
end
local f = redis.call('HMGET', key, 'ra', 'tk', 'ta', 'tr', 'tb', 'bs', 'bu', 'bt', 'bf', 'bp', 'bq')
local ra = time(f[1]) or 0
-- A count made by a clock ahead of this caller's is taken as made now:
-- refilled from here, not held back until that clock's time.
local tk, ta, tr, tb = count(f[2]) or 0, math.min(time(f[3]) or now, now), f[4], f[5]
if not (rate_of(tr) and rate_of(tb)) then
  tr, tb = nil, nil
end
local bs, bu, bt, bf = f[6], time(f[7]) or 0, count(f[8]) or 0, count(f[9]) or 0
local bp, bq = f[10], time(f[11]) or 0

local function fmt(n)
  return string.format('%.0f', n)
end

-- An idle lane's key goes an hour after the last time it speaks of; one
-- with a rate limit keeps its bucket for 30 days after its last word, so
-- a lane quiet for hours finds its burst, as a single instance does (the
-- bucket starts empty only when the key is new).
local function keep()
  if redis.call('EXISTS', key) == 1 then
    local last = math.max(ra, bu, bq, now)
    local ttl = last - now + 3600000
    if tr then
      ttl = math.max(ttl, 30 * 86400000)
    end
    redis.call('PEXPIRE', key, fmt(ttl))
  end
end

local function answer(granted, state, untl, transition)
  keep()
  return {granted, state, fmt(untl), fmt(bf), transition or ''}
end

-- Where the lane is for anyone but a probe's taker.
local function standing(transition)
  if ra > now then
    return answer(0, 'held', ra, transition)
  end
  if bs == 'o' then
    if bu > now then
      return answer(0, 'paused', bu, transition)
    end
    return answer(0, 'probing', math.max(bq, now), transition)
  end
  return answer(0, 'open', 0, transition)
end

if op == 'gate' then
  local want, rate, burst, me, probe_until = tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6], tonumber(ARGV[7])
  if ra > now then
    return answer(0, 'held', ra)
  end
  local probe = false
  if bs == 'o' then
    if bu > now then
      return answer(0, 'paused', bu)
    end
    if bp and bq > now then
      return answer(0, 'probing', bq)
    end
    probe = true
    want = math.min(want, 1)
  end
  if rate ~= '' then
    local per_ms, cap = tonumber(rate), tonumber(burst)
    if tr ~= rate or tb ~= burst then
      redis.call('HSET', key, 'tr', rate, 'tb', burst)
      tr, tb = rate, burst
    end
    if now > ta then
      tk = tk + (now - ta) * per_ms
      ta = now
    end
    tk = math.min(cap, tk)
    local avail = math.floor(tk)
    if want > avail then
      want = avail
    end
    tk = tk - want
    redis.call('HSET', key, 'tk', string.format('%.17g', tk), 'ta', fmt(ta))
    if want < 1 then
      return answer(0, 'limited', ta + math.ceil((1 - tk) / per_ms))
    end
  elseif tr or f[4] then
    redis.call('HDEL', key, 'tr', 'tb', 'tk', 'ta')
    tr, tb = nil, nil
  end
  if probe and want > 0 then
    bq = probe_until
    redis.call('HSET', key, 'bp', me, 'bq', fmt(bq))
    return answer(want, 'probe', bq)
  end
  return answer(want, 'open', 0)
end

if op == 'report' then
  local outcome, me = ARGV[3], ARGV[4]
  local pause_after, bmin, bmax = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
  local hold = tonumber(ARGV[8])
  local function pause(trips)
    return math.min(bmax, bmin * 2 ^ math.min(trips - 1, 32))
  end
  local transition = ''
  if hold > ra then
    ra = hold
    redis.call('HSET', key, 'ra', fmt(ra))
  end
  if outcome == 'fail' then
    bf = bf + 1
    redis.call('HSET', key, 'bf', fmt(bf))
    if bs == 'o' then
      if bp == me and bu <= now then
        -- Its probe failed: paused again, for longer.
        bt = bt + 1
        bu = now + pause(bt)
        bp, bq = nil, 0
        redis.call('HSET', key, 'bt', fmt(bt), 'bu', fmt(bu))
        redis.call('HDEL', key, 'bp', 'bq')
        transition = 'paused_again'
      end
    elseif pause_after > 0 and bf >= pause_after then
      bs, bt = 'o', 1
      bu = now + pause(1)
      redis.call('HSET', key, 'bs', 'o', 'bt', '1', 'bu', fmt(bu))
      transition = 'paused'
    end
  elseif outcome == 'ok' then
    if bs == 'o' then
      transition = 'resumed'
    end
    bs, bu, bt, bf, bp, bq = nil, 0, 0, 0, nil, 0
    redis.call('HDEL', key, 'bs', 'bu', 'bt', 'bf', 'bp', 'bq')
  elseif outcome == 'neutral' then
    if bp == me then
      bp, bq = nil, 0
      redis.call('HDEL', key, 'bp', 'bq')
    end
  elseif outcome == 'refund' then
    if tr then
      tk = math.min(tonumber(tb), tk + tonumber(ARGV[9]))
      redis.call('HSET', key, 'tk', string.format('%.17g', tk))
    end
  end
  return standing(transition)
end

if op == 'reset' then
  local dest = ARGV[3]
  if redis.call('HGET', key, 'dd') == dest then
    return 0
  end
  redis.call('DEL', key)
  redis.call('HSET', key, 'dd', dest)
  redis.call('PEXPIRE', key, 3600000)
  return 1
end

return redis.error_reply('unknown lane op ' .. tostring(op))
