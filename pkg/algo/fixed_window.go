package algo

import "math"

// fixedWindow is the step of [FixedWindow]. now is in microseconds.
//
// A clock that steps back finds a stored window later than its own. Up to
// one window ahead, the stored window keeps counting until it ends, at most
// two windows away: a small step back neither reopens a spent budget nor
// holds it shut for long. A stored window further ahead is void, as if the
// window had passed; freezing a key for as long as the clock stepped back
// would be worse.
func fixedWindow(s *State, now int64, l Limit, hits uint64, strict bool) Decision {
	w := windowMicros(l)
	start := windowStart(s, now, w)
	end := start + w

	var used uint64
	if s.Time == start && s.Count > 0 {
		used = uint64(s.Count)
	}
	n := min(l.Requests, math.MaxInt64) // Count is an int64
	var remaining uint64
	if used < n {
		remaining = n - used
	}

	if hits <= remaining && !(strict && used > n) {
		used += hits
		d := Decision{Allowed: true, Remaining: remaining - hits}
		if used > 0 {
			d.ResetAfter = micros(end - now)
		}
		if hits == 0 {
			return d
		}
		*s = State{Time: start, Count: int64(used)}
		return d
	}

	d := Decision{Remaining: remaining, RetryAfter: micros(end - now)}
	if used > 0 {
		d.ResetAfter = micros(end - now)
	}
	if hits > n {
		d.RetryAfter = Never
	}
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
