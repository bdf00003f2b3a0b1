-- KEYS[1] claim. ARGV: now, token.
local r = live_claim(KEYS[1], tonumber(ARGV[1]))
if not r then
  return {'not_held'}
end
if r[1] == 'd' then
  return {'done', r[4]}
end
if r[2] ~= ARGV[2] then
  return {'not_owner', r[4]}
end
redis.call('DEL', KEYS[1])
return {'released'}
