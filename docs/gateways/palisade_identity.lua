-- Signed identities for Palisade (`X-Palisade-Identity`) in Envoy's Lua filter.
--
-- Envoy authenticates the caller first (e.g. `jwt_authn` with `claim_to_headers` putting the
-- verified `sub` into `x-verified-user`); this script then drops any identity header the
-- client sent and signs `v1.<exp>.<uid>.<did>.<sig>` for the verified user (and the app's
-- device id; `v2…` with the verified tenant when a tenant header is named), which the route's rate limit action passes to Palisade as the descriptor
-- entry `identity`. See docs/gateways/envoy-identity.yaml.
--
-- Envoy's Lua (LuaJIT) has no HMAC, so SHA-256 and HMAC are written here with LuaJIT's
-- `bit` library (FIPS 180-4, RFC 2104). Palisade's tests check what this file signs
-- against Palisade's own verifier (tests/api/docs.rs, run with Debian's luajit).

local bit = require("bit")
local band, bor, bxor, bnot = bit.band, bit.bor, bit.bxor, bit.bnot
local rshift, lshift, ror, tobit = bit.rshift, bit.lshift, bit.ror, bit.tobit

local K = {
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
}

local function be32(n)
  return string.char(band(rshift(n, 24), 0xff), band(rshift(n, 16), 0xff),
    band(rshift(n, 8), 0xff), band(n, 0xff))
end

local function sha256(message)
  local h = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 }
  local bits = #message * 8
  message = message .. "\128" .. string.rep("\0", (55 - #message) % 64)
    .. be32(math.floor(bits / 4294967296)) .. be32(bits % 4294967296)
  local w = {}
  for chunk = 1, #message, 64 do
    for i = 0, 15 do
      local a, b, c, d = message:byte(chunk + i * 4, chunk + i * 4 + 3)
      w[i] = bor(lshift(a, 24), lshift(b, 16), lshift(c, 8), d)
    end
    for i = 16, 63 do
      local s0 = bxor(ror(w[i - 15], 7), ror(w[i - 15], 18), rshift(w[i - 15], 3))
      local s1 = bxor(ror(w[i - 2], 17), ror(w[i - 2], 19), rshift(w[i - 2], 10))
      w[i] = tobit(w[i - 16] + s0 + w[i - 7] + s1)
    end
    local a, b, c, d, e, f, g, hh = h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8]
    for i = 0, 63 do
      local S1 = bxor(ror(e, 6), ror(e, 11), ror(e, 25))
      local ch = bxor(band(e, f), band(bnot(e), g))
      local t1 = tobit(hh + S1 + ch + K[i + 1] + w[i])
      local S0 = bxor(ror(a, 2), ror(a, 13), ror(a, 22))
      local maj = bxor(band(a, b), band(a, c), band(b, c))
      local t2 = tobit(S0 + maj)
      hh, g, f, e, d, c, b, a = g, f, e, tobit(d + t1), c, b, a, tobit(t1 + t2)
    end
    h[1], h[2], h[3], h[4] = tobit(h[1] + a), tobit(h[2] + b), tobit(h[3] + c), tobit(h[4] + d)
    h[5], h[6], h[7], h[8] = tobit(h[5] + e), tobit(h[6] + f), tobit(h[7] + g), tobit(h[8] + hh)
  end
  local out = {}
  for i = 1, 8 do out[i] = be32(h[i]) end
  return table.concat(out)
end

local function xor_with(key, byte)
  return (key:gsub(".", function(ch) return string.char(bxor(ch:byte(), byte)) end))
end

local function hmac_sha256(key, message)
  if #key > 64 then key = sha256(key) end
  key = key .. string.rep("\0", 64 - #key)
  return sha256(xor_with(key, 0x5c) .. sha256(xor_with(key, 0x36) .. message))
end

local ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

-- base64url without padding.
local function b64url(data)
  local out = {}
  for i = 1, #data, 3 do
    local a, b, c = data:byte(i, i + 2)
    local n = lshift(a, 16) + lshift(b or 0, 8) + (c or 0)
    local chars = 2 + (b and 1 or 0) + (c and 1 or 0)
    for j = 1, chars do
      local index = band(rshift(n, 18 - (j - 1) * 6), 63) + 1
      out[#out + 1] = ALPHABET:sub(index, index)
    end
  end
  return table.concat(out)
end

local M = {}

--- `v1.<exp>.<uid>.<did>.<sig>` for a user and device (either may be ""), or
--- `v2.<exp>.<uid>.<did>.<tid>.<sig>` with a tenant `tid` (the partner or app the gateway
--- authenticated), valid until `exp` (Unix seconds; Palisade accepts it 30 s longer).
function M.identity(secret, uid, did, exp, tid)
  local payload
  if tid ~= nil and tid ~= "" then
    payload = string.format("v2.%d.%s.%s.%s", exp, b64url(uid or ""), b64url(did or ""), b64url(tid))
  else
    payload = string.format("v1.%d.%s.%s", exp, b64url(uid or ""), b64url(did or ""))
  end
  return payload .. "." .. b64url(hmac_sha256(secret, payload))
end

M.sha256 = sha256
M.hmac_sha256 = hmac_sha256

--- The Lua filter's entry point: `secret` from the filter's code (see envoy-identity.yaml),
--- the verified user from `user_header`, the device from `x-device-id`, and the tenant from
--- `tenant_header` when given (a header Envoy set from the verified token, e.g. with
--- jwt_authn's claim_to_headers).
---
--- jwt_authn ADDS its claim headers to any the client sent: envoy-identity.yaml removes the
--- client's copies first, and a header with more than one value is never believed here
--- (nothing is signed: the caller is anonymous to Palisade).
function M.on_request(request_handle, secret, user_header, ttl, tenant_header)
  local headers = request_handle:headers()
  headers:remove("x-palisade-identity")
  local function single(name)
    if headers.getNumValues ~= nil and headers:getNumValues(name) > 1 then
      return nil, true
    end
    return headers:get(name), false
  end
  local user, user_repeated = single(user_header or "x-verified-user")
  local tenant, tenant_repeated = "", false
  if tenant_header then
    tenant, tenant_repeated = single(tenant_header)
  end
  if user == nil or user == "" or user_repeated or tenant_repeated then
    return
  end
  local device = headers:get("x-device-id") or ""
  headers:add("x-palisade-identity", M.identity(secret, user, device, os.time() + (ttl or 60), tenant or ""))
end

return M
