package lease

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
)

// admission is a leased request the store counted: its hits, at an
// instant of the store's clock (µs).
type admission struct {
	at   int64
	hits uint64
}

// replica is one ratelimitd process of a property run.
type replica struct {
	e       *Engine
	crashed bool
}

// hook is a store that runs during while a call is at the store.
type hook struct {
	inner  algo.Backend
	during func()
}

func (h hook) Decide(ctx context.Context, reqs []algo.Request, out []algo.Decision) error {
	h.during()
	return h.inner.Decide(ctx, reqs, out)
}

// TestLeasingIsSafeAndLive runs random interleavings of replicas sharing
// one store: decisions of leased requests (some with an exact request in
// the same batch, some shadow, some peeks), background calls sent and
// their results delivered apart, sweeps, a clock that jumps, replicas that
// crash holding leases, and any of these happening while a replica's call
// is at the store. Each replica's clock is off the store's by its own
// offset. It checks:
//
//   - safety: the hits admitted meet the algorithm's exact bound (at most
//     N per aligned window; the sliding window counter's estimate at
//     every admission; at most B + r·t in any interval of a bucket);
//   - liveness: a replica refuses a request only when the store and its
//     own leases together lack the hits, and no replica ever holds more
//     than two leases of 1/Share of the limit each (docs/leasing.md);
//   - nothing is lost (fixed window): the store counts exactly what was
//     admitted and what replicas hold, give back or are being sent.
func TestLeasingIsSafeAndLive(t *testing.T) {
	for _, a := range []algo.Algorithm{algo.FixedWindow, algo.SlidingWindowCounter, algo.TokenBucket, algo.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(a)+1, 2026))
			for run := range 150 {
				if err := newLeaseRun(rng, a).run(); err != nil {
					t.Fatalf("run %d: %v", run, err)
				}
			}
		})
	}
}

// leaseRun is one random run.
type leaseRun struct {
	rng      *rand.Rand
	l, exact algo.Limit
	capacity uint64
	share    uint64
	desc     string
	base     *clocktest.Clock
	store    *memory.Backend
	replicas []*replica
	admitted []admission
	depth    int   // of calls in progress in during
	acted    int   // times during acted
	err      error // the first error found during a call
}

var leaseKey = []byte("k")

func newLeaseRun(rng *rand.Rand, a algo.Algorithm) *leaseRun {
	windows := []time.Duration{time.Second, 10 * time.Second}
	w := windows[rng.IntN(len(windows))]
	// Small limits that leases exhaust, and large ones they rarely reach.
	l := algo.Limit{Algorithm: a, Requests: 1 + rng.Uint64N([]uint64{10, 60, 2000}[rng.IntN(3)]), Window: w}
	if a.UsesBurst() && rng.IntN(2) == 0 {
		l.Burst = 1 + rng.Uint64N(2*l.Requests)
	}
	r := &leaseRun{rng: rng, l: l, capacity: l.Requests, share: []uint64{1, 2, 4, 8}[rng.IntN(4)]}
	if l.Burst > 0 {
		r.capacity = l.Burst
	}
	r.exact = algo.Limit{Requests: 1 + rng.Uint64N(40), Window: w}
	ttl := w/10 + time.Duration(rng.Int64N(int64(2*w)))
	period := max(time.Millisecond, time.Duration(rng.Int64N(int64(ttl))+1))
	r.base = clocktest.New(epoch.Add(time.Duration(rng.Int64N(int64(w)))))
	r.store = memory.New(memory.Options{Now: r.base.Now, SweepInterval: -1})
	store := hook{inner: r.store, during: r.during}
	r.replicas = make([]*replica, 2+rng.IntN(3))
	for i := range r.replicas {
		offset := time.Duration(rng.Int64N(int64(2*time.Second))) - time.Second
		e, err := New(store, Options{
			Now:    func() time.Time { return r.base.Now().Add(offset) },
			Manual: true, TTL: ttl, Period: period, Share: r.share,
		})
		if err != nil {
			panic(err)
		}
		r.replicas[i] = &replica{e: e}
	}
	r.desc = fmt.Sprintf("%+v, share %d, ttl %v, period %v, %d replicas", l, r.share, ttl, period, len(r.replicas))
	return r
}

