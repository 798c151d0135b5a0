package algo

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestCountGuarantees checks what docs/algorithms.md promises of requests
// that count their hits whatever the answer, on random sequences in which
// every request counts: a refusal counts its hits and then reports nothing
// remaining; its RetryAfter is exact for the same hits from the state it
// left; a check of zero hits is refused exactly while the limit is past
// what it admits, and for at most the algorithm's bound (W, or 2W for the
// sliding window counter, whose count weighs on the next window); a
// window counts every hit it was sent.
func TestCountGuarantees(t *testing.T) {
	for _, a := range Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(a), 27))
			for run := range 100 {
				l := randomLimit(rng, a)
				if err := countRun(rng, l, 300); err != nil {
					t.Fatalf("run %d, %+v: %v", run, l, err)
				}
			}
		})
	}
}

// countRun decides n random counting requests under l, the clock never
// going back, and checks each decision.
func countRun(rng *rand.Rand, l Limit, n int) error {
	var s State
	at := epoch.UnixMicro()
	w := l.Window.Microseconds()
	bound := l.Window
	if l.Algorithm == SlidingWindowCounter {
		bound = 2 * l.Window
	}
	// apply decides r at t on a copy of st, leaving st as it was.
	apply := func(st State, t int64, hits uint64) (State, Decision) {
		st = clone(st)
		r := Request{Limit: l, Hits: hits, Count: true}
		d := Apply(&st, time.UnixMicro(t), &r)
		return st, d
	}
	var sent, windowStart int64 // hits sent in the window a fixed window counts
	for i := range n {
		at = tick(rng, at, w)
		hits := rng.Uint64N(4)
		switch rng.IntN(10) {
		case 0:
			hits = l.capacity() + 1
		case 1:
			hits = rng.Uint64N(3*(l.capacity()+l.Requests) + 1)
		}
		before := clone(s)
		next, d := apply(s, at, hits)
		if Stores(&Request{Limit: l, Hits: hits, Count: true}, &d) {
			s = next
		} else if !next.Equal(before) {
			return fmt.Errorf("event %d: a decision that stores nothing changed the state", i)
		}
		if !d.Allowed && hits > 0 {
			if d.Remaining != 0 {
				return fmt.Errorf("event %d: %d hits refused and counted, %d remaining", i, hits, d.Remaining)
			}
			if d.RetryAfter != Never {
				if _, e := apply(s, at+d.RetryAfter.Microseconds(), hits); !e.Allowed {
					return fmt.Errorf("event %d: %d hits refused again at retry-after %v", i, hits, d.RetryAfter)
				}
				if _, e := apply(s, at+d.RetryAfter.Microseconds()-1, hits); e.Allowed {
					return fmt.Errorf("event %d: %d hits admitted before retry-after %v", i, hits, d.RetryAfter)
				}
			}
		}
		// A check of zero hits, from the state the request left.
		if _, z := apply(s, at, 0); !z.Allowed {
			if z.RetryAfter > bound {
				return fmt.Errorf("event %d: past the limit for %v, more than %v", i, z.RetryAfter, bound)
			}
			if _, e := apply(s, at+z.RetryAfter.Microseconds(), 0); !e.Allowed {
				return fmt.Errorf("event %d: zero hits refused again at retry-after %v", i, z.RetryAfter)
			}
			if _, e := apply(s, at+z.RetryAfter.Microseconds()-1, 0); e.Allowed {
				return fmt.Errorf("event %d: zero hits admitted before retry-after %v", i, z.RetryAfter)
			}
		}
		// A fixed window counts every hit it is sent, admitted or not.
		if l.Algorithm == FixedWindow {
			start := at - floorMod(at, w)
			if start != windowStart {
				windowStart, sent = start, 0
			}
			sent += int64(hits)
			if s.Time == start && s.Count != sent || s.Time != start && sent != 0 {
				return fmt.Errorf("event %d: the window counts %d, %d hits were sent in it", i, s.Count, sent)
			}
		}
	}
	return nil
}
