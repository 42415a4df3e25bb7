-- multiplier_publish.lua: write one subject's per-class multipliers unless a newer change
-- to its factors exists.
-- KEYS   [1] the subject's factor hash, then one multiplier key per class (same {hash tag})
-- ARGV   [1] the factor-hash version the values were computed from, then per multiplier
--        key: value ('' deletes: the bucket script then uses the request's default), px
--        (0: no expiry)
-- Returns 1 if written, 0 if superseded: a later change bumped the version, and the caller
--        that made it publishes its own, newer view. So the last write always reflects the
--        latest factors, whatever order concurrent publishers finish in.
-- Time   none.

local call = redis.call
if call('HGET', KEYS[1], '_v') ~= ARGV[1] then
  return 0
end
-- The deleted keys go in one DEL: most classes of most publishes are deleted (a class no
-- stored factor applies to is left to the default), and a call from Lua costs about a
-- microsecond whatever it does.
local gone = {}
for i = 2, #KEYS do
  local value, px = ARGV[2 * i - 2], tonumber(ARGV[2 * i - 1])
  if value == '' then
    gone[#gone + 1] = KEYS[i]
  elseif px > 0 then
    call('SET', KEYS[i], value, 'PX', px)
  else
    call('SET', KEYS[i], value)
  end
end
if #gone > 0 then
  call('DEL', unpack(gone))
end
return 1
