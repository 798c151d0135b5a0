package memory

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/footprint"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// newClock returns a test clock at a whole minute.
func newClock() *clocktest.Clock { return clocktest.New(time.Unix(1_700_000_040, 0)) }

func newTestBackend(t testing.TB, opts Options) (*Backend, *clocktest.Clock) {
	c := newClock()
	opts.Now = c.Now
	if opts.SweepInterval == 0 {
		opts.SweepInterval = -1
	}
	b := New(opts)
	t.Cleanup(func() { b.Close() })
	return b, c
}

func req(key string, n uint64, hits uint64) algo.Request {
	return algo.Request{Key: []byte(key), Limit: algo.Limit{Requests: n, Window: time.Minute}, Hits: hits}
}

func decide(t *testing.T, b *Backend, reqs ...algo.Request) []algo.Decision {
	t.Helper()
	out := make([]algo.Decision, len(reqs))
	if err := b.Decide(context.Background(), reqs, out); err != nil {
		t.Fatalf("Decide: %v", err)
	}
	return out
}

// remaining peeks at key's remaining count under a limit of n per minute.
func remaining(t *testing.T, b *Backend, key string, n uint64) uint64 {
	t.Helper()
	return decide(t, b, req(key, n, 0))[0].Remaining
}

func TestSingleRequestCounts(t *testing.T) {
	b, _ := newTestBackend(t, Options{})
	for i := range 3 {
		d := decide(t, b, req("k", 3, 1))[0]
		if !d.Allowed || d.Remaining != uint64(2-i) {
			t.Fatalf("hit %d: %+v", i, d)
		}
	}
	if d := decide(t, b, req("k", 3, 1))[0]; d.Allowed || d.RetryAfter <= 0 {
		t.Fatalf("4th hit: %+v, want refused with a retry-after", d)
	}
	if got := remaining(t, b, "other", 3); got != 3 {
		t.Fatalf("other key remaining = %d, want 3 (keys are independent)", got)
	}
}

func TestBatchIsAllOrNothing(t *testing.T) {
	b, _ := newTestBackend(t, Options{})
	decide(t, b, req("full", 1, 1))

	out := decide(t, b, req("free", 5, 2), req("full", 1, 1))
	if !out[0].Allowed || out[0].Remaining != 5 {
		t.Errorf("within-limit request in a refused batch: %+v, want allowed reporting 5 remaining (nothing taken)", out[0])
	}
	if out[1].Allowed {
		t.Errorf("over-limit request: %+v, want refused", out[1])
	}
	if got := remaining(t, b, "free", 5); got != 5 {
		t.Fatalf("refused batch consumed from another key: remaining %d, want 5", got)
	}

	out = decide(t, b, req("free", 5, 2), req("also", 2, 2))
	if !out[0].Allowed || !out[1].Allowed || out[0].Remaining != 3 || out[1].Remaining != 0 {
		t.Fatalf("admitted batch: %+v", out)
	}
	if got := remaining(t, b, "free", 5); got != 3 {
		t.Fatalf("admitted batch: free remaining %d, want 3", got)
	}
}

func TestShadowRefusalDoesNotRefuseBatch(t *testing.T) {
	b, _ := newTestBackend(t, Options{})
	decide(t, b, req("shadow", 1, 1))

	sh := req("shadow", 1, 1)
	sh.Shadow = true
	out := decide(t, b, req("enforced", 5, 1), sh)
	if !out[0].Allowed || out[0].Remaining != 4 {
		t.Errorf("enforced: %+v, want allowed with 4 remaining", out[0])
	}
	if out[1].Allowed {
		t.Errorf("shadow: %+v, want its own decision refused", out[1])
	}
	if got := remaining(t, b, "enforced", 5); got != 4 {
		t.Fatalf("enforced remaining %d, want 4: a shadow refusal must not refuse the batch", got)
	}

	// A shadow request within its limit is consumed with the batch.
	sh = req("shadow2", 3, 1)
	sh.Shadow = true
	decide(t, b, req("enforced", 5, 1), sh)
	if got := remaining(t, b, "shadow2", 3); got != 2 {
		t.Fatalf("shadow within limit: remaining %d, want 2", got)
	}
	// ...and not consumed when the batch is refused.
	decide(t, b, req("full2", 0, 1), sh)
	if got := remaining(t, b, "shadow2", 3); got != 2 {
		t.Fatalf("shadow in refused batch: remaining %d, want 2", got)
	}
}

