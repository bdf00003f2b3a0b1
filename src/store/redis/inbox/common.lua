-- Shared by the shared inbox's scripts. One script works in one bucket:
-- every key starts with the bucket's prefix T = ARGV[1] (`P:{i:S:B}`, one
-- hash tag, so one cluster slot). KEYS[1] is the bucket's count hash, named
-- so that a cluster routes the script to the bucket's master.
--
-- A destination's lane (SOURCE.DESTINATION) is a bucket of its own,
-- `P:{i:S:B}/D`: the same hash tag as its source's bucket B, so that
-- ingest_routed.lua writes an event into every lane in one script.
--
-- Keys of a bucket (ID an event id, HS a stream in hex):
--   T:e:ID   the event: st status (0 pending, 1 delivered, 2 stale, 3 dead,
--            4 erased, 5 filtered), sm stream, hs its hex, cr created_at ns, ca
--            created_at as 22 sortable digits, rc received ms, r2 received
--            as 20 digits, at attempts, du due, lu leased until (while
--            leased), er last error, fo forced, ex expiry, ls lease
--            generation, hd headers (JSON), bd body, bb body size, and its
--            replay mark, if a bulk job replayed it (replay.lua): rj the
--            job's id, rb the attempts it had then (both or neither). An
--            erased event has no bd, hd '[]', bb 0, no mark
--   T:t:ID   its timeline: the last attempts, JSON, oldest first
--   T:d:ID   its dedupe record: received + the window (Redis expires it)
--   T:a:ID   applied to its stream's head: until when (Redis expires it)
--   T:run    runnable pending events, score due
--   T:q:HS   a stream's pending events, members `ca:r2:ID` (lex order)
--   T:rn     per stream (HS), the event whose turn it is (the one in T:run)
--   T:h:HS   a stream's head: c created (sortable), i event id, e expiry
--   T:s:N    events of status N, members `r2:ID` (lex order)
--   T:n      counts per status (field N)
--   T:x      settled (and erased) events, score expiry
--   T:l      (a source's own bucket) the prefixes of its lanes' buckets of
--            the same number that were ever written: every ingest checks
--            them for a duplicate, whatever destinations its instance has
--
-- Outside the buckets, with a hash tag of their own (jobs.lua, no common
-- part): P:{j}:jobs, bulk jobs' records (field id), and P:{j}:cancelled,
-- the ids of those cancelled.
local T = ARGV[1]

local function fmt(n)
  return string.format('%.0f', n)
end

local function k(kind, name)
  if name then
    return T .. ':' .. kind .. ':' .. name
  end
  return T .. ':' .. kind
end

local function index_status(id, st, r2)
  if redis.call('ZADD', k('s', st), 0, r2 .. ':' .. id) == 1 then
    redis.call('HINCRBY', k('n'), st, 1)
  end
end

local function unindex_status(id, st, r2)
  if redis.call('ZREM', k('s', st), r2 .. ':' .. id) == 1 then
    redis.call('HINCRBY', k('n'), st, -1)
  end
end

-- Whose turn it is in stream `hs`: the event holding it keeps it while its
-- lease is live (one in flight per stream, whichever instance leased it);
-- otherwise the oldest pending event of the stream takes it.
local function fix_stream(hs, now)
  local cur = redis.call('HGET', k('rn'), hs)
  if cur then
    local f = redis.call('HMGET', k('e', cur), 'st', 'lu')
    if f[1] == '0' and f[2] and tonumber(f[2]) > now then
      return
    end
  end
  local fid, du = nil, nil
  while true do
    local first = redis.call('ZRANGE', k('q', hs), 0, 0)[1]
    if not first then
      break
    end
    fid = string.sub(first, 45)
    du = redis.call('HGET', k('e', fid), 'du')
    if du then
      break
    end
    -- Its row is gone (deleted by hand, evicted): so is its place.
    redis.call('ZREM', k('q', hs), first)
    redis.call('ZREM', k('run'), fid)
    fid = nil
  end
  if fid == cur then
    return
  end
  if cur then
    redis.call('ZREM', k('run'), cur)
  end
  if fid then
    redis.call('ZADD', k('run'), du, fid)
    redis.call('HSET', k('rn'), hs, fid)
  else
    redis.call('HDEL', k('rn'), hs)
  end
end

-- An id in an index whose row is gone (deleted by hand, evicted, lost):
-- out of the indexes, and its stream's turn passes on.
local function drop_ghost(id, now)
  redis.call('ZREM', k('run'), id)
  redis.call('ZREM', k('x'), id)
  local turns = redis.call('HGETALL', k('rn'))
  for i = 1, #turns, 2 do
    if turns[i + 1] == id then
      redis.call('HDEL', k('rn'), turns[i])
      fix_stream(turns[i], now)
      return
    end
  end
end

-- Makes a pending event runnable, or queues it behind its stream.
local function enqueue(id, hs, ca, r2, du, now)
  if hs == '' then
    redis.call('ZADD', k('run'), du, id)
    return
  end
  redis.call('ZADD', k('q', hs), 0, ca .. ':' .. r2 .. ':' .. id)
  fix_stream(hs, now)
end

-- Takes a pending event out of the runnable index and its stream's queue.
local function dequeue(id, hs, ca, r2, now)
  redis.call('ZREM', k('run'), id)
  if hs == '' then
    return
  end
  redis.call('ZREM', k('q', hs), ca .. ':' .. r2 .. ':' .. id)
  if redis.call('HGET', k('rn'), hs) == id then
    redis.call('HDEL', k('rn'), hs)
  end
  fix_stream(hs, now)
end

-- The `ca` of stream `hs`'s head while it lives, else nil.
local function live_head(hs, now)
  local h = redis.call('HMGET', k('h', hs), 'c', 'e')
  if h[1] and tonumber(h[2]) > now then
    return h[1]
  end
  return nil
end

-- Settles a pending event for good: status `st` (1, 2 or 3), kept until
-- `ex`.
local function finish(id, hs, ca, r2, st, ex, now)
  dequeue(id, hs, ca, r2, now)
  unindex_status(id, '0', r2)
  redis.call('HSET', k('e', id), 'st', st, 'du', fmt(now), 'ex', fmt(ex))
  redis.call('HDEL', k('e', id), 'lu')
  index_status(id, st, r2)
  redis.call('ZADD', k('x'), ex, id)
end
