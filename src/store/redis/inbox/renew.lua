-- ARGV: T, now, until, then pairs of an event id and its lease generation.
-- Renews each lease still live under that generation (the event pending,
-- not leased again since, its lease not over at `now`) to `until`, never
-- shortening it: the event stays out of the runnable index's due range and
-- keeps its stream's turn (fix_stream). A lease that ran out is not
-- renewed, even if nobody took the event: its stream's turn may have gone
-- to another event meanwhile; nor is one whose stream's turn is no longer
-- its own, or that left the runnable index (a renewal that reaches Redis
-- late, after another instance's lease handed the turn on, must not bring
-- back a second delivery of the stream). Answers per pair, in order: 1
-- renewed, 2 ended (settled under this very lease: the holder's turn is
-- over, nothing was lost), 0 lost.
local now, until_ms = tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
for i = 4, #ARGV - 1, 2 do
  local id, lease = ARGV[i], ARGV[i + 1]
  local ek = k('e', id)
  local f = redis.call('HMGET', ek, 'st', 'ls', 'lu', 'hs')
  local live = f[1] == '0' and f[2] == lease and f[3] and tonumber(f[3]) > now
  if live and f[4] and f[4] ~= '' and redis.call('HGET', k('rn'), f[4]) ~= id then
    live = false
  end
  if live and not redis.call('ZSCORE', k('run'), id) then
    live = false
  end
  if not live and f[2] == lease and (f[1] ~= '0' or not f[3]) then
    -- Settled under this lease (delivered, dead or stale; or retry, which
    -- drops the lease's end): an erasure, a redeliver or a replay would
    -- have moved the generation.
    out[#out + 1] = 2
  elseif live then
    if tonumber(f[3]) < until_ms then
      redis.call('HSET', ek, 'du', fmt(until_ms), 'lu', fmt(until_ms))
      redis.call('ZADD', k('run'), 'XX', until_ms, id)
    end
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
