-- decide.lua: ratelimitd's decision driver. decide(KEYS, ARGV) decides a
-- batch of requests atomically, with the algorithms defined above it.
--
-- KEYS[i]  the state key of request i (two requests may share a key: the
--          later one then sees the earlier one's hits).
-- ARGV[1]  now, in us since the Unix epoch; empty to read the Redis clock
--          (TIME), so that replicas with skewed clocks agree.
-- ARGV[2]  the least TTL of a stored key, in ms: 0 in production; tests
--          whose clock is not the Redis clock keep keys longer with it.
--          It may be followed by " NOT_AFTER", in us on the Redis clock:
--          the caller gives up then, so a call that Redis runs later
--          (one that waited in a stalled Redis's socket) decides and
--          stores nothing, and answers an error starting with
--          "ratelimitd: late".
-- ARGV[3 + 3*(i-1) ...]  request i: its limit "algorithm N W B" (W in us,
--          >= 1; B the bucket capacity, N when the rule sets none), hits,
--          and flags: a digit, the sum of 1 shadow, 2 peek (decided, never
--          stored) and 4 count (hits refused are counted all the same,
--          algo.Request.Count); followed, for a lease (algo.OpTake, algo.OpGive), by
--          " t MAX SHARE TTL_US" or " g MARK", as in "0 t 500 8 2000000";
--          or, for a reservation (algo.OpReserve), " h TTL_US", for a settle
--          (algo.OpSettle), " s" (with the count flag);
--          or, for a fixed window kept in envoyproxy/ratelimit's layout
--          (algo.Plain), by " w AT_US TTL_S": the request is decided at
--          AT_US, the replica's clock that named its key's window, and the
--          key holds the window's count alone, a plain integer, which the
--          script raises with INCRBY and, when it creates the key, gives a
--          TTL of TTL_S seconds (EXPIRE), as the reference does.
--
-- Returns {admitted, then for each request: allowed, remaining, reset_us,
-- retry_us, wait_us, then k, then k times: index, taken, mark, valid_us},
-- all integers: admitted and allowed are 1 or 0, retry_us is -1 for never,
-- and the k quadruples describe the takes of an admitted batch that took
-- something, by their index (from 0) in the batch.
--
-- The batch is admitted when every request is allowed but shadow ones;
-- then every allowed request but peek ones is stored, with a TTL of its reset-after
-- rounded up to the millisecond. Otherwise nothing is stored and every
-- decision describes the state as it stands: allowed requests report it
-- without their hits, refused ones keep their retry-after. Requests that
-- count (flag 4) are stored either way, a refusal with its hits counted
-- beyond what remains; in a refused batch they are decided again, in
-- order, from the states the batch found, each seeing only the earlier
-- counting requests of its key (algo.Backend).
--
-- ARGV[3] = 'batches' asks for several batches in one call, each decided
-- on its own, all or nothing, in order: ARGV[4] is their number B, ARGV[5]
-- to ARGV[4 + B] the number of requests of each, and their requests'
-- arguments follow, batch after batch, as KEYS do. The reply is each
-- batch's reply in turn. A batch's number may be followed by " NOT_AFTER"
-- (us on the Redis clock), that batch's caller's: a batch the call runs
-- later is decided and stored nothing, and its reply is that of a batch
-- refused whose admitted is -1 and every other value 0.
--
-- What a decision costs Redis is mostly calls and tables: every key of the
-- call is read with one MGET, a limit is parsed once (limit_of), and a
-- batch of one request, the common case, allocates no table of its own.

-- limits caches limit_of's answers by their argument. A function library
-- keeps it from call to call; a script builds it anew each call. It is
-- emptied when it holds max_limits, so odd arguments cannot grow it.
local limits, nlimits, max_limits = {}, 0, 1000

-- limit_of returns the limit table of a request's limit argument, or nil
-- and an error message.
local function limit_of(arg)
  local l = limits[arg]
  if l then
    return l
  end
  local name, n, w, b = string.match(arg, '^([%w_]+) (%d+) (%d+) (%d+)$')
  if name == nil then
    return nil, 'ratelimitd: malformed limit ' .. tostring(arg)
  end
  local alg = algorithms[name]
  if alg == nil then
    return nil, 'ratelimitd: unknown algorithm ' .. tostring(name)
  end
  l = {alg = alg, n = tonumber(n), w = tonumber(w), b = tonumber(b)}
  if l.w < 1 then
    return nil, 'ratelimitd: window under 1 us in ' .. arg
  end
  if l.n > 0 then
    l.rate = new_rate(l.n, l.w)
  end
  if nlimits >= max_limits then
    limits, nlimits = {}, 0
  end
  limits[arg], nlimits = l, nlimits + 1
  return l
end

-- The call being decided: set by decide, read by the functions below.
-- Redis runs one call at a time.
local keys, vals, stored_states, now, min_ttl

-- load returns the state of KEYS[j] for limit l: for a string state, as an
-- earlier batch of this call stored it, else as MGET read it.
local function load(j, l)
  local alg = l.alg
  if alg.load then
    return alg.load(keys[j], now, l)
  end
  local s = stored_states[keys[j]]
  if s == nil then
    s = alg.decode(vals[j])
  end
  return s
end

-- plain_load returns the state of KEYS[j], a fixed window kept in the
-- reference layout (a plain integer count of the window that holds at):
-- as an earlier batch of this call left it, else as MGET read it. A key
-- that does not exist is marked fresh: storing it sets its TTL.
local function plain_load(j, at, l)
  local s = stored_states[keys[j]]
  if s == nil then
    local c = tonumber(vals[j])
    s = {t = at - floor_mod(at, l.w), c = c or 0, fresh = c == nil}
  end
  return s
end

-- plain_save stores the admitted state s of KEYS[j], kept in the reference
-- layout, whose state was prev: it adds the hits admitted since prev with
-- INCRBY, so that hits a reference pod counted meanwhile are kept, and
-- sets the TTL of a key it created.
local function plain_save(j, s, prev, ttl)
  local key = keys[j]
  local delta = s.c - max(prev.c, 0)
  if delta > 0 then
    redis.call('INCRBY', key, fmt(delta))
    if prev.fresh then
      redis.call('EXPIRE', key, fmt(ttl))
    end
  end
  stored_states[key] = {t = s.t, c = s.c}
end

-- save stores the admitted state s of KEYS[j], whose state was prev, with
-- the reset-after of the request that left it.
local function save(j, l, s, reset, prev)
  local key, alg = keys[j], l.alg
  if reset > 0 then
    alg.store(key, s, now, l, max(ceil(reset / 1000), min_ttl), prev)
  else
    redis.call('DEL', key) -- a state that frees up at once is no state
  end
  if alg.decode then
    stored_states[key] = reset > 0 and s or alg.decode(nil)
  end
end

-- parse_flags reads a request's flags: it returns the flag digit, then
-- the lease op ('t' or 'g', nil for none) and its integer arguments.
local function parse_flags(flags)
  if #flags == 1 then
    return flags
  end
  local f, o, rest = string.match(flags, '^(%d) ([tgarnwhs]) ?(.*)$')
  if o == 'h' then
    return f, o, tonumber(rest)
  elseif o == 's' then
    return f, o
  elseif o == 'w' then
    local at, ttl = string.match(rest, '^(%d+) (%d+)$')
    return f, o, tonumber(at), tonumber(ttl)
  elseif o == 't' then
    local most, share, ttl = string.match(rest, '^(%d+) (%d+) (%d+)$')
    return f, o, tonumber(most), tonumber(share), tonumber(ttl)
  elseif o == 'g' then
    return f, o, tonumber(string.match(rest, '^(%-?%d+)$'))
  elseif o then
    return f, o, rest -- a concurrency op and its holder
  end
  return flags
end

-- flag tells whether the flag digit f has bit: 1 shadow, 2 peek, 4 count.
local function flag(f, bit)
  return floor(tonumber(f) / bit) % 2 == 1
end

-- overcount counts the hits of a request of limit l refused on the state
-- s, o its lease op (algo's overcount): it returns the state with them
-- counted, then the refusal as that state stands: remaining, reset_us,
-- retry_us. A request that is not counted (algo.Counted: no hits, a limit
-- of zero, a give or a slot) gets nil.
local function overcount(l, s, hits, o)
  local alg = l.alg
  if hits == 0 or l.n == 0 or alg.count == nil or (o ~= nil and o ~= 't') then
    return nil
  end
  local next = alg.count(s, now, l, hits)
  local _, _, remaining, reset, retry = alg.step(next, now, l, hits)
  return next, remaining, reset, retry
end

-- leases tells whether limit l's algorithm leases (algo.Leasable).
local function leases(l)
  return not l.alg.slots and (l.alg.op ~= nil or l.alg.give ~= nil)
end

-- stores tells whether a request's state is stored once its batch is
-- admitted (algo.Stores).
local function stores(l, o, hits, taken, allowed, peek)
  if not allowed or peek then
    return false
  elseif l.alg.slots then
    return taken > 0
  end
  return (hits > 0 or taken > 0) and not (o == 'g' and not leases(l))
end

-- apply_op applies a request of limit l to the state s (algo.Apply but
-- for counting): it returns next, allowed, remaining, reset_us, retry_us,
-- wait_us, taken, mark, valid_us. A give of an algorithm that never leases
-- changes nothing, and is not stored. strict is set for the zero hits of a
-- request that counts (algo's stepWith).
local function apply_op(l, s, hits, o, x, y, z, strict)
  local alg = l.alg
  if alg.slots then
    return alg.op(s, now, l, hits, o, x)
  elseif o == 'h' and alg.reserve then
    return alg.reserve(s, now, l, hits, x)
  elseif o == 's' and alg.settle then
    return alg.settle(s, now, l, hits)
  elseif o ~= nil and alg.op then
    return alg.op(s, now, l, hits, o, x, y, z, x, strict)
  end
  if o == 'g' then
    if alg.give then
      local next, remaining, reset = alg.give(s, now, l, hits, x)
      return next, true, remaining, reset, 0, 0, 0, 0, 0
    end
    local _, _, remaining, reset = alg.step(s, now, l, 0)
    return s, true, remaining, reset, 0, 0, 0, 0, 0
  end
  local next, allowed, remaining, reset, retry, wait = alg.step(s, now, l, hits, strict)
  if o ~= 't' or not alg.windowed or not allowed then
    return next, allowed, remaining, reset, retry, wait, 0, 0, 0
  end
  -- A take of a window: the hits, and a lease of what remains.
  local taken, mark, valid = lease_size(hits, remaining + hits, x, y), 0, 0
  if taken > hits then
    next, allowed, remaining, reset, retry, wait = alg.step(s, now, l, taken)
    mark, valid = next.t, next.t + l.w - now -- until the window ends
  end
  return next, allowed, remaining, reset, retry, wait, taken, mark, valid
end

-- apply applies a request of limit l to the state s (algo.Apply): as
-- apply_op, and for a request that counts (counts, algo's
-- Request.Counting) and is refused, with its hits counted all the same.
-- It returns apply_op's values, then whether it counted refused hits.
local function apply(l, s, hits, o, x, y, z, counts)
  local next, allowed, remaining, reset, retry, wait, taken, mark, valid = apply_op(l, s, hits, o, x, y, z, counts and hits == 0)
  if not allowed and counts then
    local c, cr, cs, ct = overcount(l, s, hits, o)
    if c then
      return c, false, cr, cs, ct, wait, taken, mark, valid, true
    end
  end
  return next, allowed, remaining, reset, retry, wait, taken, mark, valid, false
end

-- The fixed window's common case, decided without tables: a request of
-- flags '0' (not shadow or peek; no lease or reservation), or '4' (it
-- counts refused hits) when it is admitted with hits, on a key that holds
-- no state or a plain "t c" (no reservations), which no earlier batch of
-- the call stored; and the same request kept in the reference layout
-- (" w AT TTL"), whose key holds a plain count. It is what
-- algorithms.fixed_window.step, load and save, and plain_load and
-- plain_save, do for that case, step for step: TestGoAndLua* and the
-- conformance vectors hold it to the Go twin. Anything else takes the
-- general path, as before.
local fw_match, fw_layout = string.match, '%d %d'

-- fw_view returns what KEYS[j] holds for the fixed window l at now, when
-- it is the common case: the window's start and end, its count, and the
-- window the key stored; nil otherwise.
local function fw_view(j, l)
  if stored_states[keys[j]] ~= nil then
    return nil
  end
  local v, t, c = vals[j], 0, 0
  if v then
    t, c = fw_match(v, '^(%-?%d+) (%-?%d+)$')
    if t == nil then
      return nil -- reservations, or a state of another layout
    end
    t, c = tonumber(t), tonumber(c)
  end
  local w = l.w
  local start = now - floor_mod(now, w)
  if t > start and t - start <= w then
    start = t -- a clock stepped back: the stored window keeps counting
  end
  if t ~= start or c <= 0 then
    c = 0
  end
  return start, start + w, c, t
end

-- fw_plain_view is fw_view for a key in the reference layout, whose value
-- is the count of the window that holds now (plain_load); its last value
-- is false when the key does not exist (its TTL is then set).
local function fw_plain_view(j, l)
  if stored_states[keys[j]] ~= nil then
    return nil
  end
  local v, c = vals[j], 0
  if v then
    c = tonumber(v)
    if c == nil then
      return nil
    end
  end
  local start = now - floor_mod(now, l.w)
  return start, start + l.w, max(c, 0), v and true or false
end

-- fw_store stores the count c of the window starting at start in KEYS[j],
-- whose stored window and count were t and was (fixed_window's store): a
-- later write of the same window keeps the key's TTL.
local function fw_store(j, start, c, stop, was, t)
  local key = keys[j]
  local v = string.format(fw_layout, start, c)
  if keep_ttl and was > 0 and t == start then
    redis.call('SET', key, v, 'KEEPTTL')
  else
    redis.call('SET', key, v, 'PX', fmt(max(ceil((stop - now) / 1000), min_ttl)))
  end
  stored_states[key] = {t = start, c = c}
end

-- fw_reply appends the reply of a fixed window's request of hits on a
-- window [start, stop) counting used of l.n: allowed, remaining,
-- reset_us, retry_us, wait_us, as decide_one would.
local function fw_reply(reply, p, l, hits, start, stop, used)
  local n = l.n
  local remaining = n - min(used, n)
  if hits > remaining then
    local retry = stop - now
    if hits > n then
      retry = NEVER
    end
    reply[p], reply[p + 1], reply[p + 2], reply[p + 3], reply[p + 4] = 0, remaining, used > 0 and stop - now or 0, retry, 0
    return false
  end
  local reset = stop - now
  if hits == 0 and used == 0 then
    reset = 0
  end
  reply[p], reply[p + 1], reply[p + 2], reply[p + 3], reply[p + 4] = 1, remaining - hits, reset, 0, 0
  return true
end

-- fw_fits tells whether a request of hits that counts refused hits takes
-- the common case: only when its hits are admitted; a refusal counts
-- them, and zero hits are refused past the limit (algo's stepWith).
local function fw_fits(counts, l, hits, used)
  return not counts or (hits > 0 and hits <= l.n - min(used, l.n))
end

-- fw_one decides a batch of one request of limit l and hits whose flags
-- are flags, KEYS[k], appending its reply, when it is the common case; it
-- returns false, having done nothing, otherwise.
local function fw_one(k, l, hits, flags, reply)
  local digit, at, ttl = flags, nil, nil
  if #flags > 1 then
    digit, at, ttl = fw_match(flags, '^([04]) w (%d+) (%d+)$')
    if digit == nil then
      return false
    end
  elseif flags ~= '0' and flags ~= '4' then
    return false
  end
  local call_now = now
  if at then
    now = tonumber(at) -- decided at the instant that named the key's window
  end
  local start, stop, used, t
  if at then
    start, stop, used, t = fw_plain_view(k, l)
  else
    start, stop, used, t = fw_view(k, l)
  end
  if start == nil or not fw_fits(digit == '4', l, hits, used) then
    now = call_now
    return false
  end
  local n = #reply
  local allowed = fw_reply(reply, n + 2, l, hits, start, stop, used)
  reply[n + 1], reply[n + 7] = allowed and 1 or 0, 0
  if allowed and hits > 0 then
    if not at then
      fw_store(k, start, used + hits, stop, used, t)
    else
      -- plain_save: the hits admitted, with INCRBY; a new key's TTL.
      local key = keys[k]
      redis.call('INCRBY', key, fmt(hits))
      if not t then
        redis.call('EXPIRE', key, ttl)
      end
      stored_states[key] = {t = start, c = used + hits}
    end
  end
  now = call_now
  return true
end

-- fw_scratch holds fw_batch's views, six values a request, from call to
-- call: a batch of the common case allocates no table.
local fw_scratch, fw_most = {}, 8

-- fw_batch decides the batch of count requests whose first key is KEYS[k]
-- and first argument ARGV[a] when every request is the common case (but
-- for the reference layout), on keys of its own within the batch,
-- appending its reply as decide_batch would; it returns false, having
-- done nothing, otherwise.
local function fw_batch(argv, k, count, a, reply)
  if count > fw_most then
    return false
  end
  local sc, fw, counting = fw_scratch, algorithms.fixed_window, false
  for i = 1, count do
    local j, ai, q = k + i - 1, a + 3 * (i - 1), 6 * (i - 1)
    local flags = argv[ai + 2]
    local l = (flags == '0' or flags == '4') and limit_of(argv[ai])
    if not l or l.alg ~= fw then
      return false
    end
    for m = k, j - 1 do
      if keys[m] == keys[j] then
        return false -- a key twice: each request sees the one before
      end
    end
    local start, stop, used, t = fw_view(j, l)
    if start == nil then
      return false
    end
    counting = counting or flags == '4'
    sc[q + 1], sc[q + 2], sc[q + 3], sc[q + 4], sc[q + 5], sc[q + 6] = l, tonumber(argv[ai + 1]), start, stop, used, t
  end
  for i = 1, counting and count or 0 do
    -- A refused batch stores its counting requests: the general path's.
    local q = 6 * (i - 1)
    if not fw_fits(true, sc[q + 1], sc[q + 2], sc[q + 5]) then
      return false
    end
  end
  local o = #reply
  local admitted = true
  for i = 1, count do
    local q = 6 * (i - 1)
    if not fw_reply(reply, o + 2 + 5 * (i - 1), sc[q + 1], sc[q + 2], sc[q + 3], sc[q + 4], sc[q + 5]) then
      admitted = false
    end
  end
  reply[o + 1], reply[o + 2 + 5 * count] = admitted and 1 or 0, 0
  for i = count, 1, -1 do
    local q, p = 6 * (i - 1), o + 2 + 5 * (i - 1)
    local l, hits, start, stop, used = sc[q + 1], sc[q + 2], sc[q + 3], sc[q + 4], sc[q + 5]
    if not admitted then
      -- Nothing is stored; each reports the state as it stands.
      reply[p + 1], reply[p + 2], reply[p + 4] = l.n - min(used, l.n), used > 0 and stop - now or 0, 0
    elseif hits > 0 then
      fw_store(k + i - 1, start, used + hits, stop, used, sc[q + 6])
    end
  end
  return true
end

-- decide_one decides a batch of one request, KEYS[k] with its arguments at
-- ARGV[a], appending its reply to reply; it returns an error message or
-- nil. It is decide_batch for count 1, without the tables.
local function decide_one(argv, k, a, reply)
  local l, err = limit_of(argv[a])
  if l == nil then
    return err
  end
  local hits, flags = tonumber(argv[a + 1]), argv[a + 2]
  if l.alg == algorithms.fixed_window and fw_one(k, l, hits, flags, reply) then
    return nil
  end
  local o, x, y, z
  if #flags > 1 then
    flags, o, x, y, z = parse_flags(flags)
  end
  local call_now, plain, s = now, o == 'w', nil
  if plain then
    now, o = x, nil -- decided at the instant that named the key's window
    s = plain_load(k, now, l)
  else
    s = load(k, l)
  end
  local counts = flag(flags, 4) and (o == nil or o == 't' or o == 's') -- algo's Request.Counting
  local next, allowed, remaining, reset, retry, wait, taken, mark, valid, counted = apply(l, s, hits, o, x, y, z, counts)
  local peek = flag(flags, 2)
  local n = #reply
  if counted and not peek or stores(l, o, hits, taken, allowed, peek) then
    if plain then
      plain_save(k, next, s, y)
    else
      save(k, l, next, reset, s)
    end
  end
  if allowed then
    reply[n + 1] = 1
  elseif flag(flags, 1) then
    reply[n + 1] = 1 -- a shadow refusal refuses nothing
  else
    reply[n + 1] = 0
    if not counted then
      local _
      _, _, remaining, reset = l.alg.step(s, now, l, 0)
    end
    wait = 0
  end
  reply[n + 2], reply[n + 3], reply[n + 4], reply[n + 5], reply[n + 6] = allowed and 1 or 0, remaining, reset, retry, wait
  if taken > 0 and allowed then
    reply[n + 7], reply[n + 8], reply[n + 9], reply[n + 10], reply[n + 11] = 1, 0, taken, mark, valid
  else
    reply[n + 7] = 0
  end
  now = call_now
end

-- decide_batch decides the batch of count requests whose first key is
-- KEYS[k] and whose first argument is ARGV[a], and appends its reply to
-- reply: admitted, then five integers per request, then its takes. It
-- returns an error message, or nil.
local function decide_batch(argv, k, count, a, reply)
  if count == 1 then
    return decide_one(argv, k, a, reply)
  elseif fw_batch(argv, k, count, a, reply) then
    return nil
  end
  -- reqs[i]: {l, whether it stores, the key's state at the batch's start,
  -- the next state when allowed, reset, taken, mark, valid}; start and
  -- current: each key's state at the batch's start and after the requests
  -- decided so far.
  local reqs, start, current = {}, {}, {}
  local o = #reply
  reply[o + 1] = 1
  for i = 1, count do
    local j, ai = k + i - 1, a + 3 * (i - 1)
    local l, err = limit_of(argv[ai])
    if l == nil then
      return err
    end
    local hits, flags = tonumber(argv[ai + 1]), argv[ai + 2]
    local op, x, y, z
    if #flags > 1 then
      flags, op, x, y, z = parse_flags(flags)
    end
    local key = keys[j]
    local call_now, plain = now, nil
    if op == 'w' then
      now, op, plain = x, nil, {x, y} -- decided at the instant that named the key's window
    end
    if start[key] == nil then
      start[key] = plain and plain_load(j, now, l) or load(j, l)
      current[key] = start[key]
    end
    local cur = current[key]
    local counts = flag(flags, 4) and (op == nil or op == 't' or op == 's') -- algo's Request.Counting
    local next, allowed, remaining, reset, retry, wait, taken, mark, valid, counted = apply(l, cur, hits, op, x, y, z, counts)
    local peek = flag(flags, 2)
    now = call_now
    local r = {l, counted and not peek or stores(l, op, hits, taken, allowed, peek), start[key], nil, reset, taken, mark, valid, plain,
      counts and {hits, peek, op == 's' and op or nil}}
    if allowed or counted then
      current[key] = next
      r[4] = next
    end
    if not allowed and not flag(flags, 1) then
      reply[o + 1] = 0
    end
    reqs[i] = r
    local p = o + 2 + 5 * (i - 1)
    reply[p], reply[p + 1], reply[p + 2], reply[p + 3], reply[p + 4] = allowed and 1 or 0, remaining, reset, retry, wait
  end

  local e = o + 2 + 5 * count
  reply[e] = 0
  if reply[o + 1] == 1 then
    -- Each key keeps the state its last stored request left.
    for i = count, 1, -1 do
      local r = reqs[i]
      local key = keys[k + i - 1]
      if r[2] and current[key] ~= false then
        if r[9] then
          plain_save(k + i - 1, r[4], r[3], r[9][2])
        else
          save(k + i - 1, r[1], r[4], r[5], r[3])
        end
        current[key] = false
      end
    end
    for i = 1, count do
      local r = reqs[i]
      if r[6] > 0 and r[4] then
        local q = e + 4 * reply[e]
        reply[q + 1], reply[q + 2], reply[q + 3], reply[q + 4] = i - 1, r[6], r[7], r[8]
        reply[e] = reply[e] + 1
      end
    end
  else
    -- Requests that count are decided again, as plain decisions (a take
    -- leases nothing), from the states the batch found, each key seeing
    -- the earlier counting requests alone; each key keeps the state its
    -- last stored one left.
    local replay, last = {}, {}
    for i = 1, count do
      local r = reqs[i]
      local p = o + 2 + 5 * (i - 1)
      local call_now = now
      now = r[9] and r[9][1] or now
      if r[10] then
        local key, l, hits, peek, op = keys[k + i - 1], r[1], r[10][1], r[10][2], r[10][3]
        local s = replay[key] or r[3]
        local next, allowed, remaining, reset, retry, wait, taken, mark, valid, counted = apply(l, s, hits, op, nil, nil, nil, true)
        if allowed or counted then
          replay[key] = next
          if counted and not peek or stores(l, op, hits, taken, allowed, peek) then
            r[4], r[5], last[key] = next, reset, i
          end
        end
        if taken > 0 and allowed then
          -- A settle tells the reservation it released, in a refused batch
          -- too.
          local q = e + 4 * reply[e]
          reply[q + 1], reply[q + 2], reply[q + 3], reply[q + 4] = i - 1, taken, mark, valid
          reply[e] = reply[e] + 1
        end
        reply[p], reply[p + 1], reply[p + 2], reply[p + 3], reply[p + 4] = allowed and 1 or 0, remaining, reset, retry, wait
      else
        local _, _, remaining, reset = r[1].alg.step(r[3], now, r[1], 0)
        reply[p + 1], reply[p + 2], reply[p + 4] = remaining, reset, 0
      end
      now = call_now
    end
    for i = 1, count do
      local r = reqs[i]
      if last[keys[k + i - 1]] ~= i then
        -- not stored, or a later request of its key is
      elseif r[9] then
        plain_save(k + i - 1, r[4], r[3], r[9][2])
      else
        save(k + i - 1, r[1], r[4], r[5], r[3])
      end
    end
  end
end

-- redis_time returns the Redis clock in us (TIME).
local function redis_time()
  if redis.replicate_commands then
    redis.replicate_commands() -- writes after TIME, before Redis 5
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- count_and_limit splits a number argument "N" or "N NOT_AFTER" into N and
-- the not-after instant (nil for none).
local function count_and_limit(arg)
  local n, not_after = string.match(arg, '^(%d+) (%d+)$')
  if n == nil then
    return tonumber(arg), nil
  end
  return tonumber(n), tonumber(not_after)
end

local function decide(KEYS, ARGV)
  local not_after
  min_ttl, not_after = count_and_limit(ARGV[2])
  -- The Redis clock is read first, before any write: when it decides
  -- (ARGV[1] empty), and when the call or a batch has a not-after instant.
  -- Otherwise the script reads no clock at all (for services that forbid
  -- TIME in scripts).
  local timed = ARGV[1] == '' or not_after ~= nil
  if not timed and ARGV[3] == 'batches' then
    for j = 1, tonumber(ARGV[4]) do
      if string.find(ARGV[4 + j], ' ', 1, true) then
        timed = true
        break
      end
    end
  end
  local clock = timed and redis_time() or nil
  if ARGV[1] == '' then
    now = clock
  else
    now = tonumber(ARGV[1])
  end
  if not_after and clock > not_after then
    return redis.error_reply('ratelimitd: late: the call ran ' .. fmt(clock - not_after) ..
      ' us after its caller gave up; nothing was decided')
  end
  keys, stored_states = KEYS, {}
  -- One MGET reads every key (in chunks: unpack is limited to a few
  -- thousand values). A key that holds no string reads as false.
  local n = #KEYS
  if n <= 1000 then
    vals = n > 0 and redis.call('MGET', unpack(KEYS)) or {}
  else
    vals = {}
    for from = 1, n, 1000 do
      local got = redis.call('MGET', unpack(KEYS, from, min(from + 999, n)))
      for i = 1, #got do
        vals[from + i - 1] = got[i]
      end
    end
  end

  local reply = {}
  if ARGV[3] == 'batches' then
    local b = tonumber(ARGV[4])
    local k, a = 1, 5 + b
    for j = 1, b do
      local count, batch_not_after = count_and_limit(ARGV[4 + j])
      if batch_not_after and clock > batch_not_after then
        local m = #reply
        reply[m + 1] = -1 -- late: its caller gave up
        for i = 2, 2 + 5 * count do
          reply[m + i] = 0
        end
      else
        local err = decide_batch(ARGV, k, count, a, reply)
        if err then
          return redis.error_reply(err)
        end
      end
      k, a = k + count, a + 3 * count
    end
  else
    local err = decide_batch(ARGV, 1, n, 3, reply)
    if err then
      return redis.error_reply(err)
    end
  end
  keys, vals, stored_states = nil, nil, nil
  return reply
end
