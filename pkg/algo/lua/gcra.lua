-- gcra.lua: the twin of algo's gcraOp.
-- State (a string "t f", then the leases outstanding "end hits ..."): the
-- theoretical arrival time, t + f/N us. At every instant the TAT is at
-- least that instant plus the emission time of the leases outstanding then
-- (algo's gcraOp).
do
  local decode, store = bucket_state({'t', 'f'})

  -- later returns the later of two instants.
  local function later(aus, af, bus, bf)
    if cmp(aus, af, bus, bf) < 0 then
      return bus, bf
    end
    return aus, af
  end

  -- op is token_bucket.lua's op for GCRA. With o 'c' the TAT moves ahead
  -- by the emission time of hits that had no room, at most to B + N
  -- emission times ahead of now (algo's opCount).
  local function op(s, now, l, hits, o, most, share, ttl, mark, strict)
    if l.n == 0 then
      if o == 'g' or hits == 0 then return s, true, 0, 0, 0, 0, 0, 0, 0 end
      return s, false, 0, 0, NEVER, 0, 0, 0, 0
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
    local h = s.h
    local out = lease_hits(h)
    if h then
      local i = 1
      while i <= #h and h[i] <= now do
        local cu, cf = cost(r, min(out, b))
        tus, tf = later(tus, tf, add(r, h[i], 0, cu, cf))
        out = out - h[i + 1]
        i = i + 2
      end
    end
    do
      local cu, cf = cost(r, min(out, b))
      tus, tf = later(tus, tf, add(r, now, 0, cu, cf))
    end
    local live = live_leases(h, now)
    if o == 'c' then
      local cu, cf = cost(r, min(hits, b + l.n))
      local nus, nf = add(r, tus, tf, cu, cf)
      local mus, mf = cost(r, b + l.n)
      mus, mf = add(r, now, 0, mus, mf)
      if cmp(nus, nf, mus, mf) > 0 then
        nus, nf = mus, mf
      end
      return {t = nus, f = nf, h = live}
    end
    -- reset_of returns the time until the TAT is behind now for good.
    local function reset_of(tus, tf, live)
      if live then
        local out = lease_hits(live)
        for i = 1, #live, 2 do
          local cu, cf = cost(r, min(out, b))
          tus, tf = later(tus, tf, add(r, live[i], 0, cu, cf))
          out = out - live[i + 1]
        end
      end
      return max(ceil_us(sub(r, tus, tf, now, 0)), 0)
    end
    -- retry returns the time until hits fit.
    local function retry(hits)
      local t_us, t_f, s_us, s_f, out, i = tus, tf, now, 0, lease_hits(live), 1
      while out + hits > b do
        s_us, s_f = live[i], 0
        local cu, cf = cost(r, min(out, b))
        t_us, t_f = later(t_us, t_f, add(r, s_us, s_f, cu, cf))
        out = out - live[i + 1]
        i = i + 2
      end
      local cu, cf = cost(r, hits)
      local a_us, a_f = add(r, t_us, t_f, cu, cf)
      a_us, a_f = sub(r, a_us, a_f, lim_us, lim_f)
      a_us, a_f = later(s_us, s_f, a_us, a_f)
      return ceil_us(sub(r, a_us, a_f, now, 0))
    end
    local function remaining_of(tus, tf)
      local aus, af = sub(r, tus, tf, now, 0)
      return b - hits_in(r, aus, af, b)
    end
    local remaining, reset = remaining_of(tus, tf), reset_of(tus, tf, live)
    if o == 'g' then
      local n
      live, n = lease_without(live, mark, min(hits, b))
      local cu, cf = cost(r, n)
      tus, tf = sub(r, tus, tf, cu, cf)
      if cmp(tus, tf, now, 0) <= 0 and (live == nil or #live == 0) then
        return {t = 0, f = 0}, true, b, 0, 0, 0, 0, 0, 0
      end
      tus, tf = later(tus, tf, now, 0)
      return {t = tus, f = tf, h = live}, true, remaining_of(tus, tf), reset_of(tus, tf, live), 0, 0, 0, 0, 0
    end
    local over = false
    if strict then
      local aus, af = sub(r, tus, tf, now, 0)
      over = cmp(aus, af, lim_us, lim_f) > 0
    end
    if hits == 0 and o ~= 't' and not over then
      return s, true, remaining, reset, 0, 0, 0, 0, 0
    elseif hits > b then
      return s, false, remaining, reset, NEVER, 0, 0, 0, 0
    end
    local cu, cf = cost(r, hits)
    local nus, nf = add(r, tus, tf, cu, cf)
    local aus, af = sub(r, nus, nf, now, 0)
    if cmp(aus, af, lim_us, lim_f) > 0 then
      return s, false, remaining, reset, retry(hits), 0, 0, 0, 0
    end
    local taken = bucket_taken(o, hits, remaining, most, share)
    if taken == 0 then
      return s, true, remaining, reset, 0, 0, 0, 0, 0
    end
    cu, cf = cost(r, taken)
    nus, nf = add(r, tus, tf, cu, cf)
    local lmark, valid
    live, lmark, valid = bucket_hold(live, now, ttl, taken, hits)
    if o ~= 't' then
      taken = 0
    end
    return {t = nus, f = nf, h = live}, true, remaining_of(nus, nf), reset_of(nus, nf, live), 0, 0, taken, lmark, valid
  end

  algorithms.gcra = {decode = decode, store = store, op = op, step = function(s, now, l, hits, strict)
    return op(s, now, l, hits, nil, nil, nil, nil, nil, strict)
  end, count = function(s, now, l, hits)
    return op(s, now, l, hits, 'c')
  end}
end
