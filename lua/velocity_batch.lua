-- velocity_batch.lua: window operations, in order, on packed per-subject window values.
-- KEYS   every value the call touches (distinct). On a cluster every window operation runs
--        here, one call per value (one slot each); on a single Redis the service computes the
--        values itself (velocity.rs, single_redis) and sends here only those another instance
--        changed between its read and its write, all in one call.
-- ARGV   [1] now_ms, [2] P, then P profiles of two (window_ms, cap: most entries kept), then
--        one argument per op, in the order the events happened, packed as struct
--        '>I2 B c1 B' (key index into KEYS, profile index from 0, flags, #name), the window
--        name, then if the op has a member 16 bytes: the member (8 bytes, the caller's hash
--        of an event id, account, IP or device) and its score (event time, ms, as '>d').
--        Flags: 'w' record/count, 'g' the same and also return the gap, 'c' 1 if the member
--        is in the window (nothing added), 'x' delete the window. (One argument per op, with
--        the entry ready to store: fewer Lua strings made per op.)
-- Value  one Redis string per subject holds its windows (an account: its failures, and per
--        IP / device its pair failures, one entry per failure each): per window
--        byte #name, name, struct '>dI4' (expires_ms, n), then n entries of 16 bytes
--        (member, score as '>d'), sorted by score. A window is gone once expires_ms (its last
--        addition + window_ms) has passed, as a key with a TTL would be; the string's TTL is
--        its latest window's. Windows of one value share one window length (the caller's
--        layout), so a window no longer written to still expires.
-- Why    one key and two commands (GET, SET PX) per subject per call, where a sorted set per
--        window took four keys and about twelve commands per failure: Redis CPU per ingested
--        event was the ingest bottleneck. Counting is a binary search (prune, O(log n) Lua steps)
--        and a plain substring search (idempotency, one C call) on the packed string.
-- Idem.  a member already in the window gets the newer score and is not counted again: a
--        retried batch counts nothing twice.
-- Bound  at the end of a call, a value keeps at most MAX_KIND live windows of each kind (the
--        first byte of their names; an account has a pair window per IP it failed from) the
--        call created windows of: windows of that kind with no entry in range are dropped,
--        then the ones added to least recently (smallest expiry, then smallest name,
--        bytewise). The service does the same (WindowValue::finish in src/store/memory.rs).
-- Returns per op: {count in window, ms between the two newest entries or -1} (0, -1 for 'x')
-- Time   windows end at the caller's now_ms, the auth service's clock (not a token bucket).
local call = redis.call
local pack, unpack = struct.pack, struct.unpack
local sub, find, byte, char = string.sub, string.find, string.byte, string.char
local floor = math.floor
local now = tonumber(ARGV[1])
local E = 16 -- bytes per entry
local MAX_KIND = 128

-- KEYS index -> { name -> {expires, data} } once read; dirty[index] when it must be written.
local values = {}
local dirty = {}

local function decode(value)
  local windows = {}
  if not value then return windows end
  local pos, len = 1, #value
  while pos <= len do
    local n = byte(value, pos)
    local start = pos + n + 13
    -- A value not in the layout (not written by this version) reads as empty, as the
    -- service reads it, and is replaced if the call writes.
    if start - 1 > len then return {} end
    local name = sub(value, pos + 1, pos + n)
    local expires, count = unpack('>dI4', value, pos + 1 + n)
    pos = start + count * E
    if pos - 1 > len then return {} end
    if expires > now then
      windows[name] = { expires = expires, data = sub(value, start, pos - 1) }
    end
  end
  return windows
end

local function score(data, i) -- i: 0-based entry
  return (unpack('>d', data, i * E + 9))
end

-- Drops entries scored before cutoff (the first entry kept found by binary search).
local function prune(data, cutoff)
  local n = #data / E
  if n == 0 or score(data, 0) >= cutoff then return data end
  local lo, hi = 1, n
  while lo < hi do
    local mid = floor((lo + hi) / 2)
    if score(data, mid) >= cutoff then hi = mid else lo = mid + 1 end
  end
  return sub(data, lo * E + 1)
end

