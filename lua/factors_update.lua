-- factors_update.lua: change one subject's stored factors and read them back, atomically.
-- KEYS   [1] the subject's factor hash, pal:v1:{<subject>}:f
-- ARGV   [1] now_ms, [2] keep_ms (how long the hash outlives its last factor, so its version
--        never restarts while a publisher may still hold an old one), then per change:
--        factor id, payload ('' deletes), expires_ms (-1: none)
-- State  field = factor id, value = '<expires_ms>|<json>'; field '_v' = version, bumped by
--        every call, so a publisher can tell whether it saw the latest change.
-- Returns {version, id1, payload1, id2, payload2, …} of the factors still live; expired
--        ones are deleted.
-- Time   now_ms is the caller's wall clock: factor expiries are wall-clock stamps made by
--        the callers (and reported as RFC 3339). Token buckets never see it.

local call = redis.call
local key = KEYS[1]
local now = tonumber(ARGV[1])
local keep = tonumber(ARGV[2])
for i = 3, #ARGV, 3 do
  if ARGV[i + 1] == '' then
    call('HDEL', key, ARGV[i])
  else
    call('HSET', key, ARGV[i], ARGV[i + 2] .. '|' .. ARGV[i + 1])
  end
end
local version = call('HINCRBY', key, '_v', 1)
local all = call('HGETALL', key)
local out = {version}
local latest = now + keep
local forever = false
for i = 1, #all, 2 do
  local id, value = all[i], all[i + 1]
  if id ~= '_v' then
    local bar = string.find(value, '|', 1, true)
    local expires = bar and tonumber(string.sub(value, 1, bar - 1)) or 0
    if expires >= 0 and expires <= now then
      call('HDEL', key, id)
    else
      if expires < 0 then
        forever = true
      elseif expires + keep > latest then
        latest = expires + keep
      end
      out[#out + 1] = id
      out[#out + 1] = string.sub(value, bar + 1)
    end
  end
end
if forever then
  call('PERSIST', key)
else
  call('PEXPIREAT', key, latest)
end
return out
