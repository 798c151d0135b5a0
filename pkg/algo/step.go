package algo

import (
	"math/bits"
	"time"
)

// Step applies hits to the state *s at time now under limit l and returns
// the decision. When the decision is allowed and hits is not zero, *s
// becomes the new state; otherwise *s is left as it was, so a backend that
// refuses a batch keeps every state it had. Step reads no clock and touches
// no storage. Hits of zero are always allowed and report the state as it
// stands. A limit that fails [Limit.Check] refuses every request.
//
// now must be after the Unix epoch: a zero State means "never seen".
func Step(s *State, now time.Time, l Limit, hits uint64) Decision {
	return stepWith(s, now, l, hits, false)
}

// stepWith is [Step]. With strict, zero hits are refused while the limit is
// over, holding more than it admits (hits counted beyond what remains,
// see [Counted]), until it no longer is: the zero hits of a request that
// counts ([Request.Count]), a check before a cost, which
// envoyproxy/ratelimit refuses once its count is past the limit.
func stepWith(s *State, now time.Time, l Limit, hits uint64, strict bool) Decision {
	if l.Check() != nil {
		return Decision{RetryAfter: Never}
	}
	t := now.UnixMicro()
	switch l.Algorithm {
	case FixedWindow:
		return fixedWindow(s, t, l, hits, strict)
	case SlidingWindowLog:
		return slidingWindowLog(s, t, l, hits, strict)
	case SlidingWindowCounter:
		return slidingWindowCounter(s, t, l, hits, strict)
	case TokenBucket:
		return tokenBucketOp(s, t, l, hits, leaseOp{strict: strict})
	case LeakyBucket:
		return leakyBucket(s, t, l, hits, strict)
	case GCRA:
		return gcraOp(s, t, l, hits, leaseOp{strict: strict})
	case BurstFill:
		return burstFill(s, t, l, hits, strict)
	case Concurrency:
		return concurrency(s, t, &Request{Limit: l, Hits: hits})
	default:
		// Unreachable for limits built from validated rules; refusing is
		// the safe answer for a limit nobody can evaluate.
		return Decision{RetryAfter: Never}
	}
}

// refuseAll is the decision of a limit that admits nothing (N = 0): hits of
// zero are allowed, any other hits never will be.
func refuseAll(hits uint64) Decision {
	if hits == 0 {
		return Decision{Allowed: true}
	}
	return Decision{RetryAfter: Never}
}

// The bucket algorithms keep instants exactly, as whole microseconds plus a
// fraction in units of 1/N µs: the emission interval T = W/N µs is rarely a
// whole number of microseconds, and rounding it would make the rate drift
// by up to 1 µs per hit. With N and B at most MaxBucket (2^26), every
// product below stays under 2^53, so the Lua twins (float64 numbers)
// compute the same integers.

// rate is a limit's emission interval T = W/N µs, as W = wq·N + wr.
type rate struct{ n, wq, wr int64 }

func newRate(l Limit) rate {
	n, w := int64(l.Requests), windowMicros(l)
	return rate{n: n, wq: w / n, wr: w % n}
}

// inst is an instant (µs since the epoch) or a duration: us + f/N µs,
// with 0 ≤ f < N.
type inst struct{ us, f int64 }

// stored returns the instant a state stores as us + f/N µs. A fraction
// stored under a larger N (the rule changed) is cut to the largest of this
// one, less than 1 µs off.
func (r rate) stored(us, f int64) inst {
	return inst{us, min(max(f, 0), r.n-1)}
}

// cost returns the emission time of k hits, k·T.
func (r rate) cost(k int64) inst {
	x := k * r.wr
	return inst{k*r.wq + x/r.n, x % r.n}
}

func (r rate) add(a, b inst) inst {
	s := inst{a.us + b.us, a.f + b.f}
	if s.f >= r.n {
		s.us++
		s.f -= r.n
	}
	return s
}

func (r rate) sub(a, b inst) inst {
	s := inst{a.us - b.us, a.f - b.f}
	if s.f < 0 {
		s.us--
		s.f += r.n
	}
	return s
}

// cmp compares a and b: -1, 0 or +1.
func (a inst) cmp(b inst) int {
	switch {
	case a.us < b.us || a.us == b.us && a.f < b.f:
		return -1
	case a.us == b.us && a.f == b.f:
		return 0
	}
	return 1
}

// ceil rounds a up to whole microseconds.
func (a inst) ceil() int64 {
	if a.f > 0 {
		return a.us + 1
	}
	return a.us
}

// fit returns the largest k in [0, most] with cost(k) ≤ e, for e ≥ 0: the
// hits whose emission fits in e.
func (r rate) fit(e inst, most int64) int64 {
	// k = floor((e.us·N + e.f) / W), in 128 bits.
	hi, lo := bits.Mul64(uint64(e.us), uint64(r.n))
	lo, carry := bits.Add64(lo, uint64(e.f), 0)
	hi += carry
	w := uint64(r.wq*r.n + r.wr)
	if hi >= w {
		return most
	}
	k, _ := bits.Div64(hi, lo, w)
	return int64(min(k, uint64(most)))
}

// hitsIn returns the least k in [0, most] with cost(k) ≥ d, for d ≥ 0: the
// hits whose emission covers d.
func (r rate) hitsIn(d inst, most int64) int64 {
	k := r.fit(d, most)
	if k < most && r.cost(k).cmp(d) < 0 {
		k++
	}
	return k
}
