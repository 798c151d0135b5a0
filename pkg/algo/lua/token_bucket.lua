-- token_bucket.lua: the twin of algo's tokenBucketOp.
-- State (a string "t c f", then the leases outstanding "end hits ..."): c
-- is the whole tokens held after the last refill, at instant t + f/N us;
-- t = 0 (no key) is a full bucket. Until each lease ends, the bucket
-- refills only up to B less the hits of the leases outstanding (algo's
-- rate.refill).
do
  local decode, store = bucket_state({'t', 'c', 'f'})

  -- refill_to refills a bucket holding tokens at (lus, lf) up to the cap c
  -- until (tus, tf): it returns the tokens and the last refill instant.
  local function refill_to(r, tokens, lus, lf, c, tus, tf)
    if cmp(lus, lf, tus, tf) > 0 then
      return tokens, lus, lf
    elseif tokens >= c then
      return tokens, tus, tf
    end
    local eus, ef = sub(r, tus, tf, lus, lf)
    local k = fit(r, eus, ef, c - tokens)
    tokens = tokens + k
    if tokens == c then
      return tokens, tus, tf
    end
    local cu, cf = cost(r, k)
    lus, lf = add(r, lus, lf, cu, cf)
    return tokens, lus, lf
  end

  -- refill refills through the ends of the leases h until now.
  local function refill(r, tokens, lus, lf, b, h, now)
    local c = b - min(lease_hits(h), b)
    if h then
      local i = 1
      while i <= #h and h[i] <= now do
        tokens, lus, lf = refill_to(r, tokens, lus, lf, c, h[i], 0)
        c = min(c + h[i + 1], b)
        i = i + 2
      end
    end
    return refill_to(r, tokens, lus, lf, c, now, 0)
  end

  -- until_ returns the time from now until the bucket holds k tokens.
  local function until_(r, k, tokens, lus, lf, b, live, now)
    if tokens >= k then
      return 0
    end
    local c = b - min(lease_hits(live), b)
    if live then
      for i = 1, #live, 2 do
        if c >= k then
          local cu, cf = cost(r, k - tokens)
          local tus, tf = add(r, lus, lf, cu, cf)
          if cmp(tus, tf, live[i], 0) <= 0 then
            return ceil_us(sub(r, tus, tf, now, 0))
          end
        end
        tokens, lus, lf = refill_to(r, tokens, lus, lf, c, live[i], 0)
        c = min(c + live[i + 1], b)
      end
    end
    local cu, cf = cost(r, k - tokens)
    local tus, tf = add(r, lus, lf, cu, cf)
    return ceil_us(sub(r, tus, tf, now, 0))
  end

  -- op decides hits (o nil), takes a lease (o 't', with most, share and
  -- ttl) or gives hits back to the lease ending at mark (o 'g'). It
  -- returns next, allowed, remaining, reset_us, retry_us, wait_us, taken,
  -- mark, valid_us. With o 'c' it counts hits that had no room into a
  -- debt of at most N tokens, and returns the state alone (algo's
  -- opCount).
  local function op(s, now, l, hits, o, most, share, ttl, mark, strict)
    if l.n == 0 then
      if o == 'g' or hits == 0 then return s, true, 0, 0, 0, 0, 0, 0, 0 end
      return s, false, 0, 0, NEVER, 0, 0, 0, 0
    end
    local r, b = l.rate, l.b
    local live = live_leases(s.h, now)
    local tokens, lus, lf = b - min(lease_hits(s.h), b), now, 0
    if s.t ~= 0 then
      tokens = min(s.c, b - min(lease_hits(s.h), b))
      lus, lf = stored(r, s.t, s.f)
      if cmp(lus, lf, now, 0) > 0 then
        local aus, af = sub(r, lus, lf, now, 0)
        if cmp(aus, af, l.w, 0) > 0 then
          tokens, lus, lf = b - min(lease_hits(live), b), now, 0 -- more than a window ahead: void
        end
      else
        tokens, lus, lf = refill(r, tokens, lus, lf, b, s.h, now)
      end
    end
    if o == 'c' then
      tokens = max(tokens - min(hits, b + l.n), -l.n)
      return {t = lus, c = tokens, f = lf, h = live}
    end
    local function full(tokens, live)
      return until_(r, b, tokens, lus, lf, b, live, now)
    end
    local reset = 0
    if tokens < b then
      reset = full(tokens, live)
    end
    if o == 'g' then
      local n
      live, n = lease_without(live, mark, min(hits, b))
      tokens = tokens + n
      if tokens == b then
        return {t = 0, c = 0, f = 0}, true, b, 0, 0, 0, 0, 0, 0
      end
      return {t = lus, c = tokens, f = lf, h = live}, true, max(tokens, 0), full(tokens, live), 0, 0, 0, 0, 0
    end
    local remaining = max(tokens, 0) -- tokens < 0: a debt (o 'c')
    if hits == 0 and o ~= 't' and not (strict and tokens < 0) then
      return s, true, remaining, reset, 0, 0, 0, 0, 0
    elseif hits > b then
      return s, false, remaining, reset, NEVER, 0, 0, 0, 0
    elseif hits > tokens then
      return s, false, remaining, reset, until_(r, hits, tokens, lus, lf, b, live, now), 0, 0, 0, 0
    end
    local taken = bucket_taken(o, hits, tokens, most, share)
    if taken == 0 then
      return s, true, tokens, reset, 0, 0, 0, 0, 0
    end
    tokens = tokens - taken
    local lmark, valid
    live, lmark, valid = bucket_hold(live, now, ttl, taken, hits)
    if o ~= 't' then
      taken = 0
    end
    return {t = lus, c = tokens, f = lf, h = live}, true, tokens, full(tokens, live), 0, 0, taken, lmark, valid
  end

  algorithms.token_bucket = {decode = decode, store = store, op = op, step = function(s, now, l, hits, strict)
    return op(s, now, l, hits, nil, nil, nil, nil, nil, strict)
  end, count = function(s, now, l, hits)
    return op(s, now, l, hits, 'c')
  end}
end
