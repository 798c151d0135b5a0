-- common.lua: helpers shared by every algorithm of ratelimitd's decision
-- script (see decide.lua for the script's KEYS/ARGV/return contract).
--
-- Lua's numbers are float64. Every value below is an integer under 2^53,
-- which float64 holds exactly, and every operation is one Go does on int64
-- (or the same float64 operation, in the same order), so the Lua twins and
-- the Go step functions of package algo compute identical results.

local floor, ceil, min, max = math.floor, math.ceil, math.min, math.max
local NEVER = -1 -- the retry-after of hits that no waiting admits

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

-- algorithms maps a rule-file name to its implementation:
--   decode(v) -> state             the state of a string key's value v
--                                  (from the driver's MGET), or
--   load(key, now, l) -> state     the state stored under key, read by the
--                                  algorithm itself (a state that is no string)
--   step(s, now, l, hits) -> next, allowed, remaining, reset_us, retry_us, wait_us
--   store(key, s, now, l, ttl_ms, prev) saves a state that was admitted;
--                                  prev is the key's state as it stands
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
