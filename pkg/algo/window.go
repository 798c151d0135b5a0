package algo

import (
	"math"
	"sort"
)

// burstFill is the step of [BurstFill]. now is in microseconds.
//
// The window runs from the first hit admitted after the previous window
// ended, s.Time, for W. Two requests at the same instant share one window
// (seed 001's script refilled when the elapsed time was zero). A clock that
// steps back keeps counting a window that started up to W in its future;
// a window further ahead is void.
func burstFill(s *State, now int64, l Limit, hits uint64, strict bool) Decision {
	w := windowMicros(l)
	n := min(l.Requests, math.MaxInt64)
	start, used := now, uint64(0)
	if s.Count > 0 && now < s.Time+w && s.Time-now <= w {
		start, used = s.Time, uint64(s.Count)
	}
	remaining := n - min(used, n)
	d := Decision{Remaining: remaining}
	if used > 0 {
		d.ResetAfter = micros(start + w - now)
	}
	over := strict && used > n
	switch {
	case hits == 0 && !over:
		d.Allowed = true
		return d
	case hits > n:
		d.RetryAfter = Never
		return d
	case hits > remaining || over:
		d.RetryAfter = micros(start + w - now)
		return d
	}
	*s = State{Time: start, Count: int64(used + hits)}
	return Decision{Allowed: true, Remaining: remaining - hits, ResetAfter: micros(start + w - now)}
}

// slidingWindowLog is the step of [SlidingWindowLog]. now is in
// microseconds.
//
// Entries at or before now−W have expired. A clock that steps back finds
// entries in its future: those up to W ahead still count, until they
// expire W after their instant; entries further ahead are void.
func slidingWindowLog(s *State, now int64, l Limit, hits uint64, strict bool) Decision {
	w := windowMicros(l)
	n := l.Requests
	log := s.Log
	lo := sort.Search(len(log), func(i int) bool { return log[i] > now-w })
	hi := sort.Search(len(log), func(i int) bool { return log[i] > now+w })
	live := log[lo:hi]
	count := uint64(len(live))
	remaining := n - min(count, n)
	d := Decision{Remaining: remaining}
	if len(live) > 0 {
		d.ResetAfter = micros(live[len(live)-1] + w - now)
	}
	over := strict && count > n
	switch {
	case hits == 0 && !over:
		d.Allowed = true
		return d
	case hits > n:
		d.RetryAfter = Never
		return d
	case hits > remaining || over:
		// The same hits fit once the oldest count+hits−n entries expired.
		d.RetryAfter = micros(live[count+hits-n-1] + w - now)
		return d
	}

	var next []int64
	if hi == len(log) && (len(live) == 0 || live[len(live)-1] <= now) {
		// Appending writes past the end of s.Log, which s cannot see.
		next = live
		for range hits {
			next = append(next, now)
		}
	} else {
		// Entries in the future (the clock stepped back), or void ones
		// after them: insert in order into a copy, leaving s untouched.
		at := sort.Search(len(live), func(i int) bool { return live[i] > now })
		next = make([]int64, 0, len(live)+int(hits))
		next = append(next, live[:at]...)
		for range hits {
			next = append(next, now)
		}
		next = append(next, live[at:]...)
	}
	*s = State{Log: next}
	return Decision{Allowed: true, Remaining: remaining - hits, ResetAfter: micros(next[len(next)-1] + w - now)}
}

// slidingWindowCounter is the step of [SlidingWindowCounter]. now is in
// microseconds.
//
// The weight of the previous window is computed in float64, one operation
// at a time, exactly as the Lua twin computes it: IEEE 754 rounds each
// operation the same way in both. A clock that steps back behaves as for
// [FixedWindow]: a stored window up to one window ahead keeps counting.
func slidingWindowCounter(s *State, now int64, l Limit, hits uint64, strict bool) Decision {
	w := windowMicros(l)
	n := min(l.Requests, math.MaxInt64)
	start, prev, curr := counterWindow(s, now, w)
	elapsed := max(now-start, 0)
	used := uint64(weighted(prev, elapsed, w) + curr)
	remaining := n - min(used, n)

	reset := func(curr int64) int64 {
		switch {
		case curr > 0:
			return start + 2*w - now
		case prev > 0:
			return start + w - now
		}
		return 0
	}
	d := Decision{Remaining: remaining, ResetAfter: micros(reset(curr))}
	over := strict && used > n
	switch {
	case hits == 0 && !over:
		d.Allowed = true
		return d
	case hits > n:
		d.RetryAfter = Never
		return d
	case hits > remaining || over:
		// In this window, once the previous window's weight has fallen
		// enough; else in the next, where this window's count weighs.
		if room := int64(n) - curr - int64(hits); room >= 0 {
			if e := fitWeight(prev, room, elapsed, w); e < w {
				d.RetryAfter = micros(start + e - now)
				return d
			}
		}
		d.RetryAfter = micros(start + w + fitWeight(curr, int64(n-hits), 0, w) - now)
		return d
	}
	curr += int64(hits)
	*s = State{Time: start, Count: curr, Prev: prev}
	return Decision{Allowed: true, Remaining: remaining - hits, ResetAfter: micros(reset(curr))}
}

// counterWindow returns the start of the window of w µs a sliding window
// counter counts now in (see windowStart), the previous window's count
// and the current one's.
func counterWindow(s *State, now, w int64) (start, prev, curr int64) {
	start = windowStart(s, now, w)
	switch s.Time {
	case start:
		return start, s.Prev, s.Count
	case start - w:
		return start, s.Count, 0
	}
	return start, 0, 0
}

// weighted returns ceil(prev × (w−elapsed) / w), the previous window's
// count weighted by the part of it the sliding window still covers. Rounding
// up admits no more than the sliding window would if the previous window's
// hits had been spread evenly.
func weighted(prev, elapsed, w int64) int64 {
	if prev == 0 {
		return 0
	}
	return int64(math.Ceil(float64(prev) * float64(w-elapsed) / float64(w)))
}

// fitWeight returns the least elapsed time e in [from, w] at which
// weighted(prev, e, w) ≤ room, for room ≥ 0. weighted falls as e grows and
// is 0 at w.
func fitWeight(prev, room, from, w int64) int64 {
	if weighted(prev, from, w) <= room {
		return from
	}
	// weighted ≤ room once prev×(w−e)/w ≤ room: e ≥ w − room×w/prev. The
	// estimate is exact but for rounding, which the loops below correct.
	e := int64(math.Ceil(float64(w) - float64(room)*float64(w)/float64(prev)))
	e = min(max(e, from+1), w)
	for e > from+1 && weighted(prev, e-1, w) <= room {
		e--
	}
	for e < w && weighted(prev, e, w) > room {
		e++
	}
	return e
}
