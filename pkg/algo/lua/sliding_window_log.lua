-- sliding_window_log.lua: the twin of algo's slidingWindowLog.
-- State: a sorted set of the admitted hits, one member per hit, scored by
-- its instant in us. Members are "<instant>:<i>", i counting the hits
-- logged at that instant, so they are unique. Live entries are those in
-- (now-W, now+W]: older ones have expired, and ones more than W ahead (a
-- clock stepped back) are void. Like the Go step, a decision reads only
-- live entries and removes the others only when it stores.
--
-- The loaded state is {key, card, pending}: card live entries in Redis,
-- pending hits admitted at now by earlier requests of this batch, not yet
-- stored. A state with hits counted beyond N (count) is marked trim: store
-- keeps the newest N+1 entries, as algo's slidingWindowLogCount does; the
-- entries it drops would change no decision.
do
  -- live_from returns the ZRANGEBYSCORE bounds of the live entries.
  local function live_from(now, w)
    return '(' .. fmt(now - w), fmt(now + w)
  end

  -- score_at returns the instant of the live entry of rank i (0 = oldest).
  local function score_at(s, now, w, i)
    local lo, hi = live_from(now, w)
    return tonumber(redis.call('ZRANGEBYSCORE', s.key, lo, hi, 'WITHSCORES', 'LIMIT', i, 1)[2])
  end

  -- kth returns the instant of the k-th oldest live entry, pending ones
  -- (at now) included.
  local function kth(s, now, w, k)
    local lo = live_from(now, w)
    local at_or_before = redis.call('ZCOUNT', s.key, lo, fmt(now))
    if k <= at_or_before then
      return score_at(s, now, w, k - 1)
    elseif k <= at_or_before + s.pending then
      return now
    end
    return score_at(s, now, w, k - s.pending - 1)
  end

  -- newest returns the instant of the newest live entry, or nil.
  local function newest(s, now, w)
    local top
    if s.card > 0 then
      local lo, hi = live_from(now, w)
      top = tonumber(redis.call('ZREVRANGEBYSCORE', s.key, hi, lo, 'WITHSCORES', 'LIMIT', 0, 1)[2])
    end
    if s.pending > 0 and (top == nil or now > top) then
      top = now
    end
    return top
  end

  algorithms.sliding_window_log = {
    load = function(key, now, l)
      local lo, hi = live_from(now, l.w)
      return {key = key, card = redis.call('ZCOUNT', key, lo, hi), pending = 0}
    end,

    step = function(s, now, l, hits, strict)
      local w, n = l.w, l.n
      local count = s.card + s.pending
      local remaining = n - min(count, n)
      local top = newest(s, now, w)
      local reset = 0
      if top then
        reset = top + w - now
      end
      local over = strict and count > n
      if hits == 0 and not over then
        return s, true, remaining, reset, 0, 0
      elseif hits > n then
        return s, false, remaining, reset, NEVER, 0
      elseif hits > remaining or over then
        -- The same hits fit once the oldest count+hits-n entries expired.
        return s, false, remaining, reset, kth(s, now, w, count + hits - n) + w - now, 0
      end
      if top == nil or now > top then
        top = now
      end
      return {key = s.key, card = s.card, pending = s.pending + hits, trim = s.trim}, true, remaining - hits, top + w - now, 0, 0
    end,

    count = function(s, now, l, hits)
      return {key = s.key, card = s.card, pending = s.pending + min(hits, l.n + 1), trim = true}
    end,

    store = function(key, s, now, l, ttl_ms)
      redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - l.w))
      redis.call('ZREMRANGEBYSCORE', key, '(' .. fmt(now + l.w), '+inf')
      local at = fmt(now)
      local logged = redis.call('ZCOUNT', key, at, at)
      -- In chunks: unpack is limited to a few thousand values.
      for from = 1, s.pending, 1000 do
        local args = {}
        for i = from, min(from + 999, s.pending) do
          args[#args + 1] = at
          args[#args + 1] = at .. ':' .. fmt(logged + i)
        end
        redis.call('ZADD', key, unpack(args))
      end
      if s.trim then
        -- The oldest entries beyond the newest N+1 (ZREM of named members:
        -- the documented ACL has no ZREMRANGEBYRANK). Ties order by
        -- member, as a rank would.
        local excess = redis.call('ZCOUNT', key, '-inf', '+inf') - l.n - 1
        while excess > 0 do
          local old = redis.call('ZRANGEBYSCORE', key, '-inf', '+inf', 'LIMIT', 0, min(excess, 1000))
          redis.call('ZREM', key, unpack(old))
          excess = excess - #old
        end
      end
      redis.call('PEXPIRE', key, fmt(ttl_ms))
    end,
  }
end
