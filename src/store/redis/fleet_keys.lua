-- Shared by the fleet's scripts (lanes.lua, alert.lua), put before each.
-- A key that is not a hash (another program's key, a hand edit) is
-- nothing an instance wrote, and every command of theirs on it would fail,
-- for good: a lane would deliver nothing, an alert would hold back every
-- alert behind it. Deleted: what it was about starts as new.
local function forget_unless_hash(key)
  local kind = redis.call('TYPE', key)
  if type(kind) == 'table' then
    kind = kind['ok']
  end
  if kind ~= 'hash' and kind ~= 'none' then
    redis.call('DEL', key)
  end
end
