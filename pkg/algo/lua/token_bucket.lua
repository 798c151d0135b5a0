-- token_bucket.lua: the twin of algo's tokenBucket.
-- State (a string "t c f"): c is the whole tokens held after the last
-- refill, at instant t + f/N us; t = 0 (no key) is a full bucket.
do
  local decode, store = string_state({'t', 'c', 'f'})
  algorithms.token_bucket = {decode = decode, store = store, step = function(s, now, l, hits)
    if l.n == 0 then
      if hits == 0 then return s, true, 0, 0, 0, 0 end
      return s, false, 0, 0, NEVER, 0
    end
    local r, b = l.rate, l.b
    local tokens, lus, lf = b, now, 0
    if s.t ~= 0 then
      tokens = min(s.c, b)
      lus, lf = stored(r, s.t, s.f)
      if cmp(lus, lf, now, 0) > 0 then
        local aus, af = sub(r, lus, lf, now, 0)
        if cmp(aus, af, l.w, 0) > 0 then
          tokens, lus, lf = b, now, 0 -- more than a window ahead: void
        end
      elseif tokens < b then
        local eus, ef = sub(r, now, 0, lus, lf)
        local k = fit(r, eus, ef, b - tokens)
        tokens = tokens + k
        if tokens == b then
          lus, lf = now, 0
        else
          local cu, cf = cost(r, k)
          lus, lf = add(r, lus, lf, cu, cf)
        end
      else
        lus, lf = now, 0
      end
    end
    -- until returns the time from now until k more tokens are earned.
    local function until_(k)
      local cu, cf = cost(r, k)
      local us, f = add(r, lus, lf, cu, cf)
      return ceil_us(sub(r, us, f, now, 0))
    end
    local reset = 0
    if tokens < b then
      reset = until_(b - tokens)
    end
    if hits == 0 then
      return s, true, tokens, reset, 0, 0
    elseif hits > b then
      return s, false, tokens, reset, NEVER, 0
    elseif hits > tokens then
      return s, false, tokens, reset, until_(hits - tokens), 0
    end
    tokens = tokens - hits
    return {t = lus, c = tokens, f = lf}, true, tokens, until_(b - tokens), 0, 0
  end}
end
