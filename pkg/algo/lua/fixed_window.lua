-- fixed_window.lua: the twin of algo's fixedWindow, reserve and settle.
-- State (a string "t c"): t is the start of the counted window, c the hits
-- admitted in it. Windows are aligned to the Unix epoch. A key that holds
-- reservations (algo.OpReserve) follows them with entries
-- "t c end1 count1 hits1 window1 made1 ...", ordered by end, then window
-- (algo's reservations): count reservations of hits in all, made in the
-- window starting at window, the first at made, that end at end unless
-- settled first.
do
  local plain_decode, plain_store = string_state({'t', 'c'}, same_window)
  local find, gmatch, format, concat = string.find, string.gmatch, string.format, table.concat
  local MAX_SLOTS = 32 -- algo's maxReservationSlots

  -- decode reads "t c", or "t c" and the entries of reservations into
  -- s.h.
  local function decode(v)
    local first = v and find(v, ' ', 1, true)
    if not first or not find(v, ' ', first + 1, true) then
      return plain_decode(v)
    end
    local s, h, i = {t = 0, c = 0}, {}, 1
    for x in gmatch(v, '%-?%d+') do
      if i == 1 then
        s.t = tonumber(x)
      elseif i == 2 then
        s.c = tonumber(x)
      else
        h[#h + 1] = tonumber(x)
      end
      i = i + 1
    end
    while #h % 5 ~= 0 do
      h[#h] = nil
    end
    if #h > 0 then
      s.h = h
    end
    return s
  end

  -- store saves s; one that holds reservations expires with its reset,
  -- which covers them.
  local function store(key, s, now, l, ttl_ms, prev)
    if not s.h or #s.h == 0 then
      return plain_store(key, s, now, l, ttl_ms, prev)
    end
    local parts = {format('%d %d', s.t, s.c)}
    for i = 1, #s.h do
      parts[#parts + 1] = fmt(s.h[i])
    end
    redis.call('SET', key, concat(parts, ' '), 'PX', fmt(ttl_ms))
  end

  -- Reservations (algo's reservations): like the Go twins, the functions
  -- below return new lists and never change the one they are given.

  -- rsv_live returns the reservations of h that end after now.
  local function rsv_live(h, now)
    return live_entries(h, now, 5)
  end

  -- rsv_held_in returns the hits of the reservations of h made in window.
  local function rsv_held_in(h, window)
    local n = 0
    if h then
      for i = 1, #h - 4, 5 do
        if h[i + 3] == window then
          n = n + h[i + 2]
        end
      end
    end
    return n
  end

  -- rsv_last_end returns the end of the last reservation of h, 0 for none.
  local function rsv_last_end(h)
    if h == nil or #h < 5 then
      return 0
    end
    return h[#h - 4]
  end

  -- rsv_mean_made returns when an entry's count reservations were made on
  -- average, its count-1 first made on average at was and one more at made
  -- (algo's meanMade).
  local function rsv_mean_made(was, made, count)
    return was + floor((made - was) / count)
  end

  -- rsv_with returns h with one more reservation of hits, made at made in
  -- window and ending at e.
  local function rsv_with(h, e, window, hits, made)
    h = h or {}
    for i = 1, #h - 4, 5 do
      if h[i] == e and h[i + 3] == window then
        local out = {}
        for j = 1, #h do
          out[j] = h[j]
        end
        out[i + 1], out[i + 2], out[i + 4] = h[i + 1] + 1, h[i + 2] + hits, rsv_mean_made(h[i + 4], made, h[i + 1] + 1)
        return out
      end
    end
    local count = 1
    if #h / 5 >= MAX_SLOTS then
      -- Join the latest entry of the window, which then ends at the later
      -- of the two ends.
      for i = #h - 4, 1, -5 do
        if h[i + 3] == window then
          e, count, hits, made = max(e, h[i]), h[i + 1] + 1, h[i + 2] + hits, rsv_mean_made(h[i + 4], made, h[i + 1] + 1)
          local rest = {}
          for j = 1, #h do
            if j < i or j > i + 4 then
              rest[#rest + 1] = h[j]
            end
          end
          h = rest
          break
        end
      end
    end
    local out, i = {}, 1
    while i + 4 <= #h and (h[i] < e or (h[i] == e and h[i + 3] < window)) do
      for j = i, i + 4 do
        out[#out + 1] = h[j]
      end
      i = i + 5
    end
    out[#out + 1], out[#out + 2], out[#out + 3], out[#out + 4], out[#out + 5] = e, count, hits, window, made
    for j = i, #h do
      out[#out + 1] = h[j]
    end
    return out
  end

  -- rsv_release returns h without its oldest reservation, the one made
  -- first (algo's reservations.release), and that reservation's hits, end,
  -- window and made; h and zeros when none.
  local function rsv_release(h)
    if h == nil or #h < 5 then
      return h, 0, 0, 0, 0
    end
    local o = 1
    for i = 6, #h - 4, 5 do
      if h[i + 4] < h[o + 4] then
        o = i
      end
    end
    local e, count, held, window, made = h[o], h[o + 1], h[o + 2], h[o + 3], h[o + 4]
    local out = {}
    if count <= 1 then
      for j = 1, #h do
        if j < o or j > o + 4 then
          out[#out + 1] = h[j]
        end
      end
      return out, held, e, window, made
    end
    local hits = floor(held / count)
    for j = 1, #h do
      out[j] = h[j]
    end
    out[o + 1], out[o + 2] = count - 1, held - hits
    return out, hits, e, window, made
  end

  -- rsv_end returns when a reservation made at now for ttl us ends (algo's
  -- reservationEnd).
  local function rsv_end(now, ttl)
    local g = max(floor(ttl / 16), 1000)
    local e = now + max(ttl, 1)
    return e + floor_mod(-e, g)
  end

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

  -- view returns what s holds at now (algo's viewWindow): the window's
  -- start and end, its count, the reservations made in it, what it admits
  -- more, and the reservations outstanding.
  local function view(s, now, l)
    local start, used = window(s, now, l.w)
    local live = rsv_live(s.h, now)
    local held = rsv_held_in(live, start)
    return start, start + l.w, used, held, l.n - min(used + held, l.n), live
  end

  -- reset_of is algo's windowReset.
  local function reset_of(now, stop, counts, live)
    local u = 0
    if counts then
      u = stop
    end
    u = max(u, rsv_last_end(live))
    if u <= now then
      return 0
    end
    return u - now
  end

  -- retry_of is the retry-after of hits refused (algo's refusal): when the
  -- window ends, or sooner when reservations made in it end first and
  -- leave room.
  local function retry_of(now, start, stop, used, held, n, live, hits)
    if hits > n then
      return NEVER
    elseif used + hits <= n and live then
      local room = n - used - hits
      local i = 1
      while i + 4 <= #live and live[i] < stop do
        if live[i + 3] == start then
          held = held - live[i + 2]
          if held <= room then
            return live[i] - now
          end
        end
        i = i + 5
      end
    end
    return stop - now
  end

  algorithms.fixed_window = {decode = decode, store = store, step = function(s, now, l, hits, strict)
    local n = l.n
    local start, stop, used, held, remaining, live = view(s, now, l)
    local reset = reset_of(now, stop, used > 0 or held > 0, live)
    if hits > remaining or (strict and used > n) then
      return s, false, remaining, reset, retry_of(now, start, stop, used, held, n, live, hits), 0
    elseif hits == 0 then
      return s, true, remaining, reset, 0, 0
    end
    return {t = start, c = used + hits, h = live}, true, remaining - hits, reset_of(now, stop, true, live), 0, 0
  end}
  -- reserve holds a reservation of hits for ttl us (algo's reserve): it
  -- returns next, allowed, remaining, reset_us, retry_us, wait_us, taken,
  -- mark, valid_us.
  algorithms.fixed_window.reserve = function(s, now, l, hits, ttl)
    local n = l.n
    local start, stop, used, held, remaining, live = view(s, now, l)
    if hits > remaining then
      local reset = reset_of(now, stop, used > 0 or held > 0, live)
      return s, false, remaining, reset, retry_of(now, start, stop, used, held, n, live, hits), 0, 0, 0, 0
    end
    local e = rsv_end(now, ttl)
    local h = rsv_with(live, e, start, min(hits, MAX_COUNT), now)
    return {t = start, c = used, h = h}, true, remaining - hits, reset_of(now, stop, true, h), 0, 0, hits, e, e - now
  end
  -- settle charges hits and releases the oldest reservation (algo's
  -- settle); it returns as reserve does, taken, mark and valid_us
  -- describing the reservation released: its hits, its end, how long it
  -- was held.
  algorithms.fixed_window.settle = function(s, now, l, hits)
    local start, _, used, _, _, live = view(s, now, l)
    local h, released, e, win, made = rsv_release(live)
    local c = used
    if e == 0 or win == start then
      c = add_count(c, hits)
    end
    local next = {t = 0, c = 0}
    if c ~= 0 or (h and #h > 0) then
      next = {t = start, c = c, h = h}
    end
    local _, _, remaining, reset = algorithms.fixed_window.step(next, now, l, 0)
    if e == 0 then
      return next, true, remaining, reset, 0, 0, 0, 0, 0
    end
    return next, true, remaining, reset, 0, 0, released, e, max(now - made, 0)
  end
  -- count counts hits into the window of now (algo's fixedWindowCount).
  algorithms.fixed_window.count = function(s, now, l, hits)
    local start, used = window(s, now, l.w)
    return {t = start, c = add_count(used, hits), h = rsv_live(s.h, now)}
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
