-- window_cas.lua: write window values computed by the service, each only if it is unchanged.
-- KEYS   window values (see velocity_batch.lua for the layout), on a single Redis
-- ARGV   per key i: [3i-2] the value the service read, [3i-1] the value to write ('' =
--        delete), [3i] its TTL in ms
-- Returns the indexes (1-based) of the keys whose value changed since it was read: nothing
--        of theirs is changed (a value written meanwhile is put back, with the TTL given),
--        and the caller runs their operations through velocity_batch.lua, which sets the
--        value's own TTL.
-- Why    the service read every value of a batch with one MGET and computed each one's
--        operations in Rust: Redis only compares and stores, where velocity_batch.lua
--        decodes, updates and re-encodes each value in Lua. A write is one `SET … GET` (one
--        lookup of the key, where a GET then a SET took two: measured 0.3-0.6 µs less per
--        value, of 5.5); a value changed meanwhile is rare (another batch on the same
--        account at the same moment), so putting it back costs little.
local call = redis.call
local failed = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local read, value, ttl = ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i]
  if value == '' then
    if call('GET', key) == read then
      call('DEL', key)
    else
      failed[#failed + 1] = i
    end
  else
    local old = call('SET', key, value, 'PX', ttl, 'GET')
    if old ~= read then
      if old then
        call('SET', key, old, 'PX', ttl)
      else
        call('DEL', key)
      end
      failed[#failed + 1] = i
    end
  end
end
return failed
