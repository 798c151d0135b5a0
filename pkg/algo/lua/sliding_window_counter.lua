-- sliding_window_counter.lua: the twin of algo's slidingWindowCounter.
-- State (a string "t c p"): t is the start of the current epoch-aligned
-- window, c its hits, p the previous window's hits.
do
  -- weighted is ceil(prev * (w - elapsed) / w), in float64, one operation
  -- at a time exactly as Go computes it.
  local function weighted(prev, elapsed, w)
    if prev == 0 then
      return 0
    end
    return ceil(prev * (w - elapsed) / w)
  end

  -- fit_weight returns the least e in [from, w] with weighted(prev, e, w) <= room.
  local function fit_weight(prev, room, from, w)
    if weighted(prev, from, w) <= room then
      return from
    end
    local e = ceil(w - room * w / prev)
    e = min(max(e, from + 1), w)
    while e > from + 1 and weighted(prev, e - 1, w) <= room do
      e = e - 1
    end
    while e < w and weighted(prev, e, w) > room do
      e = e + 1
    end
    return e
  end

  -- window returns the start of the window now counts in, the previous
  -- window's count and the current one's (algo's counterWindow).
  local function window(s, now, w)
    local start = now - floor_mod(now, w)
    if s.t > start and s.t - start <= w then
      start = s.t
    end
    if s.t == start then
      return start, s.p, s.c
    elseif s.t == start - w then
      return start, s.c, 0
    end
    return start, 0, 0
  end

  local decode, store = string_state({'t', 'c', 'p'}, same_window)
  algorithms.sliding_window_counter = {decode = decode, store = store, step = function(s, now, l, hits, strict)
    local w, n = l.w, l.n
    local start, prev, curr = window(s, now, w)
    local elapsed = max(now - start, 0)
    local used = weighted(prev, elapsed, w) + curr
    local remaining = n - min(used, n)
    local function reset(c)
      if c > 0 then
        return start + 2 * w - now
      elseif prev > 0 then
        return start + w - now
      end
      return 0
    end
    local over = strict and used > n
    if hits == 0 and not over then
      return s, true, remaining, reset(curr), 0, 0
    elseif hits > n then
      return s, false, remaining, reset(curr), NEVER, 0
    elseif hits > remaining or over then
      local room = n - curr - hits
      if room >= 0 then
        local e = fit_weight(prev, room, elapsed, w)
        if e < w then
          return s, false, remaining, reset(curr), start + e - now, 0
        end
      end
      return s, false, remaining, reset(curr), start + w + fit_weight(curr, n - hits, 0, w) - now, 0
    end
    curr = curr + hits
    return {t = start, c = curr, p = prev}, true, remaining - hits, reset(curr), 0, 0
  end}
  -- count counts hits into the current window (algo's
  -- slidingWindowCounterCount).
  algorithms.sliding_window_counter.count = function(s, now, l, hits)
    local start, prev, curr = window(s, now, l.w)
    return {t = start, c = add_count(curr, hits), p = prev}
  end
  -- give gives back hits taken in the window starting at mark (algo's
  -- give): they count in that window while it is current, then as the
  -- previous window's. It returns next, remaining, reset_us.
  algorithms.sliding_window_counter.windowed = true
  algorithms.sliding_window_counter.give = function(s, now, l, hits, mark)
    local next = {t = s.t, c = s.c, p = s.p}
    if s.t == mark and s.c > 0 then
      next.c = s.c - min(hits, s.c)
    elseif s.t == mark + l.w and s.p > 0 then
      next.p = s.p - min(hits, s.p)
    end
    if next.c == 0 and next.p == 0 then
      next = {t = 0, c = 0, p = 0}
    end
    local _, _, remaining, reset = algorithms.sliding_window_counter.step(next, now, l, 0)
    return next, remaining, reset
  end
end