func TestSameKeyTwiceInOneBatch(t *testing.T) {
	b, _ := newTestBackend(t, Options{})
	out := decide(t, b, req("k", 4, 2), req("k", 4, 2))
	if !out[0].Allowed || !out[1].Allowed || out[0].Remaining != 2 || out[1].Remaining != 0 {
		t.Fatalf("4 of 4: %+v", out)
	}

	out = decide(t, b, req("j", 3, 2), req("j", 3, 2))
	if !out[0].Allowed || out[1].Allowed {
		t.Fatalf("2+2 of 3: %+v, want the second refused", out)
	}
	if out[0].Remaining != 3 {
		t.Errorf("first request of refused batch reports %d remaining, want 3 (the untouched state)", out[0].Remaining)
	}
	if got := remaining(t, b, "j", 3); got != 3 {
		t.Fatalf("refused batch consumed: remaining %d, want 3", got)
	}
}

func TestRefusedBatchReportsTheStoredState(t *testing.T) {
	b, _ := newTestBackend(t, Options{})
	// Two requests for one key: 2 + 2 hits do not fit a limit of 3.
	out := decide(t, b, req("k", 3, 2), req("k", 3, 2))
	if out[1].Allowed || out[1].RetryAfter <= 0 {
		t.Fatalf("second request %+v, want refused with a retry-after", out[1])
	}
	for i, d := range out {
		if d.Remaining != 3 || d.ResetAfter != 0 {
			t.Errorf("request %d reports %+v; nothing was counted, so 3 remain and nothing resets", i, d)
		}
	}
}

func TestBatchNeverEvictsItsOwnKeys(t *testing.T) {
	b, _ := newTestBackend(t, Options{MaxKeys: 2, Shards: 1})
	long := req("X", 5, 1)
	long.Limit.Window = time.Hour
	decide(t, b, long)
	// The shard holds X and has room for one more; A and C both need a
	// slot. Making room for C must not evict A, stored a moment before.
	out := decide(t, b, req("A", 1, 1), req("C", 1, 1))
	if !out[0].Allowed || !out[1].Allowed {
		t.Fatalf("batch %+v, want both admitted", out)
	}
	for _, k := range []string{"A", "C"} {
		if d := decide(t, b, req(k, 1, 1))[0]; d.Allowed {
			t.Errorf("%s was admitted again: the batch's own count was evicted", k)
		}
	}
	if b.Evictions() != 1 {
		t.Errorf("Evictions = %d, want 1 (X)", b.Evictions())
	}
}

func TestMaxKeysIsAnUpperBound(t *testing.T) {
	for _, maxKeys := range []int{1, 100, 1000} {
		b, _ := newTestBackend(t, Options{MaxKeys: maxKeys})
		for i := range 3 * maxKeys {
			decide(t, b, req(strconv.Itoa(i), 5, 1))
		}
		if n := b.Len(); n > maxKeys || n == 0 {
			t.Errorf("MaxKeys %d: %d keys tracked", maxKeys, n)
		}
	}
}

func TestLargeBatch(t *testing.T) {
	b, _ := newTestBackend(t, Options{Shards: 4})
	var reqs []algo.Request
	for i := range 3 * stackBatch {
		reqs = append(reqs, req("k"+strconv.Itoa(i%(2*stackBatch)), 2, 1))
	}
	out := decide(t, b, reqs...)
	for i, d := range out {
		if !d.Allowed {
			t.Fatalf("request %d refused: %+v", i, d)
		}
	}
	// Keys 0..15 were hit twice and are full: one more batch touching one
	// of them is refused whole.
	out = decide(t, b, req("k20", 2, 1), req("k3", 2, 1))
	if out[1].Allowed || remaining(t, b, "k20", 2) != 1 {
		t.Fatalf("refused large-key batch: %+v, k20 remaining %d", out, remaining(t, b, "k20", 2))
	}
}

func TestExpiredStateIsForgottenAndSwept(t *testing.T) {
	b, c := newTestBackend(t, Options{})
	decide(t, b, req("a", 1, 1), req("b", 1, 1))
	if b.Len() != 2 {
		t.Fatalf("Len = %d, want 2", b.Len())
	}
	c.Advance(time.Minute)
	if d := decide(t, b, req("a", 1, 1))[0]; !d.Allowed {
		t.Fatalf("after the window: %+v, want allowed", d)
	}
	b.Sweep()
	if b.Len() != 1 {
		t.Fatalf("after Sweep: Len = %d, want 1 (only a's new window)", b.Len())
	}
	c.Advance(time.Minute)
	b.Sweep()
	if b.Len() != 0 {
		t.Fatalf("after Sweep: Len = %d, want 0", b.Len())
	}
}

