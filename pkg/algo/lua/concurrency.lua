-- concurrency.lua: the twin of algo's concurrency.
-- State: a sorted set of the holders of slots, each member a holder (32
-- hexadecimal digits), scored by the instant its slot ends (us). The
-- holders whose slot ends after now hold one; the others have lost it.
-- The loaded state is {key, h, ended}: h the live holders as {member, end},
-- ordered by end then member (as ZRANGEBYSCORE orders them, and as algo
-- orders them), ended how many members in Redis have ended.
do
  local function find(h, m)
    for i = 1, #h do
      if h[i][1] == m then
        return i
      end
    end
    return nil
  end

  local function without(h, m)
    local out = {}
    for i = 1, #h do
      if h[i][1] ~= m then
        out[#out + 1] = h[i]
      end
    end
    return out
  end

  -- with returns h with member m ending at e, in order.
  local function with(h, m, e)
    local out, placed = {}, false
    for i = 1, #h do
      local x = h[i]
      if x[1] ~= m then
        if not placed and (x[2] > e or (x[2] == e and x[1] > m)) then
          out[#out + 1], placed = {m, e}, true
        end
        out[#out + 1] = x
      end
    end
    if not placed then
      out[#out + 1] = {m, e}
    end
    return out
  end

  -- figures returns the slots free and the time until the last ends.
  local function figures(h, now, n)
    local reset = 0
    if #h > 0 then
      reset = h[#h][2] - now
    end
    return max(n - #h, 0), reset
  end

  -- op decides hits (o nil: an acquire of hits slots that stores
  -- nothing), or for member acquires (o 'a'), releases ('r') or renews
  -- ('n') its slot. It returns what every algorithm's op does.
  local function op(s, now, l, hits, o, member)
    local n, ttl, h = l.n, l.w, s.h
    local i = member and find(h, member)
    if o == 'a' then
      if i == nil and #h + 1 > n then
        local remaining, reset = figures(h, now, n)
        local retry = NEVER
        if n > 0 then
          retry = h[#h - n + 1][2] - now
        end
        return s, false, remaining, reset, retry, 0, 0, 0, 0
      end
      h = with(h, member, now + ttl)
      local remaining, reset = figures(h, now, n)
      return {key = s.key, h = h, ended = 0}, true, remaining, reset, 0, 0, 1, s.ended, ttl
    elseif o == 'r' or o == 'n' then
      if i == nil then
        local remaining, reset = figures(h, now, n)
        return s, true, remaining, reset, 0, 0, 0, 0, 0
      end
      local valid = 0
      if o == 'r' then
        h = without(h, member)
      else
        h, valid = with(h, member, now + ttl), ttl
      end
      local remaining, reset = figures(h, now, n)
      return {key = s.key, h = h, ended = 0}, true, remaining, reset, 0, 0, 1, s.ended, valid
    end
    local remaining, reset = figures(h, now, n)
    local k = min(hits, n + 1)
    if #h + k <= n then
      return s, true, remaining - k, reset, 0, 0, 0, 0, 0
    elseif hits > n then
      return s, false, remaining, reset, NEVER, 0, 0, 0, 0
    end
    return s, false, remaining, reset, h[#h + k - n][2] - now, 0, 0, 0, 0
  end

  algorithms.concurrency = {
    slots = true,
    op = op,
    load = function(key, now, l)
      local raw = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(now), '+inf', 'WITHSCORES')
      local h = {}
      for i = 1, #raw, 2 do
        h[#h + 1] = {raw[i], tonumber(raw[i + 1])}
      end
      local ended = redis.call('ZCOUNT', key, '-inf', fmt(now))
      if #h == 0 and ended > 0 then
        -- Every slot ended: the key lives a lease TTL past the last end
        -- (store), which the script's own clock may have passed.
        local last = redis.call('ZREVRANGEBYSCORE', key, '+inf', '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
        if now >= tonumber(last[2]) + l.w then
          ended = 0
        end
      end
      return {key = key, h = h, ended = ended}
    end,
    step = function(s, now, l, hits)
      return op(s, now, l, hits)
    end,
    -- store drops the ended holders, writes what changed from prev, and
    -- keeps the key a lease TTL past its last slot's end (algo.Keep), for
    -- the next call to find holders that never released.
    store = function(key, s, now, l, ttl_ms, prev)
      redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
      local before, after = {}, {}
      for i = 1, #prev.h do
        before[prev.h[i][1]] = prev.h[i][2]
      end
      for i = 1, #s.h do
        local m, e = s.h[i][1], s.h[i][2]
        after[m] = true
        if before[m] ~= e then
          redis.call('ZADD', key, fmt(e), m)
        end
      end
      for m in pairs(before) do
        if not after[m] then
          redis.call('ZREM', key, m)
        end
      end
      redis.call('PEXPIRE', key, fmt(ttl_ms + ceil(l.w / 1000)))
    end,
  }
end
