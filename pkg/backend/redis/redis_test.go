package redis

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
)

// client returns a client of a real Redis for t.
func client(t *testing.T) *goredis.Client {
	t.Helper()
	srv := redistest.Start(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// clocked is a Backend deciding at the instants a test gives: the scripts
// run with the clock as an argument instead of the Redis clock.
type clocked struct{ b *Backend }

func (c clocked) Decide(ctx context.Context, now time.Time, reqs []algo.Request, out []algo.Decision) error {
	return c.b.decide(ctx, now, reqs, out)
}

// testBackend returns a backend whose keys are the test's own and outlive
// it: the test's clock is not the Redis clock that expires keys.
func testBackend(t *testing.T, c *goredis.Client) *Backend {
	b := New(c, Options{Prefix: fmt.Sprintf("test:%s:%d:", t.Name(), time.Now().UnixNano())})
	b.minTTL = time.Hour
	return b
}

// TestConformance runs the algorithm vectors against the Lua scripts.
func TestConformance(t *testing.T) {
	c := client(t)
	for _, scripts := range []bool{false, true} {
		t.Run(map[bool]string{false: "functions", true: "scripts"}[scripts], func(t *testing.T) {
			newSubject := func(t *testing.T) algotest.Subject {
				b := testBackend(t, c)
				b.scripts.Store(scripts)
				return clocked{b}
			}
			algotest.Run(t, newSubject)
			algotest.RunBatches(t, newSubject)
		})
	}
}

// luaRuns is how many seeded runs of 150 batches TestGoAndLuaAgree makes
// per algorithm: 12 by default, more for a long search (docs/leasing.md
// cites -lua-runs 600). The runs draw from one stream seeded per
// algorithm, so a longer search begins with the default's runs.
var luaRuns = flag.Int("lua-runs", 12, "seeded runs of TestGoAndLuaAgree per algorithm")

// TestGoAndLuaAgree decides random batches with the in-memory backend (the
// Go step functions) and with the Lua scripts, and wants identical
// decisions. The clock mostly runs forward, sometimes stands still, jumps
// ahead or steps back. Each algorithm's runs are seeded by the algorithm:
// a failure names its run and step, and repeats.
func TestGoAndLuaAgree(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	for _, a := range algo.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(a), 11))
			for run := range *luaRuns {
				now := algotest.Epoch
				mem := memory.New(memory.Options{Now: func() time.Time { return now }, SweepInterval: -1})
				defer mem.Close()
				lua := testBackend(t, c)
				// Three keys, one of them of another algorithm, so that
				// batches mix algorithms, duplicates and shadow requests.
				other := algo.Algorithms()[rng.IntN(len(algo.Algorithms()))]
				limits := []algo.Limit{randomLimit(rng, a), randomLimit(rng, a), randomLimit(rng, other)}
				w := limits[0].Window
				// Leases taken so far, by key, so that gives name real ones.
				marks := map[string][]int64{}
				for step := range 150 {
					switch rng.IntN(12) {
					case 0: // the same instant
					case 1:
						now = now.Add(time.Duration(rng.Int64N(int64(3 * w))))
					case 2:
						now = now.Add(-time.Duration(rng.Int64N(int64(2 * w))))
					default:
						now = now.Add(time.Duration(rng.Int64N(int64(w/4)) + 1))
					}
					reqs := make([]algo.Request, 1+rng.IntN(3))
					for i := range reqs {
						k := rng.IntN(len(limits))
						reqs[i] = algo.Request{
							Key:    []byte(fmt.Sprintf("k%d|%s", k, limits[k].Algorithm)),
							Limit:  limits[k],
							Hits:   rng.Uint64N(4),
							Shadow: rng.IntN(6) == 0,
							Peek:   rng.IntN(8) == 0,
							Count:  rng.IntN(3) == 0,
						}
						switch rng.IntN(25) {
						case 0:
							reqs[i].Hits = 1 + max(limits[k].Requests, limits[k].Burst)
						case 1: // a cost that may go past any cap of a count
							reqs[i].Hits = rng.Uint64N(4 * (1 + limits[k].Requests + limits[k].Burst))
						}
						// Leases: takes of a random size, share and TTL, and
						// gives of hits to a lease taken before (or to none).
						switch rng.IntN(4) {
						case 0:
							reqs[i].Op = algo.OpTake
							reqs[i].Lease = algo.Lease{
								Max:   rng.Uint64N(2 * max(limits[k].Requests, 1)),
								Share: rng.Uint64N(9),
								TTL:   time.Duration(rng.Int64N(int64(2 * w))),
							}
						case 1:
							reqs[i].Op = algo.OpGive
							reqs[i].Hits = rng.Uint64N(1 + limits[k].Requests)
							if ms := marks[string(reqs[i].Key)]; len(ms) > 0 && rng.IntN(5) > 0 {
								reqs[i].Lease.Mark = ms[rng.IntN(len(ms))]
							} else {
								reqs[i].Lease.Mark = now.UnixMicro() + rng.Int64N(int64(w/time.Microsecond)) - int64(w/time.Microsecond/2)
							}
						}
					}
					want := make([]algo.Decision, len(reqs))
					got := make([]algo.Decision, len(reqs))
					if err := mem.Decide(ctx, reqs, want); err != nil {
						t.Fatal(err)
					}
					if err := lua.decide(ctx, now, reqs, got); err != nil {
						t.Fatal(err)
					}
					for i := range reqs {
						if got[i] != want[i] {
							t.Fatalf("run %d step %d at %v, request %d of %d (%s, %+v, %d hits, shadow %v, peek %v, count %v, op %d %+v):\n Lua %s\n  Go %s",
								run, step, now.Sub(algotest.Epoch), i, len(reqs), reqs[i].Key, reqs[i].Limit, reqs[i].Hits, reqs[i].Shadow, reqs[i].Peek,
								reqs[i].Count, reqs[i].Op, reqs[i].Lease, algotest.Format(got[i]), algotest.Format(want[i]))
						}
						if want[i].Mark != 0 {
							marks[string(reqs[i].Key)] = append(marks[string(reqs[i].Key)], want[i].Mark)
						}
					}
				}
			}
		})
	}
}

