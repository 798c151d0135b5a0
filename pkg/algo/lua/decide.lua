-- decide.lua: ratelimitd's decision script. It decides a batch of
-- requests atomically, with the algorithms defined above it.
--
-- KEYS[i]  the state key of request i (two requests may share a key: the
--          later one then sees the earlier one's hits).
-- ARGV[1]  now, in us since the Unix epoch; empty to read the Redis clock
--          (TIME), so that replicas with skewed clocks agree.
-- ARGV[2]  the least TTL of a stored key, in ms: 0 in production; tests
--          whose clock is not the Redis clock keep keys longer with it.
-- ARGV[3 + 7*(i-1) ...]  request i: algorithm name, N, W in us (>= 1),
--          B (the bucket capacity, N when the rule sets none), hits,
--          shadow ("1" or "0"), peek ("1" or "0": decided, never stored).
--
-- Returns {admitted, then for each request: allowed, remaining, reset_us,
-- retry_us, wait_us}, all integers: admitted and allowed are 1 or 0,
-- retry_us is -1 for never.
--
-- The batch is admitted when every request is allowed but shadow ones;
-- then every allowed request but peek ones is stored, with a TTL of its reset-after
-- rounded up to the millisecond. Otherwise nothing is stored and every
-- decision describes the state as it stands: allowed requests report it
-- without their hits, refused ones keep their retry-after.
local now
if ARGV[1] == '' then
  if redis.replicate_commands then
    redis.replicate_commands() -- writes after TIME, before Redis 5
  end
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local min_ttl = tonumber(ARGV[2])

-- decide_batch decides the batch of count requests whose first key is
-- KEYS[k] and whose first argument is ARGV[base], and appends its reply to
-- reply: admitted, then five integers per request. It returns an error
-- message, or nil.
local function decide_batch(k, count, base, reply)
  local reqs, loaded, current, final = {}, {}, {}, {}
  local out = {1}
  for i = 1, count do
    local key = KEYS[k + i - 1]
    local a = base + 7 * (i - 1)
    local alg = algorithms[ARGV[a]]
    if alg == nil then
      return 'ratelimitd: unknown algorithm ' .. tostring(ARGV[a])
    end
    local r = {
      key = key, alg = alg,
      l = {n = tonumber(ARGV[a + 1]), w = tonumber(ARGV[a + 2]), b = tonumber(ARGV[a + 3])},
      hits = tonumber(ARGV[a + 4]), shadow = ARGV[a + 5] == '1', peek = ARGV[a + 6] == '1',
    }
    reqs[i] = r
    if loaded[key] == nil then
      loaded[key] = alg.load(key, now, r.l)
      current[key] = loaded[key]
    end
    local next, allowed, remaining, reset, retry, wait = alg.step(current[key], now, r.l, r.hits)
    r.allowed, r.retry = allowed, retry
    if allowed then
      current[key] = next
      if r.hits > 0 and not r.peek then
        final[key] = {r = r, s = next, reset = reset}
      end
    elseif not r.shadow then
      out[1] = 0
    end
    local o = 2 + 5 * (i - 1)
    out[o], out[o + 1], out[o + 2], out[o + 3], out[o + 4] = allowed and 1 or 0, remaining, reset, retry, wait
  end

  if out[1] == 1 then
    for key, f in pairs(final) do
      if f.reset > 0 then
        f.r.alg.store(key, f.s, now, f.r.l, max(ceil(f.reset / 1000), min_ttl))
      else
        redis.call('DEL', key)
      end
    end
  else
    for i, r in ipairs(reqs) do
      local _, _, remaining, reset = r.alg.step(loaded[r.key], now, r.l, 0)
      local o = 2 + 5 * (i - 1)
      out[o], out[o + 1], out[o + 2], out[o + 3], out[o + 4] = r.allowed and 1 or 0, remaining, reset, r.retry, 0
    end
  end
  for _, v in ipairs(out) do
    reply[#reply + 1] = v
  end
end

-- ARGV[3] = 'batches' asks for several batches in one call, each decided
-- on its own, all or nothing, in order: ARGV[4] is their number B, ARGV[5]
-- to ARGV[4 + B] the number of requests of each, and their requests'
-- arguments follow, batch after batch, as KEYS do. The reply is each
-- batch's reply in turn.
local reply = {}
if ARGV[3] == 'batches' then
  local b = tonumber(ARGV[4])
  local k, a = 1, 5 + b
  for j = 1, b do
    local count = tonumber(ARGV[4 + j])
    local err = decide_batch(k, count, a, reply)
    if err then
      return redis.error_reply(err)
    end
    k, a = k + count, a + 7 * count
  end
else
  local err = decide_batch(1, #KEYS, 3, reply)
  if err then
    return redis.error_reply(err)
  end
end
return reply
