package algo

// fixedWindow is the step of [FixedWindow]. now is in microseconds. A
// window admits hits while its count, the reservations made in it
// ([OpReserve]) and the hits fit N (see viewWindow for a clock that steps
// back).
func fixedWindow(s *State, now int64, l Limit, hits uint64, strict bool) Decision {
	v := viewWindow(s, now, l)
	if hits > v.remaining || strict && v.used > v.n {
		return v.refusal(now, hits)
	}
	d := Decision{Allowed: true, Remaining: v.remaining - hits, ResetAfter: v.reset(now)}
	if hits == 0 {
		return d
	}
	*s = State{Time: v.start, Count: int64(v.used + hits), Log: v.live}
	d.ResetAfter = windowReset(now, v.end, true, v.live)
	return d
}

// windowStart returns the start of the epoch-aligned window of w µs that
// holds now, or the later window s counts when that one began at most a
// window ahead (a clock stepped back).
func windowStart(s *State, now, w int64) int64 {
	start := now - floorMod(now, w)
	if s.Time > start && s.Time-start <= w {
		return s.Time
	}
	return start
}

// floorMod returns x mod m in [0, m) for m > 0, also for negative x.
func floorMod(x, m int64) int64 {
	r := x % m
	if r < 0 {
		r += m
	}
	return r
}
