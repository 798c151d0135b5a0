package lease

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
)

// epoch is a whole minute, so that windows start there.
var epoch = time.Unix(1_700_000_040, 0)

// counting is a backend that counts its calls and can be made to fail.
type counting struct {
	inner algo.Backend
	calls atomic.Int64
	fail  atomic.Bool
}

var errDown = errors.New("store down")

func (c *counting) Decide(ctx context.Context, reqs []algo.Request, out []algo.Decision) error {
	c.calls.Add(1)
	if c.fail.Load() {
		return errDown
	}
	return c.inner.Decide(ctx, reqs, out)
}

func (c *counting) Reset(ctx context.Context, reqs []algo.Request) error {
	return c.inner.(algo.Resetter).Reset(ctx, reqs)
}

// store is a shared store: a memory backend on clock c.
func newStore(t *testing.T, c *clocktest.Clock) *memory.Backend {
	m := memory.New(memory.Options{Now: c.Now, SweepInterval: -1})
	t.Cleanup(func() { m.Close() })
	return m
}

// newEngine returns a manual engine over inner.
func newEngine(t *testing.T, inner algo.Backend, c *clocktest.Clock, opts Options) *Engine {
	t.Helper()
	opts.Now, opts.Manual = c.Now, true
	e, err := New(inner, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	return e
}

func leasedReq(key string, l algo.Limit, hits uint64) algo.Request {
	return algo.Request{Key: []byte(key), Limit: l, Hits: hits, Leased: true}
}

// decide decides one request with e.
func decide(t *testing.T, e algo.Backend, reqs ...algo.Request) []algo.Decision {
	t.Helper()
	out := make([]algo.Decision, len(reqs))
	if err := e.Decide(context.Background(), reqs, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// remaining peeks what the store has left for r's key.
func remaining(t *testing.T, store algo.Backend, r algo.Request) uint64 {
	t.Helper()
	r.Hits, r.Leased, r.Peek = 0, false, true
	return decide(t, store, r)[0].Remaining
}

// warm sends n requests for key, one a millisecond, each followed by the
// background work it queued: the key's leases grow to its rate.
func warm(t *testing.T, e *Engine, c *clocktest.Clock, key string, l algo.Limit, n int) {
	t.Helper()
	for range n {
		c.Advance(time.Millisecond)
		decide(t, e, leasedReq(key, l, 1))
		e.Flush(context.Background())
	}
}

// TestHotKeyDecidesLocally sends a steady stream to one key: after the
// first lease, decisions are made in process, and what was admitted is
// exactly what the store counted, less what the engine holds.
func TestHotKeyDecidesLocally(t *testing.T) {
	c := clocktest.New(epoch)
	store := &counting{inner: newStore(t, c)}
	e := newEngine(t, store, c, Options{})
	l := algo.Limit{Requests: 100_000, Window: time.Minute}
	admitted := uint64(0)
	for range 2000 {
		c.Advance(time.Millisecond) // 1,000 per second
		d := decide(t, e, leasedReq("k", l, 1))[0]
		if !d.Allowed {
			t.Fatalf("refused at %v with %d admitted", c.Now().Sub(epoch), admitted)
		}
		admitted++
		e.Flush(context.Background())
	}
	st := e.Stats()
	if calls := store.calls.Load(); calls > 40 {
		t.Errorf("%d store calls for 2000 decisions, want a lease to cover ~1 s of traffic", calls)
	}
	if st.Local < 1900 {
		t.Errorf("%d of 2000 decisions made in process", st.Local)
	}
	got := remaining(t, store.inner, leasedReq("k", l, 0))
	if want := l.Requests - admitted - uint64(st.Held); got != want {
		t.Errorf("the store has %d left, want %d (limit − %d admitted − %d held)", got, want, admitted, st.Held)
	}
	t.Logf("%d decisions: %d store calls, %d local, %d held", admitted, store.calls.Load(), st.Local, st.Held)
}

// TestColdKeyLeasesNothing sends one request per key: each is decided by
// the store, exactly, and nothing is held.
func TestColdKeyLeasesNothing(t *testing.T) {
	c := clocktest.New(epoch)
	store := newStore(t, c)
	e := newEngine(t, store, c, Options{})
	l := algo.Limit{Requests: 100, Window: time.Minute}
	for i := range 50 {
		c.Advance(10 * time.Millisecond)
		d := decide(t, e, leasedReq(string(rune('a'+i)), l, 1))[0]
		if !d.Allowed || d.Remaining != 99 {
			t.Fatalf("key %d: %+v, want allowed with 99 remaining", i, d)
		}
	}
	if st := e.Stats(); st.Held != 0 || st.Takes != 0 || e.Queued() != 0 {
		t.Errorf("cold keys: %+v, %d queued; want nothing held, taken or queued", st, e.Queued())
	}
}

// TestNeverAdmitsMoreThanTheLimit drains a limit from one key at a high
// rate: exactly the limit is admitted, the last hits with the leases
// shrunk to single decisions.
func TestNeverAdmitsMoreThanTheLimit(t *testing.T) {
	for _, a := range []algo.Algorithm{algo.FixedWindow, algo.SlidingWindowCounter, algo.TokenBucket, algo.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			c := clocktest.New(epoch)
			store := newStore(t, c)
			e := newEngine(t, store, c, Options{})
			l := algo.Limit{Algorithm: a, Requests: 500, Window: time.Hour}
			var admitted uint64
			for range 1000 {
				c.Advance(100 * time.Microsecond)
				if decide(t, e, leasedReq("k", l, 1))[0].Allowed {
					admitted++
				}
				if e.Queued() > 0 {
					e.Flush(context.Background())
				}
			}
			if admitted != l.Requests {
				t.Errorf("admitted %d, want exactly %d", admitted, l.Requests)
			}
		})
	}
}

// TestMixedBatchAllOrNothing decides a leased and an exact request
// together: when the exact one is over its limit, the leased one consumes
// nothing, in process or in the store.
func TestMixedBatchAllOrNothing(t *testing.T) {
	c := clocktest.New(epoch)
	store := newStore(t, c)
	e := newEngine(t, store, c, Options{})
	hot := algo.Limit{Requests: 10_000, Window: time.Minute}
	tight := algo.Limit{Requests: 3, Window: time.Minute}
	// Warm the leased key so that it holds a lease.
	warm(t, e, c, "hot", hot, 200)
	held := e.Stats().Held
	if held == 0 {
		t.Fatal("the warm key holds no lease")
	}
	exact := algo.Request{Key: []byte("tight"), Limit: tight, Hits: 1}
	for i := range 5 {
		c.Advance(time.Millisecond)
		out := decide(t, e, leasedReq("hot", hot, 2), exact)
		// The leased request is allowed in itself; the batch stands or
		// falls with the exact one.
		if want := i < 3; out[1].Allowed != want || !out[0].Allowed {
			t.Fatalf("batch %d: %+v, want the exact request allowed %v and the leased one allowed", i, out, want)
		}
	}
	// Refused batches spent nothing: 3 batches of 2 hits were admitted.
	st, _ := e.LeaseState([]byte("hot"))
	total := 200 + 3*2
	if got := hot.Requests - remaining(t, store, leasedReq("hot", hot, 0)) - st.Held; got != uint64(total) {
		t.Errorf("the store counts %d spent, want %d", got, total)
	}
}

// TestCountedCostsAreSpent decides leased requests that count their hits
// whatever the answer (over_limit_hits: count): in a refused batch the
// hits the leases covered are spent, and a cost beyond what remains is
// counted by the store, so the next request is refused, as it would be
// without leases.
func TestCountedCostsAreSpent(t *testing.T) {
	c := clocktest.New(epoch)
	store := newStore(t, c)
	e := newEngine(t, store, c, Options{})
	hot := algo.Limit{Requests: 1000, Window: time.Minute}
	tight := algo.Limit{Requests: 3, Window: time.Minute}
	counted := func(hits uint64) algo.Request {
		r := leasedReq("hot", hot, hits)
		r.Count = true
		return r
	}
	for range 200 {
		c.Advance(time.Millisecond)
		decide(t, e, counted(1))
		e.Flush(context.Background())
	}
	if e.Stats().Held == 0 {
		t.Fatal("the warm key holds no lease")
	}
	exact := algo.Request{Key: []byte("tight"), Limit: tight, Hits: 1}
	for i := range 5 {
		c.Advance(time.Millisecond)
		out := decide(t, e, counted(2), exact)
		if want := i < 3; out[1].Allowed != want {
			t.Fatalf("batch %d: %+v, want the exact request allowed %v", i, out, want)
		}
	}
	spent := func() uint64 {
		st, _ := e.LeaseState([]byte("hot"))
		return hot.Requests - remaining(t, store, leasedReq("hot", hot, 0)) - st.Held
	}
	if got, want := spent(), uint64(200+5*2); got != want {
		t.Errorf("the store counts %d spent, want %d: the 2 refused batches' hits too", got, want)
	}
	// A cost beyond what remains: refused, and counted whole.
	left := hot.Requests - spent()
	c.Advance(time.Millisecond)
	if d := decide(t, e, counted(left+500))[0]; d.Allowed || d.Remaining != 0 {
		t.Fatalf("a cost of %d with %d left: %+v, want refused with nothing remaining", left+500, left, d)
	}
	e.Flush(context.Background())
	if got := remaining(t, store, leasedReq("hot", hot, 0)); got != 0 {
		t.Errorf("the store has %d left after the cost, want 0", got)
	}
	c.Advance(time.Millisecond)
	if d := decide(t, e, counted(1))[0]; d.Allowed {
		t.Fatalf("the request after the cost: %+v, want refused", d)
	}
	// A check of zero hits (a request-time check before a cost) is refused
	// too: the limit is past what it admits.
	if d := decide(t, e, counted(0))[0]; d.Allowed {
		t.Fatalf("a zero-hit check after the cost: %+v, want refused", d)
	}
}

// TestColdKeyGivesBack lets a warm key go cold: the sweep gives its lease
// back, and the store has it again.
func TestColdKeyGivesBack(t *testing.T) {
	for _, a := range []algo.Algorithm{algo.FixedWindow, algo.SlidingWindowCounter, algo.TokenBucket, algo.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			c := clocktest.New(epoch)
			store := newStore(t, c)
			e := newEngine(t, store, c, Options{})
			l := algo.Limit{Algorithm: a, Requests: 10_000, Window: time.Hour}
			warm(t, e, c, "k", l, 100)
			if e.Stats().Held == 0 {
				t.Fatal("nothing held")
			}
			c.Advance(DefaultPeriod)
			e.Sweep()
			e.Flush(context.Background())
			st := e.Stats()
			if st.Held != 0 || st.Given == 0 {
				t.Fatalf("after going cold: %+v, want nothing held and hits given back", st)
			}
			// The bucket refilled meanwhile: compare the window counts.
			if a == algo.FixedWindow || a == algo.SlidingWindowCounter {
				if got := remaining(t, store, leasedReq("k", l, 0)); got != l.Requests-100 {
					t.Errorf("the store has %d left, want %d: only the hits admitted count", got, l.Requests-100)
				}
			}
		})
	}
}

