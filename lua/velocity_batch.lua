-- velocity_batch.lua: window operations, in order, on packed per-subject window values.
-- Spec   src/store/window.rs (the window model, its Rust twin, and the cases both must pass).
-- KEYS   every value the call touches (distinct). On a cluster every window operation runs
--        here, one call per value (one slot each); on a single Redis the service computes the
--        values itself (velocity.rs, single_redis) and sends here only those another instance
--        changed between its read and its write, in calls of at most 64 values.
-- ARGV   [1] now_ms, [2] P, then P profiles of two (window_ms, cap: most entries kept), then
--        one argument per op, in the order the events happened, packed as struct
--        '>I2 B c1 B' (key index into KEYS, profile index from 0, flags, #name), the window
--        name, then if the op has a member 16 bytes: the member (8 bytes, the caller's hash
--        of an event id, account, IP or device) and its score (event time, ms, as '>d').
--        Flags: 'w' record/count, 'g' the same and also return the smallest gap between
--        neighbouring scores, 'c' 1 if the member is in the window (nothing added), 'r' take
--        the member out, 'x' delete the window. (One argument per op, with the entry ready to
--        store: fewer Lua strings made per op.)
-- Value  one Redis string per subject holds its windows (an account: its failures, and per
--        IP / device its pair failures, one entry per failure each): per window
--        byte #name, name, struct '>dI4' (expires_ms, n), then n entries of 16 bytes
--        (member, score as '>d'), sorted by score. A window is gone once expires_ms (its last
--        addition + window_ms) has passed, as a key with a TTL would be; the string's TTL is
--        its latest window's. Windows of one value share one window length (the caller's
--        layout), so a window no longer written to still expires.
-- Why    one key and two commands (GET, SET PX) per subject per call, where a sorted set per
--        window took four keys and about twelve commands per failure: Redis CPU per ingested
--        event was the ingest bottleneck. Counting is a binary search over a window's entries,
--        idempotency a lookup in its member map (see open below).
-- Idem.  a member already in the window keeps its first score and is not counted again: a
--        retried batch counts nothing twice and stays no longer.
-- Bound  at the end of a call, a value keeps at most MAX_KIND live windows of each kind (the
--        first byte of their names; an account has a pair window per IP it failed from) the
--        call created windows of: windows of that kind with no entry in range are dropped,
--        then the ones added to least recently (smallest expiry, then smallest name,
--        bytewise). The service does the same (WindowValue::finish in src/store/window.rs).
-- Returns per op: {count in window, smallest ms between neighbouring entries ('g') or -1}
--        (0, -1 for 'x')
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

local function entry_score(entry)
  return (unpack('>d', entry, 9))
end

-- A window as decoded holds its entries as one string (data). The first operation on it
-- opens it into a list (e[lo..hi], oldest first) and a map member -> score of those
-- entries, so an addition costs O(1) amortized instead of copying the string: a window
-- holds up to 1000 entries, and a batch can add 500 to one (a distributed brute force on
-- one account copied 16 KB twice per failure: 8-18 ms a call).
local function open(w)
  if w.e then return w end
  local data, e, at = w.data, {}, {}
  local n = #data / E
  for i = 1, n do
    local entry = sub(data, i * E - E + 1, i * E)
    e[i] = entry
    at[sub(entry, 1, 8)] = entry_score(entry)
  end
  w.e, w.lo, w.hi, w.at, w.data = e, 1, n, at, nil
  return w
end

-- Entries and newest score of a window in either form.
local function size(w)
  if w.e then return w.hi - w.lo + 1 end
  return #w.data / E
end

