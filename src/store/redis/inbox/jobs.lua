-- Bulk jobs' records, outside the buckets (no common part: KEYS name
-- everything, both under the hash tag {j}, so one slot). KEYS: P:{j}:jobs
-- (field id → the job's record, opaque here) and P:{j}:cancelled (the ids
-- of cancelled jobs; none without a record). ARGV: an operation, then its
-- arguments:
--   put ID RECORD   writes the record (a cancel mark stays); answers 1
--   cancel ID       marks it cancelled: 1, or 0 when there is no such job
--   delete ID       deletes its record and mark: 1 when there was a record
--   list            every job: {id, record, '1' cancelled or '0', ...}
local op, jobs, cancelled = ARGV[1], KEYS[1], KEYS[2]
if op == 'put' then
  redis.call('HSET', jobs, ARGV[2], ARGV[3])
  return 1
elseif op == 'cancel' then
  if redis.call('HEXISTS', jobs, ARGV[2]) == 0 then
    return 0
  end
  redis.call('SADD', cancelled, ARGV[2])
  return 1
elseif op == 'delete' then
  redis.call('SREM', cancelled, ARGV[2])
  return redis.call('HDEL', jobs, ARGV[2])
elseif op == 'list' then
  local all = redis.call('HGETALL', jobs)
  local out = {}
  for i = 1, #all, 2 do
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
    out[#out + 1] = tostring(redis.call('SISMEMBER', cancelled, all[i]))
  end
  return out
end
return redis.error_reply('jobs.lua: unknown operation ' .. tostring(op))
