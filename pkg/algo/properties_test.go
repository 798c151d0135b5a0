package algo

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// event is one decided request of a random sequence.
type event struct {
	at     int64 // µs
	hits   uint64
	before State // the state the request was decided on
	after  State // the state stored after it
	d      Decision
}

// randomLimit returns a small limit of algorithm a, so that random
// sequences reach its boundaries often.
func randomLimit(rng *rand.Rand, a Algorithm) Limit {
	windows := []time.Duration{time.Second, 3 * time.Second, 7 * time.Second, 10 * time.Millisecond}
	l := Limit{Algorithm: a, Requests: 1 + rng.Uint64N(12), Window: windows[rng.IntN(len(windows))]}
	if a.UsesBurst() && rng.IntN(2) == 0 {
		l.Burst = 1 + rng.Uint64N(3*l.Requests)
	}
	return l
}

// randomRun decides a random sequence of requests under l with a clock
// that never goes back, storing the state after allowed requests as a
// backend would.
func randomRun(rng *rand.Rand, l Limit, n int) []event {
	var s State
	at := epoch.UnixMicro()
	w := l.Window.Microseconds()
	events := make([]event, 0, n)
	for range n {
		at = tick(rng, at, w)
		hits := rng.Uint64N(4)
		if rng.IntN(20) == 0 {
			hits = l.capacity() + 1
		}
		next, d := step(s, time.UnixMicro(at), l, hits)
		// The checks derive more states from before and after: they get
		// their own logs (see State).
		e := event{at: at, hits: hits, before: clone(s), d: d, after: clone(s)}
		if d.Allowed && hits > 0 {
			e.after = clone(next)
			s = next
		} else if !next.Equal(s) {
			panic(fmt.Sprintf("%v: a refusal or a peek changed the state from %+v to %+v", l.Algorithm, s, next))
		}
		events = append(events, e)
	}
	return events
}

// tick returns the instant after at, in µs, of a random sequence under a
// window of w µs: mostly a fraction of a window later, sometimes the same
// instant, sometimes after an idle gap of up to three windows.
func tick(rng *rand.Rand, at, w int64) int64 {
	switch rng.IntN(10) {
	case 0: // the same instant
		return at
	case 1: // an idle gap
		return at + rng.Int64N(3*w)
	}
	return at + rng.Int64N(w/4+1)
}

func clone(s State) State {
	s.Log = slices.Clone(s.Log)
	return s
}

// TestGuarantees checks each algorithm's guarantee from the SPEC on random
// sequences: the bound on admitted hits, and that every figure a decision
// reports is exact.
func TestGuarantees(t *testing.T) {
	for _, a := range Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(a), 7))
			for run := range 150 {
				l := randomLimit(rng, a)
				events := randomRun(rng, l, 300)
				if err := checkBound(l, events); err != nil {
					t.Fatalf("run %d, %+v: %v", run, l, err)
				}
				if err := checkFigures(l, events); err != nil {
					t.Fatalf("run %d, %+v: %v", run, l, err)
				}
			}
		})
	}
}

// checkBound checks the algorithm's bound on admitted hits.
func checkBound(l Limit, events []event) error {
	w, n, b := l.Window.Microseconds(), int64(l.Requests), int64(l.capacity())
	var admitted []event
	for _, e := range events {
		if e.d.Allowed && e.hits > 0 {
			admitted = append(admitted, e)
		}
	}
	// inWindow sums the hits admitted in (from, to].
	inWindow := func(from, to int64) (sum int64) {
		for _, e := range admitted {
			if e.at > from && e.at <= to {
				sum += int64(e.hits)
			}
		}
		return sum
	}
	for i, e := range admitted {
		switch l.Algorithm {
		case FixedWindow, SlidingWindowCounter:
			// At most N per aligned window (for the counter, its weighted
			// estimate is only ever stricter).
			start := e.at - floorMod(e.at, w)
			if got := inWindow(start-1, start+w-1); got > n {
				return fmt.Errorf("aligned window at %d admitted %d > %d", start, got, n)
			}
		case SlidingWindowLog:
			if got := inWindow(e.at-w, e.at); got > n {
				return fmt.Errorf("window (%d, %d] admitted %d > %d", e.at-w, e.at, got, n)
			}
		case BurstFill:
			start := e.after.Time
			if got := inWindow(start-1, start+w-1); got > n {
				return fmt.Errorf("window from %d admitted %d > %d", start, got, n)
			}
		case TokenBucket, LeakyBucket, GCRA:
			// Any interval [t_i, t_j] admits at most B + r·(t_j − t_i).
			var sum int64
			for _, f := range admitted[i:] {
				sum += int64(f.hits)
				if sum*w > b*w+(f.at-e.at)*n {
					return fmt.Errorf("[%d, %d] admitted %d > %d + %d×%d/%d", e.at, f.at, sum, b, f.at-e.at, n, w)
				}
			}
		}
	}
	return nil
}