local function newest(w)
  if w.e then return entry_score(w.e[w.hi]) end
  return score(w.data, #w.data / E - 1)
end

-- Index of the first entry of an open window scored at or after cutoff (w.hi + 1 if none).
local function first_from(w, cutoff)
  local e, lo, hi = w.e, w.lo, w.hi + 1
  if lo == hi or entry_score(e[lo]) >= cutoff then return lo end
  while lo < hi do
    local mid = floor((lo + hi) / 2)
    if entry_score(e[mid]) >= cutoff then hi = mid else lo = mid + 1 end
  end
  return lo
end

-- Drops an open window's oldest entries up to (not including) index `to`.
local function drop_to(w, to)
  local e, at = w.e, w.at
  for i = w.lo, to - 1 do at[sub(e[i], 1, 8)] = nil end
  if to > w.lo then w.lo = to end
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

-- Names of `group` (windows of one kind and one expiry) in bytewise order. A pair window's
-- name is its kind and 16 lowercase hex digits, so when every name has that form and their
-- first 13 digits (52 bits, exact in a Lua number) differ, a numeric sort in C gives that
-- order; otherwise a sort with a Lua comparator does. (An attack from 500 new IPs in one
-- batch makes 500 pair windows to cut to 128: the comparator sort took about 2 ms of the
-- call, the numeric one about 0.3.)
local function by_name(group)
  local keys, named = {}, {}
  for i = 1, #group do
    local name = group[i]
    local key = #name == 17 and not find(name, '[^0-9a-f]', 2) and tonumber(sub(name, 2, 14), 16)
    if not key or named[key] then
      table.sort(group, before)
      return group
    end
    keys[i], named[key] = key, name
  end
  table.sort(keys)
  for i = 1, #keys do group[i] = named[keys[i]] end
  return group
end

-- The end of the call for one value: see "Bound" above. The windows to drop are the
-- smallest by (expiry, name): those below the boundary expiry, then in name order those
-- at it.
local function trim(windows, kinds)
  for kind, cutoff in pairs(kinds) do
    local expiries = {}
    for name, w in pairs(windows) do
      if byte(name, 1) == kind then
        if w.expires <= now or size(w) == 0 or newest(w) < cutoff then
          windows[name] = nil
        else
          expiries[#expiries + 1] = w.expires
        end
      end
    end
    local drop = #expiries - MAX_KIND
    if drop > 0 then
      table.sort(expiries)
      local boundary = expiries[drop]
      local group = {}
      for name, w in pairs(windows) do
        if byte(name, 1) == kind then
          if w.expires < boundary then
            windows[name] = nil
            drop = drop - 1
          elseif w.expires == boundary then
            group[#group + 1] = name
          end
        end
      end
      if drop < #group then by_name(group) end
      for i = 1, drop do windows[group[i]] = nil end
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
    local first = w and first_from(open(w), cutoff)
    local member = #op > 5 + n and sub(op, 6 + n, 13 + n)
    if flags == 'c' then
      local s = member and w and w.at[member]
      count = (s and s >= cutoff) and 1 or 0
    elseif flags == 'r' then
      if member and w and w.at[member] then
        drop_to(w, first)
        local e = w.e
        for i = w.lo, w.hi do
          if sub(e[i], 1, 8) == member then
            table.remove(e, i)
            w.hi = w.hi - 1
            break
          end
        end
        w.at[member] = nil
        dirty[index] = true
        first = w.lo
      end
    elseif member and unpack('>d', op, 14 + n) >= cutoff
        and not (w and (w.at[member] or cutoff - 1) >= cutoff) then
      -- (A member already in range keeps its entry; one aged out is dropped below first.)
      -- An entry older than the window is not added (it would not count). Pruned only
      -- with an addition (a count-only call, as the status query makes, writes nothing).
      local s = unpack('>d', op, 14 + n)
      if w == nil then
        local kinds = created[index] or {}
        created[index] = kinds
        kinds[byte(name, 1)] = cutoff
        w = { e = {}, lo = 1, hi = 0, at = {} }
        windows[name] = w
        first = 1
      end
      drop_to(w, first)
      local e = w.e
      -- Sorted by score: the new entry goes after every entry not newer than it
      -- (nearly always the end: events arrive in time order).
      local i = w.hi
      while i >= w.lo and entry_score(e[i]) > s do i = i - 1 end
      table.insert(e, i + 1, sub(op, 6 + n, 21 + n))
      w.hi = w.hi + 1
      w.at[member] = s
      drop_to(w, w.hi - profiles[profile][2] + 1)
      w.expires = now + window_ms
      dirty[index] = true
      first = w.lo
    end
    if flags ~= 'c' and w then
      count = w.hi - first + 1
      if flags == 'g' and count >= 2 then
        local e = w.e
        local previous = entry_score(e[first])
        for i = first + 1, w.hi do
          local s = entry_score(e[i])
          if gap < 0 or s - previous < gap then gap = s - previous end
          previous = s
        end
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
    local n = size(w)
    if n > 0 then
      local data = w.e and table.concat(w.e, '', w.lo, w.hi) or w.data
      parts[#parts + 1] = char(#name) .. name .. pack('>dI4', w.expires, n) .. data
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
