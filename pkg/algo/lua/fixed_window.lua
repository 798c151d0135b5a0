-- fixed_window.lua: the twin of algo's fixedWindow.
-- State (a string "t c"): t is the start of the counted window, c the hits
-- admitted in it. Windows are aligned to the Unix epoch.
do
  local decode, store = string_state({'t', 'c'}, same_window)

  -- window returns the start of the window now counts in and its count
  -- (algo's windowStart).
  local function window(s, now, w)
    local start = now - floor_mod(now, w)
    if s.t > start and s.t - start <= w then
      start = s.t -- a clock stepped back: the stored window keeps counting
    end
    if s.t == start and s.c > 0 then
      return start, s.c
    end
    return start, 0
  end

  algorithms.fixed_window = {decode = decode, store = store, step = function(s, now, l, hits, strict)
    local w, n = l.w, l.n
    local start, used = window(s, now, w)
    local stop = start + w
    local remaining = n - min(used, n)
    local reset = 0
    if used > 0 then
      reset = stop - now
    end
    local over = strict and used > n
    if hits == 0 and not over then
      return s, true, remaining, reset, 0, 0
    elseif hits > n then
      return s, false, remaining, reset, NEVER, 0
    elseif hits > remaining or over then
      return s, false, remaining, reset, stop - now, 0
    end
    return {t = start, c = used + hits}, true, remaining - hits, stop - now, 0, 0
  end}
  -- count counts hits into the window of now (algo's fixedWindowCount).
  algorithms.fixed_window.count = function(s, now, l, hits)
    local start, used = window(s, now, l.w)
    return {t = start, c = add_count(used, hits)}
  end
  -- give gives back hits taken in the window starting at mark (algo's
  -- give): it returns next, remaining, reset_us.
  algorithms.fixed_window.windowed = true
  algorithms.fixed_window.give = function(s, now, l, hits, mark)
    local next = s
    if s.t == mark and s.c > 0 then
      next = {t = s.t, c = s.c - min(hits, s.c)}
      if next.c == 0 then
        next = {t = 0, c = 0}
      end
    end
    local _, _, remaining, reset = algorithms.fixed_window.step(next, now, l, 0)
    return next, remaining, reset
  end
end
