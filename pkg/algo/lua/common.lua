-- common.lua: helpers shared by every algorithm of ratelimitd's decision
-- script (see decide.lua for the script's KEYS/ARGV/return contract).
--
-- Lua's numbers are float64. Every value below is an integer under 2^53,
-- which float64 holds exactly, and every operation is one Go does on int64
-- (or the same float64 operation, in the same order), so the Lua twins and
-- the Go step functions of package algo compute identical results.

local floor, ceil, min, max = math.floor, math.ceil, math.min, math.max
local NEVER = -1 -- the retry-after of hits that no waiting admits
local MAX_COUNT = 9007199254740991 -- 2^53 - 1: a window's count saturates there (algo's maxCount)

-- fmt formats an integer exactly; redis.call would format a number with
-- %.14g and lose the last digits of a microsecond timestamp.
local function fmt(x)
  return string.format('%d', x)
end

-- divmod returns floor(x / n) and x - n*floor(x / n), exactly.
local function divmod(x, n)
  local q = floor(x / n)
  local r = x - q * n
  if r < 0 then
    q, r = q - 1, r + n
  elseif r >= n then
    q, r = q + 1, r - n
  end
  return q, r
end

local function floor_mod(x, n)
  local _, r = divmod(x, n)
  return r
end

-- The bucket algorithms keep instants as us + f/N microseconds, 0 <= f < N
-- (see rate and inst in package algo). A rate is the emission interval
-- T = W/N us, as W = wq*N + wr.
local function new_rate(n, w)
  local wq, wr = divmod(w, n)
  return {n = n, wq = wq, wr = wr}
end

-- stored returns the instant a state stores as us + f/N; a fraction stored
-- under a larger N (the rule changed) is cut to the largest of this one.
local function stored(r, us, f)
  return us, min(max(f, 0), r.n - 1)
end

-- cost returns k*T.
local function cost(r, k)
  local q, f = divmod(k * r.wr, r.n)
  return k * r.wq + q, f
end

local function add(r, aus, af, bus, bf)
  local us, f = aus + bus, af + bf
  if f >= r.n then
    us, f = us + 1, f - r.n
  end
  return us, f
end

local function sub(r, aus, af, bus, bf)
  local us, f = aus - bus, af - bf
  if f < 0 then
    us, f = us - 1, f + r.n
  end
  return us, f
end

local function cmp(aus, af, bus, bf)
  if aus < bus or (aus == bus and af < bf) then
    return -1
  elseif aus == bus and af == bf then
    return 0
  end
  return 1
end

local function ceil_us(us, f)
  if f > 0 then
    return us + 1
  end
  return us
end

-- fit returns the largest k in [0, most] with cost(k) <= e: an estimate in
-- float64, then corrected against exact costs.
local function fit(r, eus, ef, most)
  local k = floor((eus * r.n + ef) / (r.wq * r.n + r.wr))
  k = max(0, min(k, most))
  while k < most do
    local cu, cf = cost(r, k + 1)
    if cmp(cu, cf, eus, ef) > 0 then
      break
    end
    k = k + 1
  end
  while k > 0 do
    local cu, cf = cost(r, k)
    if cmp(cu, cf, eus, ef) <= 0 then
      break
    end
    k = k - 1
  end
  return k
end

-- hits_in returns the least k in [0, most] with cost(k) >= d.
local function hits_in(r, dus, df, most)
  local k = fit(r, dus, df, most)
  if k < most then
    local cu, cf = cost(r, k)
    if cmp(cu, cf, dus, df) < 0 then
      k = k + 1
    end
  end
  return k
end

