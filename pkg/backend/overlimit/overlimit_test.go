package overlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
)

// newClock returns a test clock at a whole minute.
func newClock() *clocktest.Clock { return clocktest.New(time.Unix(1_700_000_040, 0)) }

// counting is a spy around the real memory backend: it counts the calls
// that reach it.
type counting struct {
	*memory.Backend
	calls atomic.Int64
}

func (s *counting) Decide(ctx context.Context, reqs []algo.Request, out []algo.Decision) error {
	s.calls.Add(1)
	return s.Backend.Decide(ctx, reqs, out)
}

func newMemory(t testing.TB, clk *clocktest.Clock) *memory.Backend {
	b := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { b.Close() })
	return b
}

// fixture is a cache around a spied memory backend, and a plain memory
// backend to feed the same traffic, all on one clock.
type fixture struct {
	clk   *clocktest.Clock
	inner *counting
	cache *Cache
	plain *memory.Backend
}

func newFixture(t testing.TB, maxKeys int) *fixture {
	f := &fixture{clk: newClock()}
	f.inner = &counting{Backend: newMemory(t, f.clk)}
	f.plain = newMemory(t, f.clk)
	c, err := New(f.inner, Options{MaxKeys: maxKeys, Now: f.clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	f.cache = c
	return f
}

func decide(t testing.TB, b algo.Backend, reqs ...algo.Request) []algo.Decision {
	t.Helper()
	out := make([]algo.Decision, len(reqs))
	if err := b.Decide(context.Background(), reqs, out); err != nil {
		t.Fatalf("Decide: %v", err)
	}
	return out
}

// both decides reqs through the cache and the plain backend and returns
// both answers and whether the inner backend was called.
func (f *fixture) both(t testing.TB, reqs ...algo.Request) (cached, plain []algo.Decision, called bool) {
	t.Helper()
	before := f.inner.calls.Load()
	cached = decide(t, f.cache, reqs...)
	return cached, decide(t, f.plain, reqs...), f.inner.calls.Load() != before
}

// call decides reqs through the cache only and reports whether the inner
// backend was called.
func (f *fixture) call(t testing.TB, reqs ...algo.Request) ([]algo.Decision, bool) {
	t.Helper()
	before := f.inner.calls.Load()
	out := decide(t, f.cache, reqs...)
	return out, f.inner.calls.Load() != before
}

func req(key string, l algo.Limit, hits uint64) algo.Request {
	return algo.Request{Key: []byte(key), Limit: l, Hits: hits}
}

var perMinute3 = algo.Limit{Algorithm: algo.FixedWindow, Requests: 3, Window: time.Minute}

func TestNewValidates(t *testing.T) {
	clk := newClock()
	if _, err := New(nil, Options{MaxKeys: 1}); err == nil {
		t.Error("nil inner accepted")
	}
	if _, err := New(newMemory(t, clk), Options{}); err == nil {
		t.Error("MaxKeys 0 accepted")
	}
	if _, err := New(newMemory(t, clk), Options{MaxKeys: 1}); err != nil {
		t.Errorf("valid options refused: %v", err)
	}
}

func TestFixedWindowAnsweredLocally(t *testing.T) {
	f := newFixture(t, 100)
	f.clk.Advance(10 * time.Second)
	r := req("k", perMinute3, 1)
	for i := range 3 {
		if c, _, _ := f.both(t, r); !c[0].Allowed {
			t.Fatalf("hit %d refused", i+1)
		}
	}
	c, p, called := f.both(t, r)
	if c[0].Allowed || !called || c[0] != p[0] {
		t.Fatalf("4th hit: cached %+v, plain %+v, inner called %v", c[0], p[0], called)
	}
	// Until the window ends at 60 s, every answer is local and equal to the
	// plain backend's: a fixed window's figures do not move until then.
	for range 7 {
		f.clk.Advance(7 * time.Second)
		c, p, called := f.both(t, r)
		if called || c[0] != p[0] {
			t.Fatalf("at %v: cached %+v, plain %+v, inner called %v", f.clk.Now(), c[0], p[0], called)
		}
	}
	f.clk.Advance(time.Minute - 59*time.Second - time.Microsecond) // 1 µs before the end
	if c, p, called := f.both(t, r); called || c[0] != p[0] || c[0].RetryAfter != time.Microsecond {
		t.Fatalf("1 µs before the end: cached %+v, plain %+v, inner called %v", c[0], p[0], called)
	}
	f.clk.Advance(time.Microsecond) // the admissible instant
	c, p, called = f.both(t, r)
	if !called || !c[0].Allowed || c[0] != p[0] {
		t.Fatalf("at the window's end: cached %+v, plain %+v, inner called %v", c[0], p[0], called)
	}
	if f.cache.Len() != 0 {
		t.Errorf("Len = %d after the key was admitted, want 0", f.cache.Len())
	}
	if h, m := f.cache.Hits(), f.cache.Misses(); h != 8 || m != 5 {
		t.Errorf("Hits, Misses = %d, %d; want 8, 5", h, m)
	}
}

// A refused acquire of a concurrency slot is not remembered: a holder
// may give its slot back at any moment, long before the refusal's
// RetryAfter (the first holder's TTL).
func TestSlotsAreNeverCached(t *testing.T) {
	f := newFixture(t, 100)
	one := algo.Limit{Algorithm: algo.Concurrency, Requests: 1, Window: time.Minute}
	slot := func(op algo.Op, h uint64) algo.Request {
		return algo.Request{Key: []byte("k"), Limit: one, Hits: 1, Op: op, Holder: algo.Holder{h, h}}
	}
	if d, _ := f.call(t, slot(algo.OpAcquire, 1)); !d[0].Allowed || d[0].Taken != 1 {
		t.Fatalf("first acquire: %+v", d[0])
	}
	for range 2 {
		d, called := f.call(t, slot(algo.OpAcquire, 2))
		if d[0].Allowed || !called || d[0].RetryAfter != time.Minute {
			t.Fatalf("acquire of a held slot: %+v, inner called %v", d[0], called)
		}
	}
	if f.cache.Len() != 0 {
		t.Errorf("Len = %d after refused acquires, want 0", f.cache.Len())
	}
	if d, _ := f.call(t, slot(algo.OpRelease, 1)); d[0].Taken != 1 {
		t.Fatalf("release: %+v", d[0])
	}
	if d, called := f.call(t, slot(algo.OpAcquire, 2)); !d[0].Allowed || !called {
		t.Fatalf("acquire after the release: %+v, inner called %v", d[0], called)
	}
}

func TestTokenBucketMoreHitsLocalFewerHitsInner(t *testing.T) {
	f := newFixture(t, 100)
	// 10 tokens, one back per second.
	l := algo.Limit{Algorithm: algo.TokenBucket, Requests: 10, Window: 10 * time.Second}
	decide(t, f.cache, req("k", l, 8))
	d, called := f.call(t, req("k", l, 5))
	if d[0].Allowed || !called || d[0].RetryAfter != 3*time.Second {
		t.Fatalf("5 hits with 2 tokens: %+v (inner called %v), want refused for 3s", d[0], called)
	}
	f.clk.Advance(time.Second)
	for _, hits := range []uint64{5, 7} {
		d, called := f.call(t, req("k", l, hits))
		if d[0].Allowed || called || d[0].RetryAfter != 2*time.Second {
			t.Errorf("%d hits: %+v (inner called %v), want a local refusal for 2s", hits, d[0], called)
		}
	}
	// One hit may fit before five do: it goes to the inner backend.
	d, called = f.call(t, req("k", l, 1))
	if !d[0].Allowed || !called {
		t.Errorf("1 hit: %+v (inner called %v), want admitted by the inner backend", d[0], called)
	}
}

func TestChangedLimitBypasses(t *testing.T) {
	f := newFixture(t, 100)
	for range 4 {
		decide(t, f.cache, req("k", perMinute3, 1))
	}
	if _, called := f.call(t, req("k", perMinute3, 1)); called {
		t.Fatal("refusal not cached")
	}
	raised := perMinute3
	raised.Requests = 5
	d, called := f.call(t, req("k", raised, 1))
	if !called || !d[0].Allowed {
		t.Errorf("after N rose: %+v (inner called %v), want admitted by the inner backend", d[0], called)
	}
}

func TestMixedBatchGoesWhole(t *testing.T) {
	f := newFixture(t, 100)
	for range 4 {
		f.both(t, req("a", perMinute3, 1))
	}
	batch := []algo.Request{req("a", perMinute3, 1), req("b", perMinute3, 1)}
	c, p, called := f.both(t, batch...)
	if !called {
		t.Fatal("a batch with an uncached key was answered locally")
	}
	if c[0].Allowed || !c[1].Allowed || c[0] != p[0] || c[1] != p[1] {
		t.Fatalf("cached %+v, plain %+v", c, p)
	}
	// The batch was refused, so b consumed nothing.
	if d := decide(t, f.cache, req("b", perMinute3, 0)); d[0].Remaining != 3 {
		t.Errorf("b remaining %d after a refused batch, want 3", d[0].Remaining)
	}
}

func TestRepeatedKeyInBatch(t *testing.T) {
	f := newFixture(t, 100)
	l := algo.Limit{Requests: 5, Window: time.Minute}
	// The second request is refused only on top of the first one's hits,
	// which the refused batch never consumed.
	d := decide(t, f.cache, req("k", l, 3), req("k", l, 3))
	if d[1].Allowed {
		t.Fatalf("batch %+v, want the second request refused", d)
	}
	if d, called := f.call(t, req("k", l, 3)); !called || !d[0].Allowed {
		t.Errorf("3 hits alone: %+v (inner called %v), want admitted by the inner backend", d[0], called)
	}
}

func TestPeeksGoToInner(t *testing.T) {
	f := newFixture(t, 100)
	for range 4 {
		decide(t, f.cache, req("k", perMinute3, 1))
	}
	d, called := f.call(t, req("k", perMinute3, 0))
	if !called || !d[0].Allowed || d[0].Remaining != 0 {
		t.Errorf("peek: %+v (inner called %v), want answered by the inner backend", d[0], called)
	}
	if _, called := f.call(t, req("k", perMinute3, 1)); called {
		t.Error("a peek dropped the cached refusal")
	}
}

func TestShadowFollowsSameRules(t *testing.T) {
	f := newFixture(t, 100)
	shadow := req("s", perMinute3, 2)
	shadow.Shadow = true
	for range 2 {
		f.both(t, shadow)
	}
	if _, called := f.call(t, shadow); called {
		t.Error("a refused shadow request was not cached")
	}
	// A batch with an uncached key goes to the inner backend, which admits
	// it: a refused shadow request refuses nothing else.
	c, p, called := f.both(t, shadow, req("b", perMinute3, 1))
	if !called || c[0].Allowed || !c[1].Allowed || c[0] != p[0] || c[1] != p[1] {
		t.Fatalf("cached %+v, plain %+v, inner called %v", c, p, called)
	}
	if d := decide(t, f.cache, req("b", perMinute3, 0)); d[0].Remaining != 2 {
		t.Errorf("b remaining %d, want 2: the batch was admitted", d[0].Remaining)
	}
}

func TestMaxKeysBound(t *testing.T) {
	const maxKeys = 16
	f := newFixture(t, maxKeys)
	one := algo.Limit{Requests: 1, Window: time.Second}
	for i := range 1000 {
		key := "k" + strconv.Itoa(i)
		decide(t, f.cache, req(key, one, 1))
		if d := decide(t, f.cache, req(key, one, 1)); d[0].Allowed {
			t.Fatalf("%s: second hit admitted", key)
		}
		if n := f.cache.Len(); n > maxKeys || n == 0 {
			t.Fatalf("after %d keys Len = %d, want 1..%d", i+1, n, maxKeys)
		}
		f.clk.Advance(time.Duration(rand.IntN(100)) * time.Millisecond)
	}
}

func TestInnerErrorPassesThrough(t *testing.T) {
	f := newFixture(t, 100)
	for range 4 {
		decide(t, f.cache, req("a", perMinute3, 1))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// out looks like refusals, as the cache must not read it.
	out := []algo.Decision{{RetryAfter: time.Second}, {RetryAfter: time.Second}}
	err := f.cache.Decide(ctx, []algo.Request{req("a", perMinute3, 1), req("b", perMinute3, 1)}, out)
	if err != context.Canceled {
		t.Fatalf("err = %v, want context.Canceled unchanged", err)
	}
	if f.cache.Len() != 1 {
		t.Errorf("Len = %d after an inner error, want 1 (a only)", f.cache.Len())
	}
	if _, called := f.call(t, req("a", perMinute3, 1)); called {
		t.Error("an inner error dropped a's entry")
	}
	if _, called := f.call(t, req("b", perMinute3, 1)); !called {
		t.Error("an inner error cached b")
	}
}

// randomLimit returns a small limit of a random algorithm, so that random
// traffic reaches its boundaries often.
func randomLimit(rng *rand.Rand) algo.Limit {
	algs := algo.Algorithms()
	windows := []time.Duration{time.Second, 3 * time.Second, 10 * time.Millisecond}
	l := algo.Limit{Algorithm: algs[rng.IntN(len(algs))], Requests: 1 + rng.Uint64N(8), Window: windows[rng.IntN(len(windows))]}
	if l.Algorithm.UsesBurst() && rng.IntN(2) == 0 {
		l.Burst = 1 + rng.Uint64N(2*l.Requests)
	}
	return l
}

// TestMatchesBackend feeds random traffic to the cache and to a plain
// memory backend on the same clock. Both must agree on every Allowed.
//
// When the inner backend is called, the cache returns its answer as is, so
// the decisions are equal. When the cache answers locally, only what a
// refusal guarantees is asserted: nothing was consumed since the refusal
// was cached (an admission forgets the entry), so the instant of the full
// reset is unchanged and ResetAfter is equal; Remaining was read at the
// refusal and refills since can only have raised it; RetryAfter is the
// cached hits' and more hits may need longer, so it is a lower bound.
func TestMatchesBackend(t *testing.T) {
	local, remote := 0, 0
	for run := range 30 {
		rng := rand.New(rand.NewPCG(uint64(run), 11))
		maxKeys := 2 + run%3 // 2 and 3 evict, 4 holds every key
		f := newFixture(t, maxKeys)
		keys := []string{"a", "b", "c", "d"}
		// A key of a window algorithm switches between two values of N now
		// and then, as rule reloads would. Package key puts the algorithm
		// and the window in the key, so nothing else changes under one key.
		// Bucket algorithms keep their limit: the memory backend expires a
		// bucket's state when it would be full under the limit that wrote
		// it, so after N or Burst is lowered it forgets the state before
		// the RetryAfter it reported under the new limit, and the cache
		// refuses (as reported) until then. The cache is right to trust
		// RetryAfter; the comparison would only show the backend's quirk.
		//
		// Some keys count their hits whatever the answer (Request.Count):
		// the cache answers those of a window locally, leaving the hits
		// uncounted, which changes no decision while the limit stays; they
		// keep their limit, since under a raised N the uncounted hits would
		// be missed.
		limits := make(map[string][2]algo.Limit)
		counts := make(map[string]bool)
		for _, k := range keys {
			l := randomLimit(rng)
			other := l
			counts[k] = rng.IntN(3) == 0
			if !l.Algorithm.UsesBurst() && !counts[k] {
				other.Requests = 1 + rng.Uint64N(8)
			}
			limits[k] = [2]algo.Limit{l, other}
		}
		for step := range 600 {
			switch rng.IntN(8) {
			case 0:
			case 1:
				f.clk.Advance(time.Duration(rng.Int64N(int64(4 * time.Second))))
			default:
				f.clk.Advance(time.Duration(rng.Int64N(int64(50 * time.Millisecond))))
			}
			size := 1
			if rng.IntN(3) == 0 {
				size += rng.IntN(3)
			}
			reqs := make([]algo.Request, size)
			for i := range reqs {
				k := keys[rng.IntN(len(keys))]
				l := limits[k][0]
				if rng.IntN(10) == 0 {
					l = limits[k][1]
				}
				reqs[i] = algo.Request{Key: []byte(k), Limit: l, Hits: rng.Uint64N(l.Requests + 3), Shadow: rng.IntN(6) == 0, Count: counts[k]}
			}
			c, p, called := f.both(t, reqs...)
			if called {
				remote++
			} else {
				local++
			}
			for i := range reqs {
				where := fmt.Sprintf("run %d step %d req %d %s %+v hits %d count %v (inner called %v)", run, step, i, reqs[i].Key, reqs[i].Limit, reqs[i].Hits, reqs[i].Count, called)
				switch {
				case c[i].Allowed != p[i].Allowed:
					t.Fatalf("%s: cached %+v, plain %+v", where, c[i], p[i])
				case called && c[i] != p[i]:
					t.Fatalf("%s: cached %+v, plain %+v", where, c[i], p[i])
				case !called && (c[i].ResetAfter != p[i].ResetAfter || c[i].Remaining > p[i].Remaining ||
					c[i].RetryAfter > p[i].RetryAfter || c[i].Wait != p[i].Wait):
					t.Fatalf("%s: local %+v, plain %+v", where, c[i], p[i])
				}
			}
			if f.cache.Len() > maxKeys {
				t.Fatalf("Len %d > MaxKeys %d", f.cache.Len(), maxKeys)
			}
		}
	}
	t.Logf("%d batches answered locally, %d by the inner backend", local, remote)
	if local < 500 { // a guard that the local path is exercised at all
		t.Errorf("only %d of %d batches answered locally", local, local+remote)
	}
}

// TestConcurrent hammers the cache from several goroutines while the clock
// stands still: each key admits exactly its capacity, whichever goroutine
// asks, and the cache never holds more than MaxKeys keys.
func TestConcurrent(t *testing.T) {
	const (
		maxKeys    = 5
		keys       = 8
		goroutines = 6
		perG       = 300
		n          = 20
	)
	f := newFixture(t, maxKeys)
	algs := algo.Algorithms()
	for phase := range 3 {
		var admitted [keys]atomic.Uint64
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				out := make([]algo.Decision, 1)
				for i := range perG {
					k := (g + i) % keys
					r := algo.Request{
						Key:   []byte(fmt.Sprintf("p%d-k%d", phase, k)),
						Limit: algo.Limit{Algorithm: algs[k%len(algs)], Requests: n, Window: time.Minute},
						Hits:  1,
					}
					if err := f.cache.Decide(context.Background(), []algo.Request{r}, out); err != nil {
						t.Error(err)
						return
					}
					if out[0].Allowed {
						admitted[k].Add(1)
					}
					if l := f.cache.Len(); l > maxKeys {
						t.Errorf("Len %d > MaxKeys %d", l, maxKeys)
					}
				}
			})
		}
		wg.Wait()
		for k := range keys {
			if got := admitted[k].Load(); got != n {
				t.Errorf("phase %d key %d: %d admitted, want %d", phase, k, got, n)
			}
		}
		f.clk.Advance(time.Hour)
	}
	if f.cache.Hits() == 0 {
		t.Error("no batch was answered locally")
	}
}

func BenchmarkCachedRefusal(b *testing.B) {
	f := newFixture(b, 1000)
	r := []algo.Request{req("some/descriptor/key", perMinute3, 1)}
	for range 4 {
		decide(b, f.cache, r...)
	}
	out := make([]algo.Decision, 1)
	calls := f.inner.calls.Load()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := f.cache.Decide(ctx, r, out); err != nil || out[0].Allowed {
			b.Fatal(err, out[0])
		}
	}
	if f.inner.calls.Load() != calls {
		b.Fatal("the inner backend was called")
	}
}

// BenchmarkUncachedRefusal is the same refusal decided by the memory
// backend itself, for comparison.
func BenchmarkUncachedRefusal(b *testing.B) {
	f := newFixture(b, 1000)
	r := []algo.Request{req("some/descriptor/key", perMinute3, 1)}
	for range 4 {
		decide(b, f.plain, r...)
	}
	out := make([]algo.Decision, 1)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := f.plain.Decide(ctx, r, out); err != nil || out[0].Allowed {
			b.Fatal(err, out[0])
		}
	}
}