// TestCloseGivesBack closes an engine holding leases: they go back.
func TestCloseGivesBack(t *testing.T) {
	c := clocktest.New(epoch)
	store := newStore(t, c)
	opts := Options{Now: c.Now, Manual: true}
	e, err := New(store, opts)
	if err != nil {
		t.Fatal(err)
	}
	l := algo.Limit{Requests: 10_000, Window: time.Hour}
	warm(t, e, c, "k", l, 100)
	if e.Stats().Held == 0 {
		t.Fatal("nothing held")
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := remaining(t, store, leasedReq("k", l, 0)); got != l.Requests-100 {
		t.Errorf("the store has %d left after Close, want %d", got, l.Requests-100)
	}
}

// TestStoreDown fails the store: held leases keep deciding, then the
// error reaches the caller, and a failed call takes nothing from the
// leases.
func TestStoreDown(t *testing.T) {
	c := clocktest.New(epoch)
	store := &counting{inner: newStore(t, c)}
	e := newEngine(t, store, c, Options{})
	l := algo.Limit{Requests: 100_000, Window: time.Hour}
	warm(t, e, c, "k", l, 500)
	held := uint64(e.Stats().Held)
	store.fail.Store(true)
	var local uint64
	for {
		c.Advance(100 * time.Microsecond)
		out := make([]algo.Decision, 1)
		err := e.Decide(context.Background(), []algo.Request{leasedReq("k", l, 1)}, out)
		if err != nil {
			if !errors.Is(err, errDown) {
				t.Fatalf("error %v, want the store's", err)
			}
			break
		}
		if !out[0].Allowed {
			t.Fatal("refused while leases were held")
		}
		local++
		e.Flush(context.Background()) // prefetches fail
	}
	if local != held {
		t.Errorf("decided %d from leases while the store was down, want the %d held", local, held)
	}
	if st := e.Stats(); st.Held != 0 || st.Errors == 0 {
		t.Errorf("after the leases ran out: %+v", st)
	}
}

// TestLimitChange moves a key to another limit (a rule reload): the old
// leases go back, and the new limit is leased afresh.
func TestLimitChange(t *testing.T) {
	c := clocktest.New(epoch)
	store := newStore(t, c)
	e := newEngine(t, store, c, Options{})
	old := algo.Limit{Requests: 10_000, Window: time.Hour}
	warm(t, e, c, "k", old, 100)
	now := algo.Limit{Requests: 5_000, Window: time.Hour}
	c.Advance(time.Millisecond)
	d := decide(t, e, leasedReq("k", now, 1))[0]
	e.Flush(context.Background())
	if !d.Allowed {
		t.Fatalf("%+v", d)
	}
	// 101 hits were admitted under one key; the old lease came back.
	if got := remaining(t, store, leasedReq("k", now, 0)) + uint64(e.Stats().Held); got != now.Requests-101 {
		t.Errorf("store and leases hold %d, want %d", got, now.Requests-101)
	}
}

// TestPeekConsumesNothing peeks a leased key.
func TestPeekConsumesNothing(t *testing.T) {
	c := clocktest.New(epoch)
	store := newStore(t, c)
	e := newEngine(t, store, c, Options{})
	l := algo.Limit{Requests: 10, Window: time.Hour}
	for range 4 {
		decide(t, e, leasedReq("k", l, 1))
	}
	p := leasedReq("k", l, 3)
	p.Peek = true
	for range 3 {
		d := decide(t, e, p)[0]
		if !d.Allowed || d.Remaining != 3 {
			t.Fatalf("peek: %+v, want allowed with 3 remaining", d)
		}
	}
	p.Hits = 7
	if d := decide(t, e, p)[0]; d.Allowed {
		t.Fatalf("peek of 7: %+v, want refused", d)
	}
	e.Flush(context.Background())
	if got := remaining(t, store, leasedReq("k", l, 0)) + uint64(e.Stats().Held); got != 6 {
		t.Errorf("%d left, want 6", got)
	}
}

// TestOptions refuses options that cannot work.
func TestOptions(t *testing.T) {
	c := clocktest.New(epoch)
	store := newStore(t, c)
	for _, o := range []Options{
		{TTL: time.Microsecond},
		{TTL: time.Second, Period: 2 * time.Second},
		{Timeout: -1},
	} {
		o.Manual = true
		if _, err := New(store, o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
	if _, err := New(nil, Options{}); err == nil {
		t.Error("New(nil) accepted")
	}
}

// TestUndoneReservationOfAReplacedLease refuses a batch whose leased
// request reserved hits of a lease that was replaced while the call was at
// the store (a prefetched lease arrived): the reserved hits are given
// back, not lost.
func TestUndoneReservationOfAReplacedLease(t *testing.T) {
	c := clocktest.New(epoch)
	mem := newStore(t, c)
	var e *Engine
	deliver := false
	store := hook{inner: mem, during: func() {
		if deliver {
			deliver = false
			e.Deliver()
		}
	}}
	e = newEngine(t, store, c, Options{})
	l := algo.Limit{Requests: 100_000, Window: time.Hour}
	admitted := uint64(0)
	// Warm the key until a prefetch is due, and send it without
	// delivering its result.
	for e.Queued() == 0 || admitted < 50 {
		c.Advance(time.Millisecond)
		if decide(t, e, leasedReq("k", l, 1))[0].Allowed {
			admitted++
		}
		if e.Queued() > 0 && admitted < 50 {
			e.Flush(context.Background())
		}
	}
	if e.Send(context.Background(), 100) == 0 {
		t.Fatal("no prefetch sent")
	}
	held := uint64(e.Stats().Held)
	// More than is held, beside an exact request that is refused: the
	// batch is refused, and the prefetched lease lands in between.
	deliver = true
	none := algo.Request{Key: []byte("x"), Limit: algo.Limit{Requests: 0, Window: time.Hour}, Hits: 1}
	out := decide(t, e, leasedReq("k", l, held+1), none)
	if out[1].Allowed || deliver {
		t.Fatalf("%+v: want the exact request refused, with the lease delivered during the call", out)
	}
	e.Flush(context.Background())
	st, _ := e.LeaseState([]byte("k"))
	if got := l.Requests - remaining(t, mem, leasedReq("k", l, 0)); got != admitted+st.Held {
		t.Errorf("the store counts %d, want %d admitted + %d held", got, admitted, st.Held)
	}
}

// TestAThirdLeaseIsGivenBack holds two leases: a third goes back.
func TestAThirdLeaseIsGivenBack(t *testing.T) {
	var en entry
	for i, n := range []uint64{3, 4} {
		if left := en.add(slice{n: n, deadline: 10, mark: int64(i)}); left.n != 0 {
			t.Fatalf("lease %d refused", i)
		}
	}
	if left := en.add(slice{n: 5, deadline: 10, mark: 2}); left.n != 5 || left.mark != 2 {
		t.Fatalf("a third lease was kept: %+v, holding %d", left, en.held())
	}
	// A reservation of a lease no longer held comes back as an orphan.
	r := en.reserve(5) // 3 of cur, 2 of next
	en.cur = slice{}
	if o := en.unreserve(&r); o[0].n != 3 || o[0].mark != 0 || en.next.n != 4 {
		t.Fatalf("orphans %+v, next %+v", o, en.next)
	}
}

// TestConcurrentReplicas runs three engines with their own goroutines
// (prefetch, returns, sweeps) over one store, 30 goroutines asking for
// one key well past its limit: never more than the limit is admitted,
// nearly all of it is, and once the engines close, the store counts
// exactly what was admitted.
func TestConcurrentReplicas(t *testing.T) {
	for _, a := range []algo.Algorithm{algo.FixedWindow, algo.SlidingWindowCounter, algo.TokenBucket, algo.GCRA} {
		t.Run(a.String(), func(t *testing.T) {
			c := clocktest.New(epoch)
			mem := newStore(t, c)
			l := algo.Limit{Algorithm: a, Requests: 3000, Window: 24 * time.Hour}
			engines := make([]*Engine, 3)
			for i := range engines {
				e, err := New(mem, Options{Now: c.Now, TTL: time.Hour, Period: time.Minute})
				if err != nil {
					t.Fatal(err)
				}
				engines[i] = e
			}
			var admitted, asked atomic.Int64
			done := make(chan struct{})
			for g := range 30 {
				go func() {
					defer func() { done <- struct{}{} }()
					e := engines[g%3]
					out := make([]algo.Decision, 1)
					for asked.Add(1) <= 2*int64(l.Requests) {
						c.Advance(time.Microsecond)
						if err := e.Decide(context.Background(), []algo.Request{leasedReq("k", l, 1)}, out); err != nil {
							t.Error(err)
							return
						}
						if out[0].Allowed {
							admitted.Add(1)
						}
					}
				}()
			}
			for range 30 {
				<-done
			}
			for _, e := range engines {
				if err := e.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			got := uint64(admitted.Load())
			if got > l.Requests || got < l.Requests*98/100 {
				t.Errorf("admitted %d of a limit of %d, want at most it and at least 98%%", got, l.Requests)
			}
			if used := l.Requests - remaining(t, mem, leasedReq("k", l, 0)); used != got {
				t.Errorf("after Close the store counts %d, want the %d admitted", used, got)
			}
		})
	}
}

// gated is a store whose calls wait for the gate while it is shut.
type gated struct {
	inner algo.Backend
	shut  atomic.Bool
	gate  chan struct{}
	calls atomic.Int64
}

func (g *gated) Decide(ctx context.Context, reqs []algo.Request, out []algo.Decision) error {
	g.calls.Add(1)
	if g.shut.Load() {
		<-g.gate
	}
	return g.inner.Decide(ctx, reqs, out)
}

// TestOneTakeForConcurrentRequests rolls a hot key's window over and
// sends 30 concurrent requests: one calls the store, the others wait for
// its lease, and all are admitted from it.
func TestOneTakeForConcurrentRequests(t *testing.T) {
	c := clocktest.New(epoch)
	store := &gated{inner: newStore(t, c), gate: make(chan struct{})}
	e, err := New(store, Options{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	l := algo.Limit{Requests: 1_000_000, Window: time.Minute}
	c.Set(epoch.Add(59 * time.Second))
	for range 3000 { // 3,000 per second until the window ends
		c.Advance(300 * time.Microsecond)
		decide(t, e, leasedReq("k", l, 1))
	}
	// No prefetch may be on its way when the window ends.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if st, _ := e.LeaseState([]byte("k")); !st.Fetching && e.Queued() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a prefetch never landed")
		}
	}
	c.Set(epoch.Add(time.Minute)) // a new window: the leases have ended
	store.shut.Store(true)
	before := store.calls.Load()
	var admitted atomic.Int64
	done := make(chan struct{})
	for range 30 {
		go func() {
			defer func() { done <- struct{}{} }()
			out := make([]algo.Decision, 1)
			if err := e.Decide(context.Background(), []algo.Request{leasedReq("k", l, 1)}, out); err != nil {
				t.Error(err)
			} else if out[0].Allowed {
				admitted.Add(1)
			}
		}()
	}
	for deadline := time.Now().Add(10 * time.Second); e.Stats().Waits < 29; {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests waiting for the take in flight, want 29", e.Stats().Waits)
		}
		time.Sleep(time.Millisecond)
	}
	store.shut.Store(false)
	close(store.gate)
	for range 30 {
		<-done
	}
	if admitted.Load() != 30 {
		t.Errorf("admitted %d of 30", admitted.Load())
	}
	if calls := store.calls.Load() - before; calls != 1 {
		t.Errorf("30 concurrent requests made %d store calls, want 1", calls)
	}
}

// TestLeaseSize sizes leases from a key's rate: nothing beyond its own
// hits for a key seen once, a period's worth for a key seen over a period,
// and for a young key its count so far scaled to a period, at most 4×.
func TestLeaseSize(t *testing.T) {
	p := float64(20 * time.Second)
	sec := int64(time.Second)
	var once entry
	once.observe(5*sec, 1, p)
	if w := once.want(5*sec, p); w != 1 {
		t.Errorf("a key seen once wants %d, want 1", w)
	}
	// 10 hits in 4.5 s: younger than a quarter period, scaled by 4.
	var young entry
	for i := range int64(10) {
		young.observe(sec+i*sec/2, 1, p)
	}
	if w := young.want(sec+9*sec/2, p); w < 36 || w > 40 {
		t.Errorf("10 hits in 4.5 s want %d, want about 4 × 10", w)
	}
	// One hit a second for a minute: about 20 a period, unscaled.
	var old entry
	for i := range int64(60) {
		old.observe(sec+i*sec, 1, p)
	}
	if w := old.want(60*sec, p); w < 18 || w > 22 {
		t.Errorf("a key at 1/s for a minute wants %d, want about a period's 20", w)
	}
}

// TestEvictionsAreCounted fills the engine past MaxKeys with one-off keys:
// each new key in a full shard evicts one, Stats.Evicted counts every one
// (it is what ratelimitd_lease_evictions_total exports), and the keys
// tracked stay within the cap. A hot key evicted gives its leases back to
// the store, with the call of the key that took its place. It fails if
// evictions go uncounted, if the cap is not held, or if an evicted key's
// budget is lost.
func TestEvictionsAreCounted(t *testing.T) {
	c := clocktest.New(epoch)
	store := newStore(t, c)
	const maxKeys = 4 * numShards // 4 keys per shard
	e := newEngine(t, store, c, Options{MaxKeys: maxKeys})
	l := algo.Limit{Requests: 10_000, Window: time.Hour}
	const n = 5_000
	for i := range n {
		c.Advance(time.Microsecond)
		if d := decide(t, e, leasedReq("one-off-"+strconv.Itoa(i), l, 1))[0]; !d.Allowed {
			t.Fatalf("key %d refused: %+v", i, d)
		}
	}
	st := e.Stats()
	if st.Keys > maxKeys || st.Keys < maxKeys/2 {
		t.Errorf("%d keys tracked after %d one-off keys, want at most MaxKeys (%d) and most of it", st.Keys, n, maxKeys)
	}
	// Nothing else forgets a key in a manual engine that is not swept.
	if want := uint64(n - st.Keys); st.Evicted != want {
		t.Errorf("Stats.Evicted = %d, want %d (%d keys seen, %d tracked)", st.Evicted, want, n, st.Keys)
	}

	// A hot key holding leases, alone in its shard (MaxKeys 1: one key
	// per shard), is evicted by the next key of its shard.
	hot := newEngine(t, store, c, Options{MaxKeys: 1})
	warm(t, hot, c, "hot", l, 100)
	held := hot.Stats().Held
	if held == 0 {
		t.Fatal("the hot key holds nothing")
	}
	other := ""
	for i := 0; other == ""; i++ {
		if k := "other-" + strconv.Itoa(i); hot.shardOf(k) == hot.shardOf("hot") {
			other = k
		}
	}
	decide(t, hot, leasedReq(other, l, 1))
	if st := hot.Stats(); st.Evicted != 1 || st.Held != 0 || st.Given != uint64(held) {
		t.Errorf("after evicting the hot key holding %d: %+v; want 1 evicted, nothing held, %d given back", held, st, held)
	}
	if got := remaining(t, store, leasedReq("hot", l, 0)); got != l.Requests-100 {
		t.Errorf("the store has %d left for the evicted key, want %d: only the hits admitted count", got, l.Requests-100)
	}
}
