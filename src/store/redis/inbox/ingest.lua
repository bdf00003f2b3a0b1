-- ARGV: T, now, id, stream ('' none), hs, cr, ca, rc, r2, headers, body
-- size, body, dedupe until, slack ms.
local now, id = tonumber(ARGV[2]), ARGV[3]
local ek = k('e', id)
if redis.call('EXISTS', ek) == 1 then
  return 'duplicate'
end
local seen = redis.call('GET', k('d', id))
if seen and tonumber(seen) > now then
  return 'duplicate'
end
-- A lane's bucket (`P:{i:S:B}/D`, an event moved in by `dedupd inbox
-- migrate`) is listed in its source's (T:l); a source's own bucket checks
-- the lanes listed there too: another instance, configured with
-- destinations, may have taken the event into them.
local source_t = string.match(T, '^(.*})/[%w_%-]+$')
if source_t then
  redis.call('SADD', source_t .. ':l', T)
else
  for _, lane in ipairs(redis.call('SMEMBERS', k('l'))) do
    if redis.call('EXISTS', lane .. ':e:' .. id) == 1 then
      return 'duplicate'
    end
    local lane_seen = redis.call('GET', lane .. ':d:' .. id)
    if lane_seen and tonumber(lane_seen) > now then
      return 'duplicate'
    end
  end
end
local hs = ARGV[5]
redis.call('HSET', ek, 'st', '0', 'hs', hs, 'cr', ARGV[6], 'ca', ARGV[7], 'rc', ARGV[8],
  'r2', ARGV[9], 'at', '0', 'du', fmt(now), 'fo', '0', 'ex', '0', 'ls', '0', 'hd', ARGV[10],
  'bb', ARGV[11], 'bd', ARGV[12])
if hs ~= '' then
  redis.call('HSET', ek, 'sm', ARGV[4])
end
index_status(id, '0', ARGV[9])
enqueue(id, hs, ARGV[7], ARGV[9], now, now)
local until_ms = tonumber(ARGV[13])
if until_ms > now then
  redis.call('SET', k('d', id), ARGV[13], 'PX', fmt(until_ms - now + tonumber(ARGV[14])))
end
return 'accepted'
