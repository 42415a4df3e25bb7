-- token_bucket.lua: check, and consume only if all allow, every scope of one request, atomically;
--        several requests in one call (coalesced by the service) run one after another, each
--        seeing the ones before, exactly as if each were its own call at the same instant.
-- KEYS   per request, per scope: bucket key, then multiplier key (same {hash tag}); a key may
--        appear again for another request of the call (e.g. the global bucket)
-- ARGV   [1] number of requests; then per request: cost, mode, number of scopes n,
--        then per scope: capacity, refill per second, enforce (1) or shadow (0) (for a
--        budget held across regions, followed by ':' and this region's share of it, by
--        which capacity and refill are already scaled), the
--        multiplier to use when none is published (scoring's local default: reputation,
--        attestation), or '=' and the multiplier to use whatever is published (a locked
--        account's owner in a context the account knows: the lockout-DoS rule)
-- Mode   0 checks; 1 checks and consumes if every enforced scope allows; 2 gives back `cost`
--        to every scope (on a cluster, what a check consumed in one slot when another slot
--        refused it: the bucket is as if that request had not come)
-- State  a bucket is one 8-byte double, struct 'd': the theoretical arrival time (GCRA) in µs,
--        i.e. when the bucket is full again. Written with PSETEX <time until full> <value>,
--        one command per bucket per call, integer milliseconds, so an idle key disappears
--        exactly when it is full.
-- Share  a bucket spent at a share is two doubles, struct 'dd': the time as above and the
--        share it was written at. Read at another share, it owes the same tokens (the time
--        owed scaled by written / current, past the window if the share fell): a share that
--        rises brings its new tokens, one that falls still owes what was spent
--        (src/limiter/bucket.rs `evaluate_shared`).
-- Mult.  the multiplier key holds a decimal number; absent = the default given; it scales
--        capacity and refill; 0 blocks. The burst window capacity/refill does not depend on it.
-- Returns one string of little-endian 8-byte integers (struct 'i8'), per request: admitted,
--        then per scope: allowed, limit, remaining, reset_ms, retry_ms (-1 = never under the
--        current multiplier), multiplier in millionths, multiplier_pttl_ms. One bulk string
--        instead of 29 integer replies for a 4-scope request: the service's RESP parser spent
--        about 6 % of its CPU per check on them (perf).
--        Every number is rounded explicitly (floor for tokens, ceil for waits): packing would
--        truncate a fractional Lua number, as an integer reply would.
-- Time   redis.call('TIME') only, once per call; the caller's clock is never used.
-- Model  src/limiter/bucket.rs `evaluate` (and `evaluate_shared` for a share) is the same
--        computation; keep them in step.
-- Speed  globals are bound to locals and numbers are answered as integers (not formatted
--        text); TIME + MGET + one PSETEX per bucket are most of a call's Redis CPU. A
--        coalesced call shares TIME, one MGET and one PSETEX per distinct bucket. The
--        answer's length is counted, not taken with `#`, and a request's writes go into two
--        arrays reused by every request, not a table per write
--        (`scripts/token-bucket-cost.py` measures a call's Redis time).

local call, floor, ceil, byte, sub = redis.call, math.floor, math.ceil, string.byte, string.sub
local pack, unpack_struct = struct.pack, struct.unpack
local t = call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local values = call('MGET', unpack(KEYS))
local dd = 'dd'

local function ceil_ms(us)
  local ms = ceil(us / 1000 - 1e-9)
  if ms < 0 then return 0 end
  return ms
end

-- Buckets written by an earlier request of this call: key -> theoretical arrival time (µs),
-- and the share it was written at (false: none).
local written = {}
local wshared = {}
local order = {}
local out = {}
local o = 0 -- values in out
local wkey, wtat, wshare = {}, {}, {}
local k = 0 -- KEYS consumed so far
local a = 1 -- ARGV consumed so far
for _ = 1, tonumber(ARGV[1]) do
  local cost = tonumber(ARGV[a + 1])
  local consume = ARGV[a + 2] == '1'
  local refund = ARGV[a + 2] == '2'
  local n = tonumber(ARGV[a + 3])
  a = a + 3
  o = o + 1
  local head = o
  out[head] = 1
  local admitted = true
  local wn = 0
  for i = 1, n do
    local b = a + 4 * i - 3
    local key = KEYS[k + 2 * i - 1]
    local capacity = tonumber(ARGV[b])
    local refill = tonumber(ARGV[b + 1])
    local flag = ARGV[b + 2]
    local enforce = flag == '1'
    local share = false
    if not enforce and flag ~= '0' then
      enforce = byte(flag, 1) == 49
      share = tonumber(sub(flag, 3)) or false
    end
    local given = ARGV[b + 3]
    local m
    if byte(given, 1) == 61 then -- '='
      m = tonumber(sub(given, 2)) or 0
    else
      m = tonumber(values[k + 2 * i]) or tonumber(given)
    end
    if m < 0 then m = 0 end
    local limit = capacity * m
    local rate = refill * m / 1e6
    local window = capacity / refill * 1e6
    local deficit = 0
    local tat = written[key]
    local at = false -- the share the bucket was written at
    if tat then
      at = wshared[key]
    else
      local raw = values[k + 2 * i - 1]
      if raw and #raw == 8 then
        tat = unpack_struct('d', raw)
      elseif raw and #raw == 16 then
        tat, at = unpack_struct(dd, raw)
      end
    end
    if tat then
      deficit = tat - now
      if deficit < 0 then deficit = 0 elseif deficit > window then deficit = window end
      if share and at and at ~= share and share > 0 then deficit = deficit * at / share end
    end
    local allowed, remaining, reset, retry
    if refund then
      allowed, remaining, reset, retry = true, 0, 0, 0
      if tat and rate > 0 then
        local back = now + deficit - cost / rate
        if back < now then back = now end
        wn = wn + 1
        wkey[wn] = key
        wtat[wn] = back
        wshare[wn] = share
      end
    elseif rate <= 0 or cost > limit + 1e-9 then
      allowed = false
      remaining = floor((window > deficit and window - deficit or 0) * rate + 1e-9)
      reset = deficit
      retry = -1
    else
      local needed = deficit + cost / rate
      if needed <= window + 1e-3 then
        allowed = true
        remaining = floor((window > needed and window - needed or 0) * rate + 1e-9)
        reset = needed
        retry = 0
        wn = wn + 1
        wkey[wn] = key
        wtat[wn] = now + needed
        wshare[wn] = share
      else
        allowed = false
        remaining = floor((window > deficit and window - deficit or 0) * rate + 1e-9)
        reset = deficit
        retry = ceil_ms(needed - window)
      end
    end
    if enforce and not allowed then admitted = false end
    local pttl = -2
    if retry == -1 then pttl = call('PTTL', KEYS[k + 2 * i]) end
    out[o + 1] = allowed and 1 or 0
    out[o + 2] = floor(limit + 1e-9)
    out[o + 3] = remaining
    out[o + 4] = ceil_ms(reset)
    out[o + 5] = retry
    out[o + 6] = floor(m * 1000000 + 0.5)
    out[o + 7] = pttl
    o = o + 7
  end
  if not admitted then
    out[head] = 0
  elseif consume or refund then
    -- Enforced scopes all allowed; shadow scopes are consumed where they allowed too.
    for j = 1, wn do
      local key = wkey[j]
      if not written[key] then order[#order + 1] = key end
      written[key] = wtat[j]
      if wshare[j] or wshared[key] then wshared[key] = wshare[j] end
    end
  end
  k = k + 2 * n
  a = a + 4 * n
end

for _, key in ipairs(order) do
  local tat = written[key]
  local ttl = ceil_ms(tat - now)
  if ttl < 1 then ttl = 1 end
  local share = wshared[key]
  if share then
    call('PSETEX', key, ttl, pack(dd, tat, share))
  else
    call('PSETEX', key, ttl, pack('d', tat))
  end
end
return pack('<' .. string.rep('i8', o), unpack(out, 1, o))