func TestBackgroundSweeper(t *testing.T) {
	c := newClock()
	b := New(Options{Now: c.Now, SweepInterval: time.Millisecond})
	defer b.Close()
	out := make([]algo.Decision, 1)
	if err := b.Decide(context.Background(), []algo.Request{req("a", 1, 1)}, out); err != nil {
		t.Fatal(err)
	}
	c.Advance(time.Hour)
	deadline := time.Now().Add(10 * time.Second)
	for b.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the sweeper did not remove an expired entry within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestMaxKeysBoundsMemory(t *testing.T) {
	b, c := newTestBackend(t, Options{MaxKeys: 8, Shards: 1})
	for i := range 8 {
		decide(t, b, req(fmt.Sprint("old", i), 5, 1))
	}
	c.Advance(time.Minute) // every "old" entry expires
	for i := range 8 {
		decide(t, b, req(fmt.Sprint("new", i), 5, 1))
	}
	if b.Len() != 8 || b.Evictions() != 0 {
		t.Fatalf("Len %d, Evictions %d: want 8 and 0 (expired entries make room first)", b.Len(), b.Evictions())
	}
	for i := range 100 {
		decide(t, b, req(fmt.Sprint("more", i), 5, 1))
	}
	if b.Len() != 8 {
		t.Fatalf("Len = %d, want the bound 8", b.Len())
	}
	if b.Evictions() != 100 {
		t.Fatalf("Evictions = %d, want 100", b.Evictions())
	}
}

func TestCancelledContextConsumesNothing(t *testing.T) {
	b, _ := newTestBackend(t, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out := make([]algo.Decision, 1)
	if err := b.Decide(ctx, []algo.Request{req("k", 1, 1)}, out); err != context.Canceled {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if got := remaining(t, b, "k", 1); got != 1 {
		t.Fatalf("remaining = %d, want 1", got)
	}
	if err := b.Decide(context.Background(), []algo.Request{req("k", 1, 1)}, nil); err == nil {
		t.Fatal("Decide with a short out slice did not fail")
	}
}

// TestConcurrentDecisionsAreExact hammers shared keys from many goroutines,
// single and in batches that lock shards in opposite orders, and checks that
// exactly the limit is admitted: no lost updates, no deadlock.
func TestConcurrentDecisionsAreExact(t *testing.T) {
	b, _ := newTestBackend(t, Options{Shards: 64})
	const limit = 1000
	var admittedA, admittedB atomic.Int64
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			out := make([]algo.Decision, 2)
			for range 200 {
				var reqs []algo.Request
				switch g % 3 {
				case 0:
					reqs = []algo.Request{req("A", limit, 1)}
				case 1:
					reqs = []algo.Request{req("A", limit, 1), req("B", limit, 1)}
				case 2:
					reqs = []algo.Request{req("B", limit, 1), req("A", limit, 1)}
				}
				if err := b.Decide(context.Background(), reqs, out); err != nil {
					t.Error(err)
					return
				}
				admitted := true
				for i := range reqs {
					admitted = admitted && out[i].Allowed
				}
				if !admitted {
					continue
				}
				for _, r := range reqs {
					if string(r.Key) == "A" {
						admittedA.Add(1)
					} else {
						admittedB.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	// 32 goroutines × 200 tries ask far more than 1000 of A.
	if admittedA.Load() != limit {
		t.Errorf("A admitted %d, want exactly %d", admittedA.Load(), limit)
	}
	if got := limit - remaining(t, b, "B", limit); got != uint64(admittedB.Load()) {
		t.Errorf("B counted %d, but %d were admitted", got, admittedB.Load())
	}
}

func BenchmarkDecide(b *testing.B) {
	limit := algo.Limit{Requests: 1 << 40, Window: time.Hour}
	b.Run("one_key_parallel", func(b *testing.B) {
		be := New(Options{})
		defer be.Close()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			reqs := []algo.Request{{Key: []byte("domain/key=value"), Limit: limit, Hits: 1}}
			out := make([]algo.Decision, 1)
			for pb.Next() {
				_ = be.Decide(context.Background(), reqs, out)
			}
		})
	})
	b.Run("10k_keys_parallel", func(b *testing.B) {
		be := New(Options{})
		defer be.Close()
		keys := make([][]byte, 10_000)
		for i := range keys {
			keys[i] = []byte("domain/user=" + strconv.Itoa(i))
		}
		var seq atomic.Uint64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := seq.Add(1_000_003)
			reqs := []algo.Request{{Limit: limit, Hits: 1}}
			out := make([]algo.Decision, 1)
			for pb.Next() {
				i++
				reqs[0].Key = keys[i%uint64(len(keys))]
				_ = be.Decide(context.Background(), reqs, out)
			}
		})
	})
	b.Run("batch_of_3_parallel", func(b *testing.B) {
		be := New(Options{})
		defer be.Close()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			reqs := []algo.Request{
				{Key: []byte("d/a=1"), Limit: limit, Hits: 1},
				{Key: []byte("d/b=2"), Limit: limit, Hits: 1},
				{Key: []byte("d/c=3"), Limit: limit, Hits: 1},
			}
			out := make([]algo.Decision, 3)
			for pb.Next() {
				_ = be.Decide(context.Background(), reqs, out)
			}
		})
	})
}

