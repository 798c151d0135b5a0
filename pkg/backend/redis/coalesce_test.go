package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
)

// TestBatchesAgree decides several random batches in one call of the
// decision (functions and scripts) and wants exactly what the memory
// backend decides for the same batches one after another: each batch all
// or nothing on its own, each seeing the ones before it.
func TestBatchesAgree(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	for _, scripts := range []bool{false, true} {
		t.Run(map[bool]string{false: "functions", true: "scripts"}[scripts], func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, uint64(len(t.Name()))))
			lua := testBackend(t, c)
			lua.scripts.Store(scripts)
			now := algotest.Epoch
			mem := memory.New(memory.Options{Now: func() time.Time { return now }, SweepInterval: -1})
			defer mem.Close()
			limits := make([]algo.Limit, 6)
			for i := range limits {
				limits[i] = randomLimit(rng, algo.Algorithms()[rng.IntN(len(algo.Algorithms()))])
			}
			for step := range 200 {
				now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
				batches := make([][]algo.Request, 1+rng.IntN(5))
				var keys []string
				for bi := range batches {
					batches[bi] = make([]algo.Request, 1+rng.IntN(3))
					for i := range batches[bi] {
						k := rng.IntN(len(limits))
						batches[bi][i] = algo.Request{
							Key:    []byte(fmt.Sprintf("k%d|%s", k, limits[k].Algorithm)),
							Limit:  limits[k],
							Hits:   rng.Uint64N(4),
							Shadow: rng.IntN(6) == 0,
							Peek:   rng.IntN(8) == 0,
						}
						keys = append(keys, lua.opts.Prefix+string(batches[bi][i].Key))
					}
				}
				args := algo.AppendBatchesArgs(nil, now, lua.minTTL, time.Time{}, batches)
				reply, err := lua.run(ctx, lua.client, keys, args)
				if err != nil {
					t.Fatal(err)
				}
				got := make([][]algo.Decision, len(batches))
				for bi := range batches {
					got[bi] = make([]algo.Decision, len(batches[bi]))
				}
				if err := algo.ParseBatchesReply(reply, got, nil); err != nil {
					t.Fatal(err)
				}
				for bi, b := range batches {
					want := make([]algo.Decision, len(b))
					if err := mem.Decide(ctx, b, want); err != nil {
						t.Fatal(err)
					}
					for i := range b {
						if got[bi][i] != want[i] {
							t.Fatalf("step %d, batch %d of %d, request %d: Lua %s, Go %s",
								step, bi, len(batches), i, algotest.Format(got[bi][i]), algotest.Format(want[i]))
						}
					}
				}
			}
		})
	}
}

// TestCoalescing decides 400 calls from 50 goroutines through one
// coalescing worker: exactly the limit is admitted, and the server saw
// fewer calls than the backend was asked (the waiting calls shared them).
func TestCoalescing(t *testing.T) {
	srv := redistest.Start(t)
	b := dial(t, Config{URL: srv.URL}, Options{Prefix: uniquePrefix(t), Coalesce: 1})
	admin := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer admin.Close()
	ctx := context.Background()
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	l := algo.Limit{Algorithm: algo.GCRA, Requests: 100, Window: time.Hour}
	other := algo.Limit{Algorithm: algo.SlidingWindowLog, Requests: 1000, Window: time.Hour}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]algo.Decision, 2)
			for range 8 {
				// Each call is a batch of two: the shared key, and a key of
				// the goroutine's own that always fits.
				reqs := []algo.Request{
					{Key: descriptorKey("api", "shared", "x", l), Limit: l, Hits: 1},
					{Key: descriptorKey("api", "own", fmt.Sprint(g), other), Limit: other, Hits: 1},
				}
				if err := b.Decide(ctx, reqs, out); err != nil {
					t.Error(err)
					return
				}
				if out[0].Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := admitted.Load(); n != 100 {
		t.Errorf("admitted %d of 400 through the coalescer, want exactly 100", n)
	}
	calls := redistest.CommandCalls(t, admin, "fcall")
	if calls >= 400 {
		t.Errorf("400 decisions cost %d FCALL; the coalescer shared none", calls)
	}
	t.Logf("400 decisions of 50 goroutines through 1 worker: %d FCALL", calls)
	// A refused batch consumed nothing of its own key: 100 refusals left
	// each goroutine's own log with only its admitted hits.
	out := make([]algo.Decision, 1)
	var total uint64
	for g := range 50 {
		if err := b.Decide(ctx, []algo.Request{{Key: descriptorKey("api", "own", fmt.Sprint(g), other), Limit: other}}, out); err != nil {
			t.Fatal(err)
		}
		total += 1000 - out[0].Remaining
	}
	if total != 100 {
		t.Errorf("the goroutines' own keys hold %d hits, want the 100 of the admitted batches", total)
	}
}

// TestWindow: a coalesced call carries the waiting jobs whose deadlines
// fall within lateGrace of the earliest, in deadline order, so that no
// caller waits for its call past its deadline by more than lateGrace;
// jobs without a deadline go together, last. Shown failing against a
// window of every waiting job.
func TestWindow(t *testing.T) {
	now := time.Now()
	at := func(d time.Duration) *job { return &job{n: 1, deadline: now.Add(d)} }
	none := &job{n: 1}
	jobs := []*job{at(20 * time.Millisecond), none, at(time.Millisecond), at(3 * time.Millisecond), at(lateGrace + 2*time.Millisecond)}
	if k := window(jobs); k != 2 || jobs[0].deadline != now.Add(time.Millisecond) || jobs[1].deadline != now.Add(3*time.Millisecond) {
		t.Fatalf("window of %d: the first %d of the jobs ordered by deadline, want the 2 within %v of the earliest", len(jobs), k, lateGrace)
	}
	if jobs[len(jobs)-1] != none {
		t.Error("a job without a deadline is not last")
	}
	rest := jobs[2:]
	if k := window(rest); k != 1 {
		t.Errorf("window of the rest: %d, want the one within %v of %v", k, lateGrace, rest[0].deadline.Sub(now))
	}
	if k := window([]*job{none, {n: 1}}); k != 2 {
		t.Errorf("window of 2 jobs without deadlines: %d, want both", k)
	}
	big := []*job{{n: maxCoalesced - 1, deadline: now}, {n: 2, deadline: now}}
	if k := window(big); k != 1 {
		t.Errorf("window of %d requests: %d jobs, want 1 (at most %d requests a call)", maxCoalesced+1, k, maxCoalesced)
	}
}
