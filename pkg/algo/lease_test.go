package algo

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestLeaseFigures runs random sequences of decisions, takes and gives on
// every leasable algorithm and checks, after each, the figures a decision
// reports with leases outstanding, as checkFigures does without: Remaining
// hits are admitted at the same instant and one more is not; a refusal is
// admitted at RetryAfter and not a microsecond earlier; at ResetAfter the
// state is a fresh key's. It also checks what leases promise: a take takes
// what its formula says, and a give never makes more room than the hits
// it gives back.
func TestLeaseFigures(t *testing.T) {
	for _, a := range []Algorithm{FixedWindow, SlidingWindowCounter, TokenBucket, GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(a), 17))
			for run := range 200 {
				if err := leaseFigures(rng, randomLimit(rng, a)); err != nil {
					t.Fatalf("run %d: %v", run, err)
				}
			}
		})
	}
}

func leaseFigures(rng *rand.Rand, l Limit) error {
	var s State
	at := epoch.UnixMicro()
	w := l.Window.Microseconds()
	capacity := l.Requests
	if l.Algorithm.UsesBurst() {
		capacity = l.capacity()
	}
	var marks []int64
	for i := range 300 {
		at = tick(rng, at, w)
		now := time.UnixMicro(at)
		r := Request{Limit: l, Hits: rng.Uint64N(4)}
		switch rng.IntN(3) {
		case 0:
			r.Op = OpTake
			r.Lease = Lease{Max: rng.Uint64N(2*capacity + 1), Share: rng.Uint64N(5), TTL: time.Duration(rng.Int64N(2*w)+1) * time.Microsecond}
		case 1:
			if len(marks) > 0 {
				r.Op = OpGive
				r.Lease.Mark = marks[rng.IntN(len(marks))]
			}
		}
		before := clone(s)
		_, plain := step(before, now, l, 0) // what remained before
		next := clone(s)
		d := Apply(&next, now, &r)
		after := before
		if Stores(&r, &d) {
			after = clone(next)
			s = next
		}
		if d.Mark != 0 {
			marks = append(marks, d.Mark)
		}
		switch {
		case r.Op == OpTake && d.Allowed:
			want := max(r.Hits, min(r.Lease.Max, plain.Remaining/max(r.Lease.Share, 1)))
			if d.Taken != want {
				return fmt.Errorf("event %d: took %d, want max(%d, min(%d, %d/%d))", i, d.Taken, r.Hits, r.Lease.Max, plain.Remaining, r.Lease.Share)
			}
			if d.Remaining != plain.Remaining-d.Taken {
				return fmt.Errorf("event %d: %d remain after taking %d of %d", i, d.Remaining, d.Taken, plain.Remaining)
			}
		case r.Op == OpGive:
			if !d.Allowed || d.Remaining > plain.Remaining+r.Hits {
				return fmt.Errorf("event %d: a give of %d made %d remain from %d", i, r.Hits, d.Remaining, plain.Remaining)
			}
		}
		// The figures, read as checkFigures reads them, of a plain request.
		if r.Op != OpDecide {
			_, d = step(after, now, l, 0)
		}
		if d.Remaining > 0 {
			if _, dd := step(after, now, l, d.Remaining); !dd.Allowed {
				return fmt.Errorf("event %d: remaining %d, but they were refused", i, d.Remaining)
			}
		}
		if _, dd := step(after, now, l, d.Remaining+1); dd.Allowed {
			return fmt.Errorf("event %d: remaining %d, but one more was admitted", i, d.Remaining)
		}
		if r.Op == OpDecide && !d.Allowed && d.RetryAfter != Never {
			if _, dd := step(before, now.Add(d.RetryAfter), l, r.Hits); !dd.Allowed {
				return fmt.Errorf("event %d: %d hits refused again at retry-after %v (state %+v)", i, r.Hits, d.RetryAfter, before)
			}
			if _, dd := step(before, now.Add(d.RetryAfter-time.Microsecond), l, r.Hits); dd.Allowed {
				return fmt.Errorf("event %d: %d hits admitted before retry-after %v (state %+v)", i, r.Hits, d.RetryAfter, before)
			}
		}
		reset := now.Add(d.ResetAfter)
		for _, h := range []uint64{0, 1, capacity} {
			_, got := step(after, reset, l, h)
			_, fresh := step(State{}, reset, l, h)
			if got != fresh {
				return fmt.Errorf("event %d: at reset-after %v, %d hits got %+v, a fresh key %+v (state %+v)", i, d.ResetAfter, h, got, fresh, after)
			}
		}
	}
	return nil
}