// BenchmarkFootprint fills the memory backend with keys shaped like real
// ones (domain, one entry, limit: about 40 bytes) and reports what each
// costs (internal/footprint): B/key of live heap (after a collection: the
// key, the entry, the map slot); RSS-B/key, the resident set grown per
// key once filled (Linux); and cycled-RSS-B/key, once garbage has run the
// heap through the collector's target (GOGC, GOMEMLIMIT) as a serving
// process's calls do: the figure to size a container by. Each size is
// filled from a baseline with the free memory returned to the system.
// docs/performance.md gives the numbers and this command:
//
//	go test -run '^$' -bench Footprint -benchtime 1x -count 5 ./pkg/backend/memory
func BenchmarkFootprint(b *testing.B) {
	for _, keys := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			for b.Loop() {
				be := New(Options{SweepInterval: -1, MaxKeys: 2 * keys}) // room in every shard
				reqs := []algo.Request{{Limit: algo.Limit{Requests: 100, Window: time.Hour}, Hits: 1}}
				out := make([]algo.Decision, 1)
				before := footprint.Baseline()
				for i := range keys {
					reqs[0].Key = fmt.Appendf(reqs[0].Key[:0], "5:posts=7:user_id%d:%d|fixed_window/1s", len(strconv.Itoa(i)), i)
					_ = be.Decide(context.Background(), reqs, out)
				}
				filled := footprint.Take()
				footprint.Cycle()
				cycled := footprint.Take()
				if be.Len() != keys {
					b.Fatalf("tracked %d keys, want %d", be.Len(), keys)
				}
				footprint.Report(b, before, filled, cycled, keys)
				runtime.KeepAlive(be)
			}
		})
	}
}

// TestReset forgets a key: its next decision starts afresh.
func TestReset(t *testing.T) {
	b := New(Options{SweepInterval: -1})
	defer b.Close()
	ctx := context.Background()
	l := algo.Limit{Algorithm: algo.TokenBucket, Requests: 1, Window: time.Hour}
	out := make([]algo.Decision, 1)
	decide := func(k string) bool {
		if err := b.Decide(ctx, []algo.Request{{Key: []byte(k), Limit: l, Hits: 1}}, out); err != nil {
			t.Fatal(err)
		}
		return out[0].Allowed
	}
	if !decide("a") || decide("a") || !decide("b") {
		t.Fatal("a token bucket of 1 admitted the wrong hits")
	}
	if err := b.Reset(ctx, []algo.Request{{Key: []byte("a")}}); err != nil {
		t.Fatal(err)
	}
	if !decide("a") || decide("b") {
		t.Error("after resetting a, a must start afresh and b keep its count")
	}
}

// TestLargeBatchMatchesOneByOne: an admitted batch larger than stackBatch,
// its keys repeated, with takes and gives of leases, decides as the same
// requests one at a time do, and leaves the same states.
func TestLargeBatchMatchesOneByOne(t *testing.T) {
	batched, clk := newTestBackend(t, Options{})
	single := New(Options{Now: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { single.Close() })
	lim := algo.Limit{Algorithm: algo.TokenBucket, Requests: 1000, Window: time.Millisecond, Burst: 1000}
	var marks [7]int64
	for round := range 5 {
		var reqs []algo.Request
		for i := range 60 {
			k := []byte("k" + strconv.Itoa(i%7))
			switch i % 3 {
			case 0:
				reqs = append(reqs, algo.Request{Key: k, Limit: lim, Op: algo.OpTake, Lease: algo.Lease{Max: 50, Share: 1, TTL: 3 * time.Second}})
			case 1:
				reqs = append(reqs, algo.Request{Key: k, Limit: lim, Op: algo.OpGive, Hits: 20, Lease: algo.Lease{Mark: marks[i%7]}})
			default:
				reqs = append(reqs, algo.Request{Key: k, Limit: lim, Hits: 1})
			}
		}
		got := make([]algo.Decision, len(reqs))
		if err := batched.Decide(context.Background(), reqs, got); err != nil {
			t.Fatal(err)
		}
		for i := range reqs {
			want := make([]algo.Decision, 1)
			if err := single.Decide(context.Background(), reqs[i:i+1], want); err != nil {
				t.Fatal(err)
			}
			if got[i] != want[0] {
				t.Fatalf("round %d, request %d: batched %+v, one by one %+v", round, i, got[i], want[0])
			}
			if got[i].Mark != 0 {
				marks[i%7] = got[i].Mark
			}
		}
		clk.Advance(time.Second)
	}
	if batched.Len() != single.Len() {
		t.Fatalf("%d keys batched, %d one by one", batched.Len(), single.Len())
	}
}