-- Byte position of member's entry, or nil (a match must start an entry).
local function locate(data, member)
  local from = 1
  while true do
    local p = find(data, member, from, true)
    if p == nil or (p - 1) % E == 0 then return p end
    from = p + 1
  end
end

-- a < b bytewise (as the service orders names; `<` on strings follows the locale).
local function before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = byte(a, i), byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- KEYS index -> { kind byte -> cutoff } of the windows the call created in that value.
local created = {}

-- The end of the call for one value: see "Bound" above.
local function trim(windows, kinds)
  for kind, cutoff in pairs(kinds) do
    local live = {}
    for name, w in pairs(windows) do
      if byte(name, 1) == kind then
        local n = #w.data / E
        if w.expires <= now or n == 0 or score(w.data, n - 1) < cutoff then
          windows[name] = nil
        else
          live[#live + 1] = { w.expires, name }
        end
      end
    end
    if #live > MAX_KIND then
      table.sort(live, function(a, b)
        return a[1] < b[1] or (a[1] == b[1] and before(a[2], b[2]))
      end)
      for i = 1, #live - MAX_KIND do windows[live[i][2]] = nil end
    end
  end
end

local profiles = {}
local P = tonumber(ARGV[2])
for k = 0, P - 1 do
  profiles[k] = { tonumber(ARGV[3 + 2 * k]), tonumber(ARGV[4 + 2 * k]) }
end

local out = {}
for j = 3 + 2 * P, #ARGV do
  local op = ARGV[j]
  local index, profile, flags, n = unpack('>I2Bc1B', op)
  local windows = values[index]
  if windows == nil then
    windows = decode(call('GET', KEYS[index]))
    values[index] = windows
  end
  local name = sub(op, 6, 5 + n)
  local window_ms = profiles[profile][1]
  local cutoff = now - window_ms
  local count, gap = 0, -1
  if flags == 'x' then
    if windows[name] then
      windows[name] = nil
      dirty[index] = true
    end
  else
    local w = windows[name]
    -- Pruned for this count; written back only with an addition (a count-only call, as the
    -- status query makes, writes nothing).
    local data = w and prune(w.data, cutoff) or ''
    local member = #op > 5 + n and sub(op, 6 + n, 13 + n)
    if flags == 'c' then
      count = (member and locate(data, member)) and 1 or 0
    elseif member then
      local s = unpack('>d', op, 14 + n)
      -- An entry older than the window is not added (it would not count).
      if s >= cutoff then
        local at = locate(data, member)
        if at then data = sub(data, 1, at - 1) .. sub(data, at + E) end
        -- Sorted by score: the new entry goes after every entry not newer than it
        -- (nearly always the end: events arrive in time order).
        local i = #data / E
        while i > 0 and score(data, i - 1) > s do i = i - 1 end
        local entry = sub(op, 6 + n, 21 + n)
        if i == #data / E then
          data = data .. entry
        else
          data = sub(data, 1, i * E) .. entry .. sub(data, i * E + 1)
        end
        local cap = profiles[profile][2]
        if #data > cap * E then data = sub(data, #data - cap * E + 1) end
        if w == nil then
          local kinds = created[index] or {}
          created[index] = kinds
          kinds[byte(name, 1)] = cutoff
          w = {}
          windows[name] = w
        end
        w.data = data
        w.expires = now + window_ms
        dirty[index] = true
      end
    end
    if flags ~= 'c' then
      count = #data / E
      if flags == 'g' and count >= 2 then
        gap = score(data, count - 1) - score(data, count - 2)
      end
    end
  end
  out[#out + 1] = count
  out[#out + 1] = gap
end

for index in pairs(dirty) do
  if created[index] then trim(values[index], created[index]) end
  local parts = {}
  local latest = now
  for name, w in pairs(values[index]) do
    local n = #w.data / E
    if n > 0 then
      parts[#parts + 1] = char(#name) .. name .. pack('>dI4', w.expires, n) .. w.data
      if w.expires > latest then latest = w.expires end
    end
  end
  if #parts == 0 then
    call('DEL', KEYS[index])
  else
    call('SET', KEYS[index], table.concat(parts), 'PX', latest - now)
  end
end
return out