-- add_count returns c + hits, saturated at MAX_COUNT (algo's addCount).
local function add_count(c, hits)
  return min(c + min(hits, MAX_COUNT), MAX_COUNT)
end

-- algorithms maps a rule-file name to its implementation:
--   decode(v) -> state             the state of a string key's value v
--                                  (from the driver's MGET), or
--   load(key, now, l) -> state     the state stored under key, read by the
--                                  algorithm itself (a state that is no string)
--   step(s, now, l, hits, strict) -> next, allowed, remaining, reset_us, retry_us, wait_us
--                                  with strict, zero hits are refused while
--                                  the limit holds more than it admits
--                                  (algo's stepWith)
--   store(key, s, now, l, ttl_ms, prev) saves a state that was admitted;
--                                  prev is the key's state as it stands
--   count(s, now, l, hits) -> next the state with the hits of a refused
--                                  request counted beyond what remains
--                                  (algo's overcount), for l.n > 0
-- where l = {n = N, w = W in us, b = B, rate = new_rate(N, W) when N > 0}
-- (see limit_of in decide.lua). step is pure, as algo.Step is: it returns s
-- itself when the request is refused or hits is 0.
local algorithms = {}

-- keep_ttl tells whether SET takes KEEPTTL (Redis 6.0; REDIS_VERSION_NUM
-- itself is 7.0's).
local keep_ttl = (redis.REDIS_VERSION_NUM or 0) >= 0x060000

-- same_window tells whether the stored state prev and the state s that
-- replaces it count hits of the same window t, and so expire together: the
-- TTL of the window algorithms runs to a point their window fixes.
local function same_window(prev, s)
  return prev.c > 0 and prev.t == s.t
end

-- string_state returns decode and store for a state kept as a Redis
-- string of space-separated integers, one per field (at most four):
--   decode(v) -> state          the state of the string v; a missing key
--                               (v false or nil) decodes as all zeros, the
--                               zero algo.State
--   store(key, s, now, l, ttl_ms, prev) saves s under key
-- The driver reads every key of a call with one MGET and hands decode the
-- values; one redis.call per key is the larger part of a decision's cost.
-- With same_expiry(prev, s) true, the key already expires when s would,
-- and store keeps its TTL: a SET without an expiry to set and propagate
-- costs Redis about 0.9 us less.
local function string_state(fields, same_expiry)
  local nf = #fields
  local f1, f2, f3, f4 = fields[1], fields[2], fields[3], fields[4]
  local pattern = '^' .. string.rep('(%-?%d+) ', nf - 1) .. '(%-?%d+)$'
  local layout = string.rep('%d ', nf - 1) .. '%d'
  local match, format = string.match, string.format
  local function decode(v)
    local s = {[f1] = 0, [f2] = 0}
    if f3 then s[f3] = 0 end
    if f4 then s[f4] = 0 end
    if v then
      local a, b, c, d = match(v, pattern)
      if a then
        s[f1], s[f2] = tonumber(a), tonumber(b)
        if f3 then s[f3] = tonumber(c) end
        if f4 then s[f4] = tonumber(d) end
      else
        -- Not this layout (a state of another release): its leading
        -- integers, zeros after them, as before.
        local i = 1
        for x in string.gmatch(v, '%-?%d+') do
          if i > nf then break end
          s[fields[i]] = tonumber(x)
          i = i + 1
        end
      end
    end
    return s
  end
  local function store(key, s, now, l, ttl_ms, prev)
    local v = format(layout, s[f1], s[f2], s[f3], s[f4])
    if keep_ttl and same_expiry and same_expiry(prev, s) then
      redis.call('SET', key, v, 'KEEPTTL')
    else
      redis.call('SET', key, v, 'PX', fmt(ttl_ms))
    end
  end
  return decode, store
end

-- Leases outstanding on a bucket (algo's leases): a flat list of pairs
-- {end1, hits1, end2, hits2, ...}, ordered by end; nil or {} when none.
-- Like the Go twins, the functions below return new lists and never
-- change the one they are given.

-- lease_hits returns the hits of every lease of h.
local function lease_hits(h)
  local n = 0
  if h then
    for i = 2, #h, 2 do
      n = n + h[i]
    end
  end
  return n
end

-- live_entries returns the entries of h, each of stride values and the
-- first its end, that end after now: a new list, or h itself when every
-- entry does. Leases are entries of 2 (end, hits), reservations of 5.
local function live_entries(h, now, stride)
  if h == nil then
    return nil
  end
  local i = 1
  while i + stride - 1 <= #h and h[i] <= now do
    i = i + stride
  end
  if i == 1 then
    return h
  end
  local out = {}
  for j = i, #h do
    out[#out + 1] = h[j]
  end
  return out
end

-- live_leases returns the leases of h that end after now.
local function live_leases(h, now)
  return live_entries(h, now, 2)
end

-- lease_with returns h with n more hits in the lease ending at e.
local function lease_with(h, e, n)
  local out, i = {}, 1
  h = h or {}
  while i <= #h and h[i] < e do
    out[#out + 1], out[#out + 2] = h[i], h[i + 1]
    i = i + 2
  end
  if i <= #h and h[i] == e then
    out[#out + 1], out[#out + 2] = e, h[i + 1] + n
    i = i + 2
  else
    out[#out + 1], out[#out + 2] = e, n
  end
  for j = i, #h do
    out[#out + 1] = h[j]
  end
  return out
end

-- lease_without returns h with up to n hits taken out of the lease ending
-- at mark, and the hits taken out: none when no lease ends at mark.
local function lease_without(h, mark, n)
  if h == nil then
    return h, 0
  end
  for i = 1, #h, 2 do
    if h[i] == mark then
      local k = min(n, h[i + 1])
      local out = {}
      for j = 1, i - 1 do
        out[#out + 1] = h[j]
      end
      if h[i + 1] > k then
        out[#out + 1], out[#out + 2] = mark, h[i + 1] - k
      end
      for j = i + 2, #h do
        out[#out + 1] = h[j]
      end
      return out, k
    end
  end
  return h, 0
end

-- lease_fit_after returns the first lease end after which the leases of h
-- still outstanding hold at most room hits, or 0 when they already do.
local function lease_fit_after(h, room)
  local out = lease_hits(h)
  local i = 1
  while i <= #h and out > room do
    out = out - h[i + 1]
    if out <= room then
      return h[i]
    end
    i = i + 2
  end
  return 0
end

-- lease_size is what a take of hits takes when avail hits remain:
-- max(hits, min(most, floor(avail / share))).
local function lease_size(hits, avail, most, share)
  local q = divmod(avail, max(share, 1))
  return max(hits, min(most, q))
end

-- bucket_taken returns what a bucket's request of hits takes when avail
-- remain: its hits, or for a take (o 't') the lease's size.
local function bucket_taken(o, hits, avail, most, share)
  if o == 't' then
    return lease_size(hits, avail, most, share)
  end
  return hits
end

-- bucket_hold returns the leases live with the lease of a request that
-- took taken hits for its own hits, its mark and its valid_us: a lease of
-- what it took beyond its hits, outstanding for ttl.
local function bucket_hold(live, now, ttl, taken, hits)
  if taken > hits then
    return lease_with(live, now + ttl, taken - hits), now + ttl, ttl
  end
  return live, 0, 0
end

-- bucket_state returns decode and store for a bucket's state: a string of
-- the integer fields, then the leases outstanding, as a flat list of
-- integers "f1 f2 ... end1 hits1 end2 hits2 ...". decode returns the
-- fields of a table whose h holds the leases (nil when none); a missing
-- key decodes as zeros. It is string_state's layout when no lease is
-- outstanding, so a bucket never leased keeps its string.
local function bucket_state(fields)
  local nf = #fields
  local plain_decode = string_state(fields)
  local match, gmatch, format, concat = string.match, string.gmatch, string.format, table.concat
  local plain = '^' .. string.rep('%-?%d+ ', nf - 1) .. '%-?%d+$'
  local layout = string.rep('%d ', nf - 1) .. '%d'
  local function decode(v)
    if not v or match(v, plain) then
      return plain_decode(v)
    end
    local s, h, i = {}, nil, 1
    for _, f in ipairs(fields) do
      s[f] = 0
    end
    for x in gmatch(v, '%-?%d+') do
      if i <= nf then
        s[fields[i]] = tonumber(x)
      else
        h = h or {}
        h[#h + 1] = tonumber(x)
      end
      i = i + 1
    end
    if h and #h % 2 == 1 then
      h[#h] = nil
    end
    s.h = h
    return s
  end
  local function store(key, s, now, l, ttl_ms, prev)
    local v = format(layout, s[fields[1]], s[fields[2]], s[fields[3]])
    if s.h and #s.h > 0 then
      local parts = {v}
      for i = 1, #s.h do
        parts[#parts + 1] = fmt(s.h[i])
      end
      v = concat(parts, ' ')
    end
    redis.call('SET', key, v, 'PX', fmt(ttl_ms))
  end
  return decode, store
end
