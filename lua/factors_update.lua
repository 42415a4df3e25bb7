-- factors_update.lua: change subjects' stored factors and read them back, atomically per
-- subject; for a subject that had nothing stored, publish its multipliers in the same call.
-- KEYS   per subject: its factor hash, pal:v1:{<subject>}:f, then the multiplier keys to
--        write if it had nothing stored (same {hash tag}; on a cluster, one subject per call)
-- ARGV   [1] now_ms, [2] keep_ms (how long a hash outlives its last factor, so its version
--        never restarts while a publisher may still hold an old one), then per subject: the
--        number of its multiplier keys, the number of its changes, per change: factor id,
--        payload ('' deletes), expires_ms (-1: none); then per multiplier key: value, px (0:
--        no expiry): what the caller would write if this call's sets were the subject's only
--        factors (the keys to delete are left out: such a subject has none)
-- State  field = factor id, value = '<expires_ms>|<json>'; field '_v' = version, bumped by
--        every call, so a publisher can tell whether it saw the latest change.
-- Returns per subject: {version, 1} when its hash did not exist before this call (version 1):
--        the multiplier keys given were written, as given (no key of the subject
--        existed to delete: its multiplier keys expire with its last factor, before the
--        hash); otherwise {version, 0, id1, payload1, id2, payload2, …} of the factors still
--        live, for the caller to publish (`multiplier_publish.lua`); expired ones are deleted.
-- Why    a challenge asserts one factor on an account that has none: two scripts (this and
--        the publish, with its read-back and deletes) cost Redis twice the work of one; and
--        a batch's challenges go in a few calls, not one round trip each.
-- Time   now_ms is the caller's wall clock: factor expiries are wall-clock stamps made by
--        the callers (and reported as RFC 3339). Token buckets never see it.

local call = redis.call
local FOREVER = 253402300799000 -- 9999-12-31, as FOREVER_MS in src/scoring/store.rs
local now = tonumber(ARGV[1])
local keep = tonumber(ARGV[2])

-- One subject: its hash is KEYS[k], its multiplier keys KEYS[k + 1 .. k + nkeys]; its
-- changes start at ARGV[a]. Returns its reply and the index of the next subject's arguments.
local function update(k, nkeys, a, nchanges)
  local key = KEYS[k]
  local last = a - 1 + 3 * nchanges
  -- What this call leaves of each id it names: its expiry, or false if deleted.
  local named = {}
  for i = a, last, 3 do
    local id, payload, expires = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
    if payload == '' or (expires >= 0 and expires <= now) then
      call('HDEL', key, id)
      named[id] = false
    else
      call('HSET', key, id, ARGV[i + 2] .. '|' .. payload)
      named[id] = expires
    end
  end
  local version = call('HINCRBY', key, '_v', 1)
  local latest = now + keep
  local forever = false
  local function extend(expires)
    if expires < 0 then
      forever = true
    elseif expires + keep > latest then
      latest = expires + keep
    end
  end
  local out = {version, 0}
  if version == 1 then
    -- Nothing was stored before: the factors are this call's sets, as the caller assumed.
    for _, expires in pairs(named) do
      if expires then
        extend(expires)
      end
    end
    for j = 1, nkeys do
      local value, px = ARGV[last + 2 * j - 1], tonumber(ARGV[last + 2 * j])
      if px > 0 then
        call('SET', KEYS[k + j], value, 'PX', px)
      else
        call('SET', KEYS[k + j], value)
      end
    end
    out[2] = 1
  else
    local all = call('HGETALL', key)
    for i = 1, #all, 2 do
      local id, value = all[i], all[i + 1]
      if id ~= '_v' then
        local bar = string.find(value, '|', 1, true)
        local expires = bar and tonumber(string.sub(value, 1, bar - 1)) or 0
        if expires >= 0 and expires <= now then
          call('HDEL', key, id)
        else
          extend(expires)
          out[#out + 1] = id
          out[#out + 1] = string.sub(value, bar + 1)
        end
      end
    end
  end
  if forever then
    -- Far in the future rather than none: every hash has an expiry, so a transaction that
    -- sets a factor can give a new hash its expiry with PEXPIREAT ... NX (store.rs).
    call('PEXPIREAT', key, FOREVER)
  else
    call('PEXPIREAT', key, latest)
  end
  return out, last + 2 * nkeys + 1
end

local replies = {}
local k, a = 1, 3
while k <= #KEYS do
  local nkeys, nchanges = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local reply
  reply, a = update(k, nkeys, a + 2, nchanges)
  replies[#replies + 1] = reply
  k = k + 1 + nkeys
end
return replies
