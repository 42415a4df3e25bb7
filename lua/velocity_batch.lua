-- velocity_batch.lua: a whole ingest batch's window operations in one call, in order.
-- KEYS   every window key the batch touches (distinct; a single Redis, not a cluster:
--        on a cluster the caller sends one op per call instead)
-- ARGV   [1] now_ms, then 6 fields per op, in the order the events happened:
--        key index (into KEYS), member ('' = only count; '-' with kind 'x'), score (ms),
--        window_ms, cap (most entries kept), flags: 'w' record/count, 'g' the same and also
--        return the gap, 'x' delete the key (a success clears the pair windows)
-- Idem.  members are event ids (or account names for distinct-account windows): a retried
--        event adds nothing, so a retried batch counts nothing twice.
-- Returns per op: {count in window, ms between the two newest entries or -1} (0, -1 for 'x')
-- Time   windows end at the caller's now_ms, the auth service's clock (as velocity_window.lua).
-- Speed  a batch repeats the same few windows and caps: their numbers and each window's
--        '(cutoff' argument are converted once per call, and PEXPIRE gets the window's own
--        string (a Lua number passed to redis.call is formatted with printf: number
--        conversions were about a tenth of Redis's CPU in the ingest benchmark). A key is
--        counted once per call (later operations add ZADD's result) and pruned only if it
--        held entries before: a new key costs ZADD + ZCARD + PEXPIRE.
local call = redis.call
local now = tonumber(ARGV[1])
-- Per key (KEYS index): entries in its window once this call has counted it.
local sizes = {}
local expire = {}
local out = {}
local numbers = {}
local function number(text)
  local value = numbers[text]
  if value == nil then
    value = tonumber(text)
    numbers[text] = value
  end
  return value
end
local exclusive = {}
local ops = (#ARGV - 1) / 6
for j = 0, ops - 1 do
  local base = 2 + 6 * j
  local index = tonumber(ARGV[base])
  local key = KEYS[index]
  local member = ARGV[base + 1]
  local window_text = ARGV[base + 3]
  local window = number(window_text)
  local flags = ARGV[base + 5]
  local cutoff = now - window
  if flags == 'x' then
    call('DEL', key)
    sizes[index] = 0
    expire[index] = nil
    out[#out + 1] = 0
    out[#out + 1] = -1
  else
    -- An entry older than the window is not added (it would not count). Adding before the
    -- prune gives the same set: the new entry is inside the window, and a member already
    -- there only gets its (newer) score.
    local score = tonumber(ARGV[base + 2])
    local added = 0
    if member ~= '' and score >= cutoff then
      added = call('ZADD', key, ARGV[base + 2], member)
      expire[index] = window_text
    end
    local size = sizes[index]
    if size == nil then
      -- The key's first operation in this call: count it, and prune only if it held
      -- entries before this one (most keys of a batch are new: no prune, no lookup). After
      -- the prune every entry is inside the window.
      size = call('ZCARD', key)
      if size > added then
        local bound = exclusive[window_text]
        if bound == nil then
          bound = '(' .. cutoff
          exclusive[window_text] = bound
        end
        size = size - call('ZREMRANGEBYSCORE', key, '-inf', bound)
      end
    else
      -- Pruned earlier in this call at the same now: only additions change the count.
      size = size + added
    end
    local cap = number(ARGV[base + 4])
    if size > cap then
      call('ZREMRANGEBYRANK', key, 0, size - cap - 1)
      size = cap
    end
    sizes[index] = size
    out[#out + 1] = size
    local gap = -1
    if flags == 'g' then
      local newest = call('ZRANGE', key, -2, -1, 'WITHSCORES')
      if newest[4] then gap = tonumber(newest[4]) - tonumber(newest[2]) end
    end
    out[#out + 1] = gap
  end
end
for index, window in pairs(expire) do
  call('PEXPIRE', KEYS[index], window)
end
return out
