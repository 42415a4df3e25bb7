-- velocity_window.lua: record a failure in sliding windows and count them, atomically.
-- KEYS   sorted sets of one subject (same {hash tag}): one window each
-- ARGV   [1] now_ms, [2] window_ms, [3] cap (most entries kept), then per key i:
--        ARGV[2i+2] member ('' = only count), ARGV[2i+3] score (event time, ms)
-- Idem.  members are event ids (or account names for distinct-account windows): a retried
--        event adds nothing, so a retried batch counts nothing twice.
-- Returns per key: {count in window, ms between the two newest entries after this call or -1}
--        (the gap feeds the "faster than a human" check without another round trip)
-- Time   windows end at the caller's now_ms: event times are the auth service's clock, so
--        the window is judged on that clock too (not a token bucket).
local call = redis.call
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cap = tonumber(ARGV[3])
local cutoff = now - window
local out = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local member = ARGV[2 * i + 2]
  call('ZREMRANGEBYSCORE', key, '-inf', '(' .. cutoff)
  -- An entry older than the window is not added (it would not count), so after the prune
  -- every entry is inside the window and ZCARD is the count.
  local score = tonumber(ARGV[2 * i + 3])
  if member ~= '' and score >= cutoff then
    call('ZADD', key, ARGV[2 * i + 3], member)
    call('PEXPIRE', key, ARGV[2])
  end
  local size = call('ZCARD', key)
  if size > cap then
    call('ZREMRANGEBYRANK', key, 0, size - cap - 1)
    size = cap
  end
  out[#out + 1] = size
  local newest = call('ZRANGE', key, -2, -1, 'WITHSCORES')
  local gap = -1
  if newest[4] then gap = tonumber(newest[4]) - tonumber(newest[2]) end
  out[#out + 1] = gap
end
return out
