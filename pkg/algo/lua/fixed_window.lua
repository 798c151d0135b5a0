-- fixed_window.lua: the twin of algo's fixedWindow.
-- State (a string "t c"): t is the start of the counted window, c the hits
-- admitted in it. Windows are aligned to the Unix epoch.
do
  local decode, store = string_state({'t', 'c'}, same_window)
  algorithms.fixed_window = {decode = decode, store = store, step = function(s, now, l, hits)
    local w, n = l.w, l.n
    local start = now - floor_mod(now, w)
    if s.t > start and s.t - start <= w then
      start = s.t -- a clock stepped back: the stored window keeps counting
    end
    local stop = start + w
    local used = 0
    if s.t == start and s.c > 0 then
      used = s.c
    end
    local remaining = n - min(used, n)
    local reset = 0
    if used > 0 then
      reset = stop - now
    end
    if hits == 0 then
      return s, true, remaining, reset, 0, 0
    elseif hits > n then
      return s, false, remaining, reset, NEVER, 0
    elseif hits > remaining then
      return s, false, remaining, reset, stop - now, 0
    end
    return {t = start, c = used + hits}, true, remaining - hits, stop - now, 0, 0
  end}
end
