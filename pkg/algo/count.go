package algo

import (
	"math"
	"sort"
	"time"
)

// Counting hits beyond what remains: a request with [Request.Count] (a
// rule's over_limit_hits: count) that its limit refuses is counted all the
// same, and still refused. The hits were already spent (a cost reported
// after the response), so the limit must hold them against what follows.
//
// What each algorithm does with hits it has no room for:
//
//   - FixedWindow, BurstFill: the window's count grows past N; the window
//     refuses until it ends. The excess is forgotten with the window.
//   - SlidingWindowCounter: the current window's count grows past N, and
//     weighs on the next window as any count does.
//   - SlidingWindowLog: the hits are logged at now and the log keeps its
//     newest N+1 entries: N that refuse any hit until the oldest of them
//     expires, and one more that tells a log past its limit from a full
//     one. Older entries could change no decision, so the log stays
//     within N+1 entries.
//   - TokenBucket, GCRA: the bucket goes into debt, at most N hits (one
//     window's refill): it refuses until it has earned the debt back. In
//     GCRA, the TAT moves ahead by the hits' emission time, up to B + N
//     emission times ahead of now.
//   - LeakyBucket: the queue fills past B, by at most N hits, and drains
//     at r as ever.
//
// A limit of zero counts nothing: it refuses every hit forever anyway.
// Counts stay below 2^53 (maxCount), where the Lua twins are exact.
//
// A limit holding more than it admits is over: a request that counts and
// has zero hits (a check before a cost) is refused until it no longer is
// (stepWith), as envoyproxy/ratelimit refuses zero hits once its count is
// past the limit. Exactly full is not over.

// maxCount bounds the count of a window: counting more saturates.
const maxCount = 1<<53 - 1

// opCount is the internal op of the bucket steps (tokenBucketOp, gcraOp)
// that counts hits beyond what remains.
const opCount Op = math.MaxUint8

// Counting reports whether r counts its hits whatever the answer: a
// decision or a take with [Request.Count], and a settle. Count means
// nothing to a give, a reservation or a slot's op.
func (r *Request) Counting() bool {
	return r.Op == OpSettle || r.Count && (r.Op == OpDecide || r.Op == OpTake)
}

// Counted reports whether request r, refused with decision d, had its hits
// counted all the same: a request with [Request.Count] of hits, deciding
// or taking (not giving back, not a slot), under a limit that admits
// something. A backend stores the state [Apply] left for it, unless it is
// a peek ([Stores]).
func Counted(r *Request, d *Decision) bool {
	l := &r.Limit
	return r.Counting() && !d.Allowed && r.Hits > 0 && l.Algorithm != Concurrency && l.Requests > 0 && l.Check() == nil
}

// overcount is [Apply] for a request r with Count that its limit refused
// with decision d: it counts r's hits into *s and returns the refusal as
// the new state stands (remaining and reset after the count, and how long
// until the same hits fit). It returns d unchanged, *s too, for a request
// that is not [Counted].
func overcount(s *State, now time.Time, r *Request, d Decision) Decision {
	if !Counted(r, &d) {
		return d
	}
	l, hits, t := r.Limit, r.Hits, now.UnixMicro()
	switch l.Algorithm {
	case FixedWindow:
		fixedWindowCount(s, t, l, hits)
	case BurstFill:
		burstFillCount(s, t, l, hits)
	case SlidingWindowCounter:
		slidingWindowCounterCount(s, t, l, hits)
	case SlidingWindowLog:
		slidingWindowLogCount(s, t, l, hits)
	case TokenBucket:
		tokenBucketOp(s, t, l, hits, leaseOp{op: opCount})
	case GCRA:
		gcraOp(s, t, l, hits, leaseOp{op: opCount})
	case LeakyBucket:
		leakyBucketCount(s, t, l, hits)
	default:
		return d
	}
	// The count left no room for the hits: Step refuses them, leaving *s.
	return Step(s, now, l, hits)
}

// addCount returns count + hits, saturated at maxCount.
func addCount(count int64, hits uint64) int64 {
	return min(count+int64(min(hits, maxCount)), maxCount)
}

// fixedWindowCount counts hits into the window of now: the twin of
// fixed_window.lua's count.
func fixedWindowCount(s *State, now int64, l Limit, hits uint64) {
	start := windowStart(s, now, windowMicros(l))
	var used int64
	if s.Time == start && s.Count > 0 {
		used = s.Count
	}
	*s = State{Time: start, Count: addCount(used, hits), Log: reservations(s.Log).live(now)}
}

// burstFillCount counts hits into the window running at now, or into one
// starting now.
func burstFillCount(s *State, now int64, l Limit, hits uint64) {
	w := windowMicros(l)
	start, used := now, int64(0)
	if s.Count > 0 && now < s.Time+w && s.Time-now <= w {
		start, used = s.Time, s.Count
	}
	*s = State{Time: start, Count: addCount(used, hits)}
}

// slidingWindowCounterCount counts hits into the current window.
func slidingWindowCounterCount(s *State, now int64, l Limit, hits uint64) {
	start, prev, curr := counterWindow(s, now, windowMicros(l))
	*s = State{Time: start, Count: addCount(curr, hits), Prev: prev}
}

// slidingWindowLogCount logs hits at now among the live entries and keeps
// the newest N+1: a new log, leaving the one s held untouched.
func slidingWindowLogCount(s *State, now int64, l Limit, hits uint64) {
	w, n := windowMicros(l), int(l.Requests)
	log := s.Log
	lo := sort.Search(len(log), func(i int) bool { return log[i] > now-w })
	hi := sort.Search(len(log), func(i int) bool { return log[i] > now+w })
	live := log[lo:hi]
	at := sort.Search(len(live), func(i int) bool { return live[i] > now })
	k := int(min(hits, uint64(n)+1))
	next := make([]int64, 0, len(live)+k)
	next = append(next, live[:at]...)
	for range k {
		next = append(next, now)
	}
	next = append(next, live[at:]...)
	*s = State{Log: next[max(len(next)-n-1, 0):]}
}

// leakyBucketCount adds hits to the queue, past B by at most N.
func leakyBucketCount(s *State, now int64, l Limit, hits uint64) {
	r, b := newRate(l), int64(l.capacity())
	level, last := r.drain(s, inst{now, 0}, windowMicros(l))
	level = min(level+int64(min(hits, uint64(b+r.n))), b+r.n)
	*s = State{Time: last.us, Frac: last.f, Count: level}
}