// checkFigures checks that a decision's figures are exact: Remaining more
// hits are admitted at the same instant and one more is not; a refusal is
// admitted at RetryAfter and not a microsecond earlier; at ResetAfter the
// limit is fully restored, indistinguishable from a key never seen; a
// leaky bucket's Wait is the time its queue took to drain.
func checkFigures(l Limit, events []event) error {
	capacity := l.Requests
	if l.Algorithm.UsesBurst() {
		capacity = l.capacity()
	}
	for i, e := range events {
		now := time.UnixMicro(e.at)
		if e.d.Remaining > 0 {
			if _, d := step(e.after, now, l, e.d.Remaining); !d.Allowed {
				return fmt.Errorf("event %d: remaining %d, but %d hits were refused", i, e.d.Remaining, e.d.Remaining)
			}
		}
		if _, d := step(e.after, now, l, e.d.Remaining+1); d.Allowed {
			return fmt.Errorf("event %d: remaining %d, but %d hits were admitted", i, e.d.Remaining, e.d.Remaining+1)
		}
		if !e.d.Allowed && e.d.RetryAfter != Never {
			if _, d := step(e.before, now.Add(e.d.RetryAfter), l, e.hits); !d.Allowed {
				return fmt.Errorf("event %d: %d hits refused again at retry-after %v", i, e.hits, e.d.RetryAfter)
			}
			if _, d := step(e.before, now.Add(e.d.RetryAfter-time.Microsecond), l, e.hits); d.Allowed {
				return fmt.Errorf("event %d: %d hits admitted before retry-after %v", i, e.hits, e.d.RetryAfter)
			}
		}
		if !e.d.Allowed && e.d.RetryAfter == Never && e.hits <= capacity {
			return fmt.Errorf("event %d: %d hits within capacity %d refused forever", i, e.hits, capacity)
		}
		reset := now.Add(e.d.ResetAfter)
		for _, h := range []uint64{0, 1, capacity} {
			_, got := step(e.after, reset, l, h)
			_, fresh := step(State{}, reset, l, h)
			if got != fresh {
				return fmt.Errorf("event %d: at reset-after %v, %d hits got %+v, a fresh key %+v", i, e.d.ResetAfter, h, got, fresh)
			}
		}
		if l.Algorithm == LeakyBucket && e.d.Allowed && e.hits > 0 {
			if _, peek := step(e.before, now, l, 0); e.d.Wait != peek.ResetAfter {
				return fmt.Errorf("event %d: wait %v, but the queue ahead drains in %v", i, e.d.Wait, peek.ResetAfter)
			}
		}
	}
	return nil
}

// TestBucketsAgree checks that token bucket, leaky bucket and GCRA admit
// the same hits and report the same figures (but the leaky bucket's Wait)
// on any sequence with a clock that does not go back.
func TestBucketsAgree(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for run := range 300 {
		l := randomLimit(rng, TokenBucket)
		var states [3]State
		at := epoch
		for i := range 300 {
			at = at.Add(time.Duration(rng.Int64N(int64(l.Window / 2))))
			hits := rng.Uint64N(5)
			var ds [3]Decision
			for k, a := range []Algorithm{TokenBucket, LeakyBucket, GCRA} {
				la := l
				la.Algorithm = a
				next, d := step(states[k], at, la, hits)
				if d.Allowed {
					states[k] = next
				}
				d.Wait = 0
				ds[k] = d
			}
			if ds[0] != ds[1] || ds[0] != ds[2] {
				t.Fatalf("run %d step %d (%+v, %d hits): token %+v, leaky %+v, gcra %+v", run, i, l, hits, ds[0], ds[1], ds[2])
			}
		}
	}
}

// TestSlidingWindowCounterError measures how far the sliding window
// counter strays from an exact sliding window: the most hits it admits in
// any window of length W, for a client that sends everything it may. The
// figures are in docs/algorithms.md; run with -v to see them.
func TestSlidingWindowCounterError(t *testing.T) {
	const w = int64(time.Second / time.Microsecond)
	for _, n := range []uint64{10, 100, 1000} {
		l := Limit{Algorithm: SlidingWindowCounter, Requests: n, Window: time.Second}
		// maxIn returns the most hits admitted in any window (t−W, t].
		maxIn := func(admitted []event) uint64 {
			var most, sum uint64
			j := 0
			for _, e := range admitted {
				sum += e.hits
				for admitted[j].at <= e.at-w {
					sum -= admitted[j].hits
					j++
				}
				most = max(most, sum)
			}
			return most
		}
		// greedy asks for one hit at each instant of at and returns those
		// admitted.
		greedy := func(at []int64) []event {
			var s State
			var admitted []event
			for _, t := range at {
				for {
					next, d := step(s, time.UnixMicro(t), l, 1)
					if !d.Allowed {
						break
					}
					s = next
					admitted = append(admitted, event{at: t, hits: 1})
				}
			}
			return admitted
		}
		base := epoch.UnixMicro()
		// Worst case: a burst at the very end of one window, then a
		// client that asks every millisecond of the next.
		at := []int64{base + w - 1}
		for t := base + w; t < base+3*w; t += 1000 {
			at = append(at, t)
		}
		worst := maxIn(greedy(at))
		// Steady overload: requests at random instants, about 5 per
		// expected admission, for 20 windows.
		rng := rand.New(rand.NewPCG(n, 1))
		at = at[:0]
		for t := base; t < base+20*w; t += rng.Int64N(2*w/int64(n)/5) + 1 {
			at = append(at, t)
		}
		steady := maxIn(greedy(at))
		t.Logf("N=%d: burst at a window's end, then greedy: at most %d in a sliding window (%.2f N); steady overload: %d (%.3f N)",
			n, worst, float64(worst)/float64(n), steady, float64(steady)/float64(n))
		if worst > 2*n || steady > 2*n {
			t.Errorf("N=%d: admitted %d and %d in one window, above 2N", n, worst, steady)
		}
	}
}