// TestGoAndLuaAgreeWhenARuleChanges changes a bucket rule's N under a key
// whose stored instant carries a fraction of a microsecond in units of the
// old 1/N: Go and Lua must read it the same way.
func TestGoAndLuaAgreeWhenARuleChanges(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	steps := []struct {
		at   time.Duration
		n    uint64
		hits uint64
	}{
		{0, 3, 3},
		{333334 * time.Microsecond, 3, 1}, // refilled at 333 333⅓ µs
		{666667 * time.Microsecond, 3, 1}, // at 666 666⅔ µs: fraction 2/3
		{700 * time.Millisecond, 2, 0},    // 2/3 in halves: cut to 1/2
		{700 * time.Millisecond, 2, 1},
		{1500 * time.Millisecond, 2, 2},
	}
	for _, a := range []algo.Algorithm{algo.TokenBucket, algo.LeakyBucket, algo.GCRA} {
		now := algotest.Epoch
		mem := memory.New(memory.Options{Now: func() time.Time { return now }, SweepInterval: -1})
		defer mem.Close()
		lua := testBackend(t, c)
		for i, st := range steps {
			now = algotest.Epoch.Add(st.at)
			reqs := []algo.Request{{Key: []byte("k"), Limit: algo.Limit{Algorithm: a, Requests: st.n, Window: time.Second}, Hits: st.hits}}
			var want, got [1]algo.Decision
			if err := mem.Decide(ctx, reqs, want[:]); err != nil {
				t.Fatal(err)
			}
			if err := lua.decide(ctx, now, reqs, got[:]); err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("%v step %d: Lua %s, Go %s", a, i, algotest.Format(got[0]), algotest.Format(want[0]))
			}
		}
	}
}

// randomLimit returns a small limit, so that random batches reach its
// boundaries often. Windows are whole milliseconds or odd microseconds.
func randomLimit(rng *rand.Rand, a algo.Algorithm) algo.Limit {
	windows := []time.Duration{time.Second, 3 * time.Second, 7 * time.Millisecond, 999_983 * time.Microsecond}
	l := algo.Limit{Algorithm: a, Requests: rng.Uint64N(13), Window: windows[rng.IntN(len(windows))]}
	if a.UsesBurst() && rng.IntN(2) == 0 {
		l.Burst = 1 + rng.Uint64N(3*l.Requests+1)
	}
	return l
}