func (r *leaseRun) run() error {
	defer r.store.Close()
	for step := range 500 {
		if err := r.act(); err != nil {
			return fmt.Errorf("%s: step %d: %v", r.desc, step, err)
		}
		if r.err != nil {
			return fmt.Errorf("%s: step %d, during a call: %v", r.desc, step, r.err)
		}
		if err := r.check(); err != nil {
			return fmt.Errorf("%s: step %d: %v", r.desc, step, err)
		}
	}
	if err := checkSafety(r.l, r.admitted); err != nil {
		return fmt.Errorf("%s: %v", r.desc, err)
	}
	return nil
}

// during acts, now and then, while a call is at the store.
func (r *leaseRun) during() {
	if r.depth > 0 || r.rng.IntN(3) > 0 {
		return
	}
	r.depth++
	r.acted++
	if err := r.act(); err != nil && r.err == nil {
		r.err = err
	}
	r.depth--
}

// act does one random thing at a random replica.
func (r *leaseRun) act() error {
	ctx := context.Background()
	rep := r.replicas[r.rng.IntN(len(r.replicas))]
	w := r.l.Window
	switch op := r.rng.IntN(20); {
	case rep.crashed:
	case op < 10:
		return r.decide(ctx, rep)
	case op < 12:
		rep.e.Send(ctx, 1+r.rng.IntN(4))
	case op < 14:
		rep.e.Deliver()
	case op == 14:
		rep.e.Sweep()
	case op < 19 && r.depth > 0:
		// A call is decided at one instant of the store's clock; its
		// hits leased by this replica were decided at its start.
	case op < 17:
		// Mostly small steps, so that rates build and leases are spent.
		r.base.Advance(time.Duration(r.rng.Int64N(int64(w / 500))))
	case op < 18:
		r.base.Advance(time.Duration(r.rng.Int64N(int64(w / 10))))
	case op < 19:
		r.base.Advance(time.Duration(r.rng.Int64N(int64(w))))
	default:
		if r.rng.IntN(10) == 0 {
			rep.crashed = true // its leases stay with it, unspent
		}
	}
	return nil
}

// decide decides a leased request at rep, now and then with an exact
// request in the same batch, and records what the store counted.
func (r *leaseRun) decide(ctx context.Context, rep *replica) error {
	req := algo.Request{Key: leaseKey, Limit: r.l, Hits: 1 + r.rng.Uint64N(3), Leased: true,
		Shadow: r.rng.IntN(10) == 0, Peek: r.rng.IntN(12) == 0}
	if r.rng.IntN(30) == 0 {
		req.Hits = r.capacity + 1
	}
	reqs := []algo.Request{req}
	if r.rng.IntN(4) == 0 {
		reqs = append(reqs, algo.Request{Key: []byte("x"), Limit: r.exact, Hits: 1})
	}
	out := make([]algo.Decision, len(reqs))
	acted := r.acted
	if err := rep.e.Decide(ctx, reqs, out); err != nil {
		return err
	}
	batch := true
	for i := range reqs {
		if !out[i].Allowed && !reqs[i].Shadow {
			batch = false
		}
	}
	switch {
	case req.Peek:
	case out[0].Allowed && batch:
		r.admitted = append(r.admitted, admission{r.base.Now().UnixMicro(), req.Hits})
	case !out[0].Allowed && r.acted == acted:
		// Refused: the store and this replica's leases lacked the hits
		// (unless a lease arrived while the call was at the store).
		if s, h := r.storeLeft(), r.held(rep); s+h >= req.Hits {
			return fmt.Errorf("%d hits refused while the store had %d and the replica held %d", req.Hits, s, h)
		}
	}
	return nil
}

