-- gcra.lua: the twin of algo's gcra.
-- State (a string "t f"): the theoretical arrival time, t + f/N us.
do
  local decode, store = string_state({'t', 'f'})
  algorithms.gcra = {decode = decode, store = store, step = function(s, now, l, hits)
    if l.n == 0 then
      if hits == 0 then return s, true, 0, 0, 0, 0 end
      return s, false, 0, 0, NEVER, 0
    end
    local r, b = l.rate, l.b
    local lim_us, lim_f = cost(r, b) -- the furthest the TAT may be ahead
    local tus, tf = stored(r, s.t, s.f)
    if cmp(tus, tf, now, 0) < 0 then
      tus, tf = now, 0
    else
      local aus, af = sub(r, tus, tf, now, 0)
      if cmp(aus, af, lim_us + l.w, lim_f) > 0 then
        tus, tf = now, 0 -- further ahead than a burst and a window: void
      end
    end
    local aus, af = sub(r, tus, tf, now, 0)
    local remaining, reset = b - hits_in(r, aus, af, b), ceil_us(aus, af)
    if hits == 0 then
      return s, true, remaining, reset, 0, 0
    elseif hits > b then
      return s, false, remaining, reset, NEVER, 0
    end
    local cu, cf = cost(r, hits)
    local nus, nf = add(r, tus, tf, cu, cf)
    aus, af = sub(r, nus, nf, now, 0)
    if cmp(aus, af, lim_us, lim_f) > 0 then
      return s, false, remaining, reset, ceil_us(sub(r, aus, af, lim_us, lim_f)), 0
    end
    return {t = nus, f = nf}, true, b - hits_in(r, aus, af, b), ceil_us(aus, af), 0, 0
  end}
end