// TestWindowKeysExpireAtTheirWindowsEnd checks, on the Redis clock, that
// the window algorithms' keys expire when their window's count frees up
// however many decisions the window saw, and whatever TTL the state of an
// earlier window had: the first write of a window sets the TTL, later
// writes in it keep it (SET KEEPTTL, Redis 6 and later).
// The window is read from the stored state ("t c …", t in µs), so nothing
// here depends on how long the calls take.
func TestWindowKeysExpireAtTheirWindowsEnd(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	if err := c.Do(ctx, "PEXPIRETIME", "none").Err(); err != nil {
		t.Skipf("this Redis has no PEXPIRETIME (Redis 7): %v", err)
	}
	b := New(c, Options{Prefix: "win:"})
	const w = time.Minute
	for _, tc := range []struct {
		a     algo.Algorithm
		spans int64 // windows from t to the end of the key's state
	}{
		{algo.FixedWindow, 1},
		{algo.BurstFill, 1},
		{algo.SlidingWindowCounter, 2},
	} {
		key := "win:" + tc.a.String()
		l := algo.Limit{Algorithm: tc.a, Requests: 100, Window: w}
		// A state of a window long past, with a TTL far from any window's
		// end: the first decision starts a new window, and a new TTL.
		now, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		stale := fmt.Sprintf("%d 5", now.Add(-3*w).UnixMicro())
		if err := c.Set(ctx, key, stale, 2*time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		var late int64 // µs: the longest call so far, whichever set the TTL
		for i := range 4 {
			out := make([]algo.Decision, 1)
			before, err := c.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Decide(ctx, []algo.Request{{Key: []byte(tc.a.String()), Limit: l, Hits: 1}}, out); err != nil {
				t.Fatal(err)
			}
			after, err := c.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			// The script reads the clock (TIME) at its start and Redis adds
			// a TTL to its own clock when the SET runs: a script kept from
			// a CPU between the two sets the expiry that much later (2 ms
			// in a CI run beside two busy loops), at most the time of the
			// call that set it, this one or an earlier one that kept it.
			late = max(late, after.Sub(before).Microseconds())
			v, err := c.Get(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			start, err := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			if err != nil {
				t.Fatalf("%v: state %q: %v", tc.a, v, err)
			}
			expireMs, err := c.Do(ctx, "PEXPIRETIME", key).Int64()
			if err != nil {
				t.Fatal(err)
			}
			end := start + tc.spans*w.Microseconds()
			if d := expireMs*1000 - end; d < -1000 || d > 1000+late {
				t.Errorf("%v, decision %d: the key expires %d µs from its window's end (state %q, expiry %d ms); want within 1 ms, or later by at most the longest call's %d µs", tc.a, i+1, d, v, expireMs, late)
			}
		}
	}
}

// TestKeysExpireWithTheirState checks, on the Redis clock, that every
// stored key carries a TTL no longer than its reset-after rounded up to the
// millisecond, and that the key is gone once the limit is restored.
func TestKeysExpireWithTheirState(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	b := New(c, Options{Prefix: "ttl:"})
	for _, a := range algo.Algorithms() {
		l := algo.Limit{Algorithm: a, Requests: 5, Window: 300 * time.Millisecond}
		key := []byte(a.String())
		out := make([]algo.Decision, 1)
		if err := b.Decide(ctx, []algo.Request{{Key: key, Limit: l, Hits: 2}}, out); err != nil {
			t.Fatal(err)
		}
		ttl, err := c.PTTL(ctx, "ttl:"+string(key)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if limit := out[0].ResetAfter.Round(time.Millisecond) + time.Millisecond; ttl <= 0 || ttl > limit {
			t.Errorf("%v: TTL %v after a decision with reset-after %v, want (0, %v]", a, ttl, out[0].ResetAfter, limit)
		}
	}
	// Every key above is restored within 2 windows (the sliding counter's
	// longest); wait for Redis to expire them, polling.
	deadline := time.Now().Add(5 * time.Second)
	for {
		keys, err := c.Keys(ctx, "ttl:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("keys %v outlived their state", keys)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRedisClock checks that the script decides by the Redis clock when
// the backend has none of its own: a fixed window's reset-after is the time
// to the end of the window the Redis clock is in.
func TestRedisClock(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	b := New(c, Options{Prefix: "clock:"})
	l := algo.Limit{Algorithm: algo.FixedWindow, Requests: 5, Window: time.Hour}
	before, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]algo.Decision, 1)
	if err := b.Decide(ctx, []algo.Request{{Key: []byte("k"), Limit: l, Hits: 1}}, out); err != nil {
		t.Fatal(err)
	}
	after, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	end := before.Truncate(time.Hour).Add(time.Hour)
	if got := after.Add(out[0].ResetAfter); got.Before(end) || got.After(end.Add(after.Sub(before))) {
		t.Errorf("reset-after %v from Redis time %v ends at %v, want the end of Redis's hour, %v", out[0].ResetAfter, before, got, end)
	}
}

// TestScriptSurvivesFlush checks that a SCRIPT FLUSH costs nothing but one
// EVAL: the backend reloads the script transparently.
func TestScriptSurvivesFlush(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	b := testBackend(t, c)
	b.scripts.Store(true)
	l := algo.Limit{Requests: 3, Window: time.Minute}
	out := make([]algo.Decision, 1)
	for i := range 3 {
		if i == 1 {
			if err := c.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if i == 2 {
			// And the function library: back to functions, flushed.
			b.scripts.Store(false)
			if err := c.FunctionFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Decide(ctx, []algo.Request{{Key: []byte("k"), Limit: l, Hits: 1}}, out); err != nil {
			t.Fatalf("decision %d: %v", i, err)
		}
		if want := uint64(2 - i); !out[0].Allowed || out[0].Remaining != want {
			t.Fatalf("decision %d: %s, want allowed with %d remaining", i, algotest.Format(out[0]), want)
		}
	}
}

// TestMemoryUsage measures the Redis memory of one key of each algorithm
// (MEMORY USAGE), for docs/algorithms.md; run with -v to see the figures.
func TestMemoryUsage(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	b := New(c, Options{Prefix: "mem:"})
	// A key like the service's: domain, two entries, the limit.
	key := "9:messaging=9:to_number10:2061111111|"
	for _, a := range algo.Algorithms() {
		for _, n := range []uint64{1, 100, 1000} {
			if a != algo.SlidingWindowLog && n != 100 {
				continue
			}
			l := algo.Limit{Algorithm: a, Requests: n, Window: time.Hour}
			k := fmt.Sprintf("%s%s/3600s/%d", key, a, n)
			out := make([]algo.Decision, 1)
			if err := b.Decide(ctx, []algo.Request{{Key: []byte(k), Limit: l, Hits: n}}, out); err != nil {
				t.Fatal(err)
			}
			if !out[0].Allowed {
				t.Fatalf("%v: %d hits refused: %s", a, n, algotest.Format(out[0]))
			}
			bytes, err := c.MemoryUsage(ctx, "mem:"+k, 0).Result()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%-22s %4d hits admitted: %5d bytes", a, n, bytes)
			if limit := int64(200 + 150*n*boolInt(a == algo.SlidingWindowLog)); bytes <= 0 || bytes > limit {
				t.Errorf("%v with %d hits: %d bytes, want at most %d", a, n, bytes, limit)
			}
		}
	}
}

func boolInt(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// TestManyLimits decides with more distinct limits than the decision
// function caches (1,000), in calls that span the cache's reset, and wants
// what the Go step functions decide.
func TestManyLimits(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	now := algotest.Epoch
	mem := memory.New(memory.Options{Now: func() time.Time { return now }, SweepInterval: -1})
	defer mem.Close()
	lua := testBackend(t, c)
	algs := algo.Algorithms()
	const n = 2500
	reqs := make([]algo.Request, 0, 100)
	for i := range n {
		a := algs[i%len(algs)]
		l := algo.Limit{Algorithm: a, Requests: 1 + uint64(i%7), Window: time.Duration(1+i) * time.Millisecond}
		reqs = append(reqs, algo.Request{Key: []byte(fmt.Sprintf("many|%d", i)), Limit: l, Hits: 1 + uint64(i%3)})
		if len(reqs) < cap(reqs) && i < n-1 {
			continue
		}
		want := make([]algo.Decision, len(reqs))
		got := make([]algo.Decision, len(reqs))
		if err := mem.Decide(ctx, reqs, want); err != nil {
			t.Fatal(err)
		}
		if err := lua.decide(ctx, now, reqs, got); err != nil {
			t.Fatalf("limits up to %d: %v", i, err)
		}
		for j := range reqs {
			if got[j] != want[j] {
				t.Fatalf("limits up to %d, request %d (%+v): Lua %s, Go %s", i, j, reqs[j].Limit, algotest.Format(got[j]), algotest.Format(want[j]))
			}
		}
		reqs = reqs[:0]
		now = now.Add(time.Millisecond)
	}
}

// TestMalformedLimitArgument calls the decision code with limit arguments
// the Go side never sends and wants an error naming the argument, not a
// Lua error or a decision.
func TestMalformedLimitArgument(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	b := testBackend(t, c)
	for _, scripts := range []bool{false, true} {
		b.scripts.Store(scripts)
		for arg, want := range map[string]string{
			"fixed_window 10 1000000":      "malformed limit",
			"fixed_window 10 0 10":         "window under 1 us",
			"no_such_algorithm 10 1000 10": "unknown algorithm no_such_algorithm",
			"":                             "malformed limit",
		} {
			_, err := b.run(ctx, c, []string{b.opts.Prefix + "bad"}, []any{"", "0", arg, "1", "0"})
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("scripts %v, limit %q: error %v, want one containing %q", scripts, arg, err, want)
			}
		}
	}
}

// TestGoAndLuaAgreeOnSlots decides random batches of concurrency ops
// (acquires, releases, renews by a few holders, and decisions) on two
// keys with the memory backend and with Lua, and wants identical
// decisions. The clock runs forward, stands still, jumps past TTLs and
// steps back.
func TestGoAndLuaAgreeOnSlots(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(19, 5))
	ops := []algo.Op{algo.OpDecide, algo.OpAcquire, algo.OpAcquire, algo.OpRelease, algo.OpRenew}
	for run := range 20 {
		now := algotest.Epoch
		mem := memory.New(memory.Options{Now: func() time.Time { return now }, SweepInterval: -1})
		lua := testBackend(t, c)
		limits := []algo.Limit{
			{Algorithm: algo.Concurrency, Requests: rng.Uint64N(4), Window: time.Duration(1+rng.IntN(3)) * time.Second},
			{Algorithm: algo.Concurrency, Requests: 1 + rng.Uint64N(5), Window: time.Duration(1+rng.IntN(3)) * time.Second},
		}
		for step := range 200 {
			switch rng.IntN(10) {
			case 0:
			case 1:
				now = now.Add(time.Duration(rng.Int64N(int64(4 * time.Second))))
			case 2:
				now = now.Add(-time.Duration(rng.Int64N(int64(2 * time.Second))))
			default:
				now = now.Add(time.Duration(rng.Int64N(int64(300 * time.Millisecond))))
			}
			reqs := make([]algo.Request, 1+rng.IntN(3))
			for i := range reqs {
				k := rng.IntN(len(limits))
				reqs[i] = algo.Request{
					Key:    []byte(fmt.Sprintf("slots%d", k)),
					Limit:  limits[k],
					Hits:   rng.Uint64N(3),
					Op:     ops[rng.IntN(len(ops))],
					Holder: algo.Holder{rng.Uint64N(4), rng.Uint64()},
					Peek:   rng.IntN(10) == 0,
				}
				reqs[i].Holder[1] = reqs[i].Holder[0] * 7 // four holders, with both halves set
			}
			want := make([]algo.Decision, len(reqs))
			got := make([]algo.Decision, len(reqs))
			if err := mem.Decide(ctx, reqs, want); err != nil {
				t.Fatal(err)
			}
			if err := lua.decide(ctx, now, reqs, got); err != nil {
				t.Fatal(err)
			}
			for i := range reqs {
				if got[i] != want[i] {
					t.Fatalf("run %d step %d at %v, request %d of %d (%s, %+v, op %d, holder %v, %d hits, peek %v):\n Lua %s\n  Go %s",
						run, step, now.Sub(algotest.Epoch), i, len(reqs), reqs[i].Key, reqs[i].Limit, reqs[i].Op, reqs[i].Holder, reqs[i].Hits, reqs[i].Peek,
						algotest.Format(got[i]), algotest.Format(want[i]))
				}
			}
		}
		mem.Close()
	}
}

// TestGoAndLuaAgreeOnReservations decides random batches of reservations
// (algo.OpReserve), settles (algo.OpSettle) and plain decisions of fixed
// windows, with the in-memory backend and with the Lua scripts, and wants
// identical decisions: reservations of varied TTLs, so that keys fill
// their slots past the cap, settles of any cost, windows that end under
// reservations made in them, a clock that stands still, jumps or steps
// back, and batches that a refusal of another request refuses. A keyed
// settle of another algorithm counts its hits, a reservation of one
// decides them: the twins must agree on that too.
func TestGoAndLuaAgreeOnReservations(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 31))
	for run := range *luaRuns {
		now := algotest.Epoch
		mem := memory.New(memory.Options{Now: func() time.Time { return now }, SweepInterval: -1})
		defer mem.Close()
		lua := testBackend(t, c)
		windows := []time.Duration{time.Second, 7 * time.Second, 999_983 * time.Microsecond}
		limits := []algo.Limit{
			{Algorithm: algo.FixedWindow, Requests: 1 + rng.Uint64N(2000), Window: windows[rng.IntN(len(windows))]},
			{Algorithm: algo.FixedWindow, Requests: rng.Uint64N(40), Window: windows[rng.IntN(len(windows))]},
			randomLimit(rng, algo.Algorithms()[rng.IntN(len(algo.Algorithms()))]),
		}
		w := limits[0].Window
		for step := range 200 {
			switch rng.IntN(12) {
			case 0:
			case 1:
				now = now.Add(time.Duration(rng.Int64N(int64(3 * w))))
			case 2:
				now = now.Add(-time.Duration(rng.Int64N(int64(w))))
			default:
				now = now.Add(time.Duration(rng.Int64N(int64(w/8)) + 1))
			}
			reqs := make([]algo.Request, 1+rng.IntN(3))
			for i := range reqs {
				k := rng.IntN(len(limits))
				l := limits[k]
				reqs[i] = algo.Request{
					Key:    []byte(fmt.Sprintf("r%d|%s", k, l.Algorithm)),
					Limit:  l,
					Hits:   rng.Uint64N(1 + l.Requests/4),
					Shadow: rng.IntN(8) == 0,
					Peek:   rng.IntN(10) == 0,
				}
				switch rng.IntN(7) {
				case 0, 1, 2:
					reqs[i].Op = algo.OpReserve
					reqs[i].Hits = 1 + rng.Uint64N(1+l.Requests/8)
					reqs[i].Lease.TTL = time.Duration(1 + rng.Int64N(int64(2*w)))
				case 3, 4:
					reqs[i].Op = algo.OpSettle
					if rng.IntN(4) == 0 {
						reqs[i].Hits = rng.Uint64N(2 * (1 + l.Requests))
					}
				case 5:
					reqs[i].Count = true
				}
			}
			want := make([]algo.Decision, len(reqs))
			got := make([]algo.Decision, len(reqs))
			if err := mem.Decide(ctx, reqs, want); err != nil {
				t.Fatal(err)
			}
			if err := lua.decide(ctx, now, reqs, got); err != nil {
				t.Fatal(err)
			}
			for i := range reqs {
				if got[i] != want[i] {
					t.Fatalf("run %d step %d at %v, request %d of %d (%s, %+v, %d hits, shadow %v, peek %v, count %v, op %d %+v):\n Lua %s\n  Go %s",
						run, step, now.Sub(algotest.Epoch), i, len(reqs), reqs[i].Key, reqs[i].Limit, reqs[i].Hits, reqs[i].Shadow, reqs[i].Peek,
						reqs[i].Count, reqs[i].Op, reqs[i].Lease, algotest.Format(got[i]), algotest.Format(want[i]))
				}
			}
		}
	}
}
