-- leaky_bucket.lua: the twin of algo's leakyBucket.
-- State (a string "t c f"): c is the queue level after the last leak, at
-- instant t + f/N us. The queue drains one hit every W/N us.
do
  local decode, store = string_state({'t', 'c', 'f'})

  -- drain returns the level of the queue s holds at now and the instant
  -- of its last leak (algo's rate.drain).
  local function drain(s, now, l)
    local r, level = l.rate, s.c
    local lus, lf = stored(r, s.t, s.f)
    if level <= 0 then
      return 0, now, 0
    elseif cmp(lus, lf, now, 0) > 0 then
      local aus, af = sub(r, lus, lf, now, 0)
      if cmp(aus, af, l.w, 0) > 0 then
        return 0, now, 0 -- more than a window ahead: void
      end
      return level, lus, lf
    end
    local eus, ef = sub(r, now, 0, lus, lf)
    local k = fit(r, eus, ef, level)
    level = level - k
    if level == 0 then
      return 0, now, 0
    end
    local cu, cf = cost(r, k)
    lus, lf = add(r, lus, lf, cu, cf)
    return level, lus, lf
  end

  algorithms.leaky_bucket = {decode = decode, store = store, step = function(s, now, l, hits, strict)
    if l.n == 0 then
      if hits == 0 then return s, true, 0, 0, 0, 0 end
      return s, false, 0, 0, NEVER, 0
    end
    local r, b = l.rate, l.b
    local level, lus, lf = drain(s, now, l)
    -- drained returns the time from now until a queue of k has drained.
    local function drained(k)
      local cu, cf = cost(r, k)
      local us, f = add(r, lus, lf, cu, cf)
      return ceil_us(sub(r, us, f, now, 0))
    end
    local remaining, reset = max(b - level, 0), 0
    if level > 0 then
      reset = drained(level)
    end
    if hits == 0 and not (strict and level > b) then
      return s, true, remaining, reset, 0, 0
    elseif hits > b then
      return s, false, remaining, reset, NEVER, 0
    elseif level + hits > b then
      return s, false, remaining, reset, drained(level + hits - b), 0
    end
    local wait = reset
    level = level + hits
    return {t = lus, c = level, f = lf}, true, b - level, drained(level), 0, wait
  end, count = function(s, now, l, hits)
    -- The queue fills past B by at most N (algo's leakyBucketCount).
    local level, lus, lf = drain(s, now, l)
    return {t = lus, c = min(level + min(hits, l.b + l.n), l.b + l.n), f = lf}
  end}
end
