-- burst_fill.lua: the twin of algo's burstFill.
-- State (a string "t c"): t is the start of the current window, which began
-- with the first hit admitted after the previous window ended; c the hits
-- admitted in it.
do
  local decode, store = string_state({'t', 'c'}, same_window)
  algorithms.burst_fill = {decode = decode, store = store, step = function(s, now, l, hits, strict)
    local w, n = l.w, l.n
    local start, used = now, 0
    if s.c > 0 and now < s.t + w and s.t - now <= w then
      start, used = s.t, s.c
    end
    local remaining = n - min(used, n)
    local reset = 0
    if used > 0 then
      reset = start + w - now
    end
    local over = strict and used > n
    if hits == 0 and not over then
      return s, true, remaining, reset, 0, 0
    elseif hits > n then
      return s, false, remaining, reset, NEVER, 0
    elseif hits > remaining or over then
      return s, false, remaining, reset, start + w - now, 0
    end
    return {t = start, c = used + hits}, true, remaining - hits, start + w - now, 0, 0
  end}
  -- count counts hits into the window running at now, or into one
  -- starting now (algo's burstFillCount).
  algorithms.burst_fill.count = function(s, now, l, hits)
    local start, used = now, 0
    if s.c > 0 and now < s.t + l.w and s.t - now <= l.w then
      start, used = s.t, s.c
    end
    return {t = start, c = add_count(used, hits)}
  end
end
