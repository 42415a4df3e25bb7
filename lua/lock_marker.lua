-- lock_marker.lua: change an account's lock marker only while it still names one lockout.
-- KEYS   [1] the account's lock marker
-- ARGV   [1] lockout id, [2] 'stored' (mark the lockout durably stored, keeping the TTL),
--        'delete' (the lockout was released, or its row could not be written) or 'retime'
--        (an analyst moved its end: [3] the new TTL in ms)
-- Value  a marker is its lockout's id, with '!' appended once the lockout is stored
-- Returns 1 if the marker named the lockout (and was changed), else 0: a marker set meanwhile
--        for another lockout (after a release) is never overwritten or removed.
local value = redis.call('GET', KEYS[1])
if value ~= ARGV[1] and value ~= ARGV[1] .. '!' then
  return 0
end
if ARGV[2] == 'delete' then
  redis.call('DEL', KEYS[1])
elseif ARGV[2] == 'retime' then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
else
  redis.call('SET', KEYS[1], ARGV[1] .. '!', 'KEEPTTL')
end
return 1
