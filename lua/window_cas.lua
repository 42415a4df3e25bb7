-- window_cas.lua: write window values computed by the service, each only if it is unchanged.
-- KEYS   window values (see velocity_batch.lua for the layout), on a single Redis
-- ARGV   per key i: [3i-2] the value the service read, [3i-1] the value to write ('' =
--        delete), [3i] its TTL in ms
-- Returns the indexes (1-based) of the keys whose value changed since it was read: nothing
--        is written for them, and the caller runs their operations through velocity_batch.lua.
-- Why    the service read every value of a batch with one MGET and computed each one's
--        operations in Rust: Redis only compares and stores (a GET and a SET per value),
--        where velocity_batch.lua decodes, updates and re-encodes each value in Lua.
local call = redis.call
local failed = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  if call('GET', key) == ARGV[3 * i - 2] then
    local value = ARGV[3 * i - 1]
    if value == '' then
      call('DEL', key)
    else
      call('SET', key, value, 'PX', ARGV[3 * i])
    end
  else
    failed[#failed + 1] = i
  end
end
return failed
