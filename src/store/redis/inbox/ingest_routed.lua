-- ARGV: T (the source's bucket), now, id, stream ('' none), hs, cr, ca,
-- rc, r2, headers, body size, body, dedupe until, slack ms, filtered
-- until, n lanes, the lanes' bucket prefixes (n of them), m known, the
-- prefixes of every lane of the source (m of them). Every prefix is of
-- the same bucket of the same source (one hash tag, one slot).
--
-- Stores an event for the destinations it matched: a row in each lane
-- (as ingest.lua), or, matched by none, one row in the source's own
-- prefix with status filtered (5), kept until `filtered until`. A
-- duplicate if any lane of the source knows its id: those named, and
-- those the source's bucket lists (T:l) as having held events, which
-- another instance, configured with other destinations, may have written.
local now, id = tonumber(ARGV[2]), ARGV[3]
local source_t = ARGV[1]
local n = tonumber(ARGV[16])
local m = tonumber(ARGV[17 + n])
local lanes, known = {}, {source_t}
for i = 1, n do
  lanes[i] = ARGV[16 + i]
  known[#known + 1] = ARGV[16 + i]
end
for i = 1, m do
  known[#known + 1] = ARGV[17 + n + i]
end
for _, lane in ipairs(redis.call('SMEMBERS', source_t .. ':l')) do
  known[#known + 1] = lane
end
for _, lane in ipairs(known) do
  T = lane
  if redis.call('EXISTS', k('e', id)) == 1 then
    return 'duplicate'
  end
  local seen = redis.call('GET', k('d', id))
  if seen and tonumber(seen) > now then
    return 'duplicate'
  end
end
local hs = ARGV[5]
local function store(st, ex)
  local ek = k('e', id)
  redis.call('HSET', ek, 'st', st, 'hs', hs, 'cr', ARGV[6], 'ca', ARGV[7], 'rc', ARGV[8],
    'r2', ARGV[9], 'at', '0', 'du', fmt(now), 'fo', '0', 'ex', ex, 'ls', '0', 'hd', ARGV[10],
    'bb', ARGV[11], 'bd', ARGV[12])
  if hs ~= '' then
    redis.call('HSET', ek, 'sm', ARGV[4])
  end
  index_status(id, st, ARGV[9])
  if st == '0' then
    enqueue(id, hs, ARGV[7], ARGV[9], now, now)
  else
    redis.call('ZADD', k('x'), ex, id)
  end
  local until_ms = tonumber(ARGV[13])
  if until_ms > now then
    redis.call('SET', k('d', id), ARGV[13], 'PX', fmt(until_ms - now + tonumber(ARGV[14])))
  end
end
if n == 0 then
  T = source_t
  store('5', ARGV[15])
end
for _, lane in ipairs(lanes) do
  if lane ~= source_t then
    redis.call('SADD', source_t .. ':l', lane)
  end
  T = lane
  store('0', '0')
end
return 'accepted'
