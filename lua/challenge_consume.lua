-- challenge_consume.lua: use an attestation challenge once, atomically.
-- KEYS   [1] the challenge key, pal:v1:{device:<id>}:x:challenge:<challenge>
-- ARGV   [1] now_ms (the caller's wall clock: challenges expire at the wall-clock time
--        returned to the app as expires_at), [2] how long a used challenge is remembered, ms
-- State  the key holds the challenge's expiry (Unix ms) until used, then 'used'; it lives
--        beyond the expiry so an expired or replayed challenge is named as such.
-- Returns 'ok', 'unknown', 'expired' or 'replayed'.
-- Time   ARGV[1] only.

local value = redis.call('GET', KEYS[1])
if not value then
  return 'unknown'
end
if value == 'used' then
  return 'replayed'
end
if tonumber(ARGV[1]) > tonumber(value) then
  return 'expired'
end
redis.call('SET', KEYS[1], 'used', 'PX', ARGV[2])
return 'ok'