// check checks what must hold after every step.
func (r *leaseRun) check() error {
	for i, rep := range r.replicas {
		if h := r.held(rep); h > 2*(r.capacity/r.share) {
			return fmt.Errorf("replica %d holds %d, more than two leases of %d/%d", i, h, r.capacity, r.share)
		}
	}
	if r.l.Algorithm != algo.FixedWindow {
		return nil
	}
	// Nothing is lost: what the store counts in this window is what was
	// admitted in it and what replicas hold of it, have queued to give
	// back, or took without knowing yet.
	now := r.base.Now().UnixMicro()
	start := now - now%r.l.Window.Microseconds()
	var sum uint64
	for _, x := range r.admitted {
		if x.at >= start {
			sum += x.hits
		}
	}
	for _, rep := range r.replicas {
		sum += rep.e.outstanding(start)
	}
	if used := r.l.Requests - min(r.l.Requests, r.storeLeft()); used != sum {
		return fmt.Errorf("the store counts %d in the window, admitted and outstanding %d", used, sum)
	}
	return nil
}

// storeLeft is what the store has left now.
func (r *leaseRun) storeLeft() uint64 {
	out := make([]algo.Decision, 1)
	_ = r.store.Decide(context.Background(), []algo.Request{{Key: leaseKey, Limit: r.l, Peek: true}}, out)
	return out[0].Remaining
}

// held is what rep holds of the key.
func (r *leaseRun) held(rep *replica) uint64 {
	st, _ := rep.e.LeaseState(leaseKey)
	return st.Held
}

// checkSafety checks the hits admitted against the exact bound of l's
// algorithm.
func checkSafety(l algo.Limit, admitted []admission) error {
	w, n := l.Window.Microseconds(), int64(l.Requests)
	b := n
	if l.Burst > 0 {
		b = int64(l.Burst)
	}
	sum := func(from, to int64) (s int64) { // hits admitted in [from, to]
		for _, x := range admitted {
			if x.at >= from && x.at <= to {
				s += int64(x.hits)
			}
		}
		return s
	}
	for i, x := range admitted {
		start := x.at - x.at%w
		switch l.Algorithm {
		case algo.FixedWindow:
			if got := sum(start, start+w-1); got > n {
				return fmt.Errorf("window at %d admitted %d > %d", start, got, n)
			}
		case algo.SlidingWindowCounter:
			// The estimate at this admission, with every hit admitted so
			// far in this window and all of the previous one.
			var prev, curr int64
			for _, y := range admitted[:i+1] {
				switch {
				case y.at >= start && y.at < start+w:
					curr += int64(y.hits)
				case y.at >= start-w && y.at < start:
					prev += int64(y.hits)
				}
			}
			weighted := int64(math.Ceil(float64(prev) * float64(w-(x.at-start)) / float64(w)))
			if weighted+curr > n {
				return fmt.Errorf("at %d: ceil(%d × weight) + %d = %d > %d", x.at, prev, curr, weighted+curr, n)
			}
		default:
			var s int64
			for _, y := range admitted[i:] {
				s += int64(y.hits)
				if s*w > b*w+(y.at-x.at)*n {
					return fmt.Errorf("[%d, %d] admitted %d > %d + %d×%d/%d", x.at, y.at, s, b, y.at-x.at, n, w)
				}
			}
		}
	}
	return nil
}

// outstanding returns the hits of lease mark that e holds, has queued to
// give back, or took in a call whose results it has not yet delivered.
func (e *Engine) outstanding(mark int64) uint64 {
	var n uint64
	for i := range e.shards {
		sh := &e.shards[i]
		sh.mu.Lock()
		for _, en := range sh.m {
			for _, s := range [2]slice{en.cur, en.next} {
				if s.mark == mark {
					n += s.n
				}
			}
		}
		sh.mu.Unlock()
	}
	e.qmu.Lock()
	defer e.qmu.Unlock()
	for _, w := range e.queue {
		if w.req.Op == algo.OpGive && w.req.Lease.Mark == mark {
			n += w.req.Hits
		}
	}
	for _, s := range e.sent {
		for i, w := range s.batch {
			if w.req.Op == algo.OpTake && s.err == nil && s.out[i].Mark == mark {
				n += s.out[i].Taken
			}
		}
	}
	return n
}
