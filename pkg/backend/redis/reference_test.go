package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/key"
)

// refKey returns the reference-layout key of one entry, less its window.
func refKey(domain, k, v string) []byte {
	return key.AppendReferenceEntry(key.AppendReference(nil, domain), k, v)
}

// referenceINCR counts hits as an envoyproxy/ratelimit pod does
// (src/redis/fixed_cache_impl.go): INCRBY, then EXPIRE by the unit, in one
// pipeline, on the key of the window that holds now on the pod's clock.
func referenceINCR(t *testing.T, c goredis.Cmdable, prefix string, stem []byte, unit int64, now time.Time, hits int64) int64 {
	t.Helper()
	k := prefix + string(stem) + strconv.FormatInt(now.Unix()/unit*unit, 10)
	ctx := context.Background()
	var incr *goredis.IntCmd
	_, err := c.Pipelined(ctx, func(p goredis.Pipeliner) error {
		incr = p.IncrBy(ctx, k, hits)
		p.Expire(ctx, k, time.Duration(unit)*time.Second)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return incr.Val()
}

// TestReferenceLayout counts on from what a reference pod counted, and
// leaves counts the reference reads back: INCRBY, GET and TTL on the
// reference's own key.
func TestReferenceLayout(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("ref:%d:", time.Now().UnixNano())
	// The middle of a minute, on the clock both the test's "reference pod"
	// and the backend read.
	now := time.Unix(1_700_000_000/60*60+30, 123_000)
	for _, jitter := range []time.Duration{0, 300 * time.Second} {
		t.Run(fmt.Sprintf("jitter %v", jitter), func(t *testing.T) {
			b := New(c, Options{Prefix: prefix + jitter.String() + ":", Now: func() time.Time { return now }, ExpirationJitter: jitter})
			stem := refKey("rl", "user", "alice_"+jitter.String())
			perMinute := algo.Limit{Algorithm: algo.FixedWindow, Requests: 10, Window: time.Minute}
			full := b.opts.Prefix + string(stem) + strconv.FormatInt(now.Unix()/60*60, 10)

			if got := referenceINCR(t, c, b.opts.Prefix, stem, 60, now, 7); got != 7 {
				t.Fatalf("reference count %d, want 7", got)
			}
			req := []algo.Request{{Key: []byte("native"), RefKey: stem, Limit: perMinute, Hits: 2}}
			out := make([]algo.Decision, 1)
			if err := b.Decide(ctx, req, out); err != nil {
				t.Fatal(err)
			}
			if !out[0].Allowed || out[0].Remaining != 1 || out[0].ResetAfter != 30*time.Second-123*time.Millisecond/1000 {
				t.Fatalf("after 7 counted by the reference, 2 hits: %s; want allowed, 1 remaining, reset 29.999877s", algotest.Format(out[0]))
			}
			if v, err := c.Get(ctx, full).Int64(); err != nil || v != 9 {
				t.Fatalf("GET %s = %d, %v; want 9", full, v, err)
			}
			// ratelimitd refuses what would pass the limit and counts none of it.
			req[0].Hits = 2
			if err := b.Decide(ctx, req, out); err != nil {
				t.Fatal(err)
			}
			if out[0].Allowed || out[0].Remaining != 1 {
				t.Fatalf("2 hits with 1 left: %s; want refused, 1 remaining", algotest.Format(out[0]))
			}
			if v, _ := c.Get(ctx, full).Int64(); v != 9 {
				t.Fatalf("a refusal changed the count to %d", v)
			}
			// The reference sees ratelimitd's count: its INCRBY passes the limit.
			if got := referenceINCR(t, c, b.opts.Prefix, stem, 60, now, 1); got != 10 {
				t.Fatalf("reference count %d, want 10", got)
			}
			if got := referenceINCR(t, c, b.opts.Prefix, stem, 60, now, 1); got != 11 {
				t.Fatalf("reference count %d, want 11 (the reference counts refused hits)", got)
			}
			// Past the limit by the reference's refused hits, ratelimitd
			// reads none remaining.
			req[0].Hits = 1
			if err := b.Decide(ctx, req, out); err != nil {
				t.Fatal(err)
			}
			if out[0].Allowed || out[0].Remaining != 0 {
				t.Fatalf("at 11 of 10: %s; want refused, 0 remaining", algotest.Format(out[0]))
			}

			// A key ratelimitd creates expires as the reference's: after the
			// unit, plus the jitter.
			fresh := refKey("rl", "user", "bob_"+jitter.String())
			req = []algo.Request{{Key: []byte("native2"), RefKey: fresh, Limit: perMinute, Hits: 3}}
			if err := b.Decide(ctx, req, out); err != nil || !out[0].Allowed {
				t.Fatalf("%v %s", err, algotest.Format(out[0]))
			}
			fk := b.opts.Prefix + string(fresh) + strconv.FormatInt(now.Unix()/60*60, 10)
			if v, err := c.Get(ctx, fk).Int64(); err != nil || v != 3 {
				t.Fatalf("GET %s = %d, %v; want 3", fk, v, err)
			}
			ttl, err := c.TTL(ctx, fk).Result()
			if err != nil || ttl <= 50*time.Second || ttl > time.Minute+jitter {
				t.Fatalf("TTL %v, %v; want (50s, %v]", ttl, err, time.Minute+jitter)
			}
			// A later hit keeps the TTL, as INCRBY does.
			if err := b.Decide(ctx, req, out); err != nil || !out[0].Allowed {
				t.Fatalf("%v %s", err, algotest.Format(out[0]))
			}
			if ttl2, _ := c.TTL(ctx, fk).Result(); ttl2 > ttl {
				t.Fatalf("TTL went from %v to %v", ttl, ttl2)
			}
			// No native key was written.
			if n, _ := c.Exists(ctx, b.opts.Prefix+"native", b.opts.Prefix+"native2").Result(); n != 0 {
				t.Fatalf("%d native keys written", n)
			}
		})
	}
}

// TestReferenceLayoutCounts counts the refused hits of a request that
// counts (over_limit_hits: count) with INCRBY on the reference's key, as a
// reference pod counts every hit: the pods read the same count.
func TestReferenceLayoutCounts(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	now := time.Unix(1_700_000_000/60*60+30, 0)
	b := New(c, Options{Prefix: fmt.Sprintf("ref:%d:", time.Now().UnixNano()), Now: func() time.Time { return now }})
	stem := refKey("rl", "user", "carol")
	full := b.opts.Prefix + string(stem) + strconv.FormatInt(now.Unix()/60*60, 10)
	referenceINCR(t, c, b.opts.Prefix, stem, 60, now, 7)
	req := []algo.Request{{Key: []byte("native"), RefKey: stem, Limit: algo.Limit{Requests: 10, Window: time.Minute}, Hits: 5, Count: true}}
	out := make([]algo.Decision, 1)
	if err := b.Decide(ctx, req, out); err != nil {
		t.Fatal(err)
	}
	if out[0].Allowed || out[0].Remaining != 0 || out[0].RetryAfter != 30*time.Second {
		t.Fatalf("5 hits with 3 left, counted: %s; want refused, 0 remaining, retry 30s", algotest.Format(out[0]))
	}
	if v, err := c.Get(ctx, full).Int64(); err != nil || v != 12 {
		t.Fatalf("GET %s = %d, %v; want 12: the refused 5 counted", full, v, err)
	}
	if got := referenceINCR(t, c, b.opts.Prefix, stem, 60, now, 1); got != 13 {
		t.Fatalf("the reference counted on to %d, want 13", got)
	}
}

// TestReferenceLayoutOnlyForPlainFixedWindows keeps every other request
// under its native key: other algorithms, windows of a fraction of a
// second, leased requests and lease ops.
func TestReferenceLayoutOnlyForPlainFixedWindows(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	b := New(c, Options{Prefix: fmt.Sprintf("ref:%d:", time.Now().UnixNano()), Now: func() time.Time { return now }})
	stem := refKey("d", "k", "v")
	reqs := []algo.Request{
		{Key: []byte("tb"), RefKey: stem, Limit: algo.Limit{Algorithm: algo.TokenBucket, Requests: 5, Window: time.Second}, Hits: 1},
		{Key: []byte("ms"), RefKey: stem, Limit: algo.Limit{Requests: 5, Window: 1500 * time.Millisecond}, Hits: 1},
		{Key: []byte("leased"), RefKey: stem, Limit: algo.Limit{Requests: 5, Window: time.Second}, Hits: 1, Leased: true},
	}
	out := make([]algo.Decision, len(reqs))
	if err := b.Decide(ctx, reqs, out); err != nil {
		t.Fatal(err)
	}
	for _, r := range reqs {
		if n, _ := c.Exists(ctx, b.opts.Prefix+string(r.Key)).Result(); n != 1 {
			t.Errorf("%s: no native key", r.Key)
		}
	}
	if n, _ := c.Exists(ctx, b.opts.Prefix+string(stem)+strconv.FormatInt(now.Unix(), 10)).Result(); n != 0 {
		t.Error("a request that is not a plain fixed window wrote a reference key")
	}
}

// TestGoAndLuaAgreeOnReferenceKeys decides random batches of fixed
// windows kept in the reference layout and with the in-memory backend (the
// Go step): the layout changes where the count is kept, never a decision.
// The clock runs forward: a replica whose clock steps back names an
// earlier window's key, as a reference pod does.
func TestGoAndLuaAgreeOnReferenceKeys(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(18, 5))
	for run := range 8 {
		now := algotest.Epoch
		mem := memory.New(memory.Options{Now: func() time.Time { return now }, SweepInterval: -1})
		defer mem.Close()
		// Odd runs go through the coalescing workers, which build their
		// keys and arguments on their own path.
		lua := New(c, Options{Prefix: fmt.Sprintf("ref:%d:%d:", time.Now().UnixNano(), run), Now: func() time.Time { return now }, Coalesce: run % 2})
		defer lua.Close()
		units := []time.Duration{time.Second, time.Minute, time.Hour}
		var limits []algo.Limit
		for range 3 {
			limits = append(limits, algo.Limit{Algorithm: algo.FixedWindow, Requests: rng.Uint64N(8), Window: units[rng.IntN(len(units))]})
		}
		for step := range 200 {
			w := limits[0].Window
			switch rng.IntN(10) {
			case 0:
			case 1:
				now = now.Add(time.Duration(rng.Int64N(int64(2 * w))))
			default:
				now = now.Add(time.Duration(rng.Int64N(int64(w/5)) + 1))
			}
			reqs := make([]algo.Request, 1+rng.IntN(3))
			for i := range reqs {
				k := rng.IntN(len(limits))
				reqs[i] = algo.Request{
					Key:    fmt.Appendf(nil, "k%d", k),
					RefKey: refKey("d", "k", strconv.Itoa(k)),
					Limit:  limits[k],
					Hits:   rng.Uint64N(4),
					Shadow: rng.IntN(6) == 0,
					Peek:   rng.IntN(8) == 0,
					Count:  rng.IntN(3) == 0,
				}
			}
			want := make([]algo.Decision, len(reqs))
			got := make([]algo.Decision, len(reqs))
			if err := mem.Decide(ctx, reqs, want); err != nil {
				t.Fatal(err)
			}
			if err := lua.Decide(ctx, reqs, got); err != nil {
				t.Fatal(err)
			}
			for i := range reqs {
				if got[i] != want[i] {
					t.Fatalf("run %d step %d at %v, request %d of %d (%s, %+v, %d hits, shadow %v, peek %v):\n Lua %s\n  Go %s",
						run, step, now.Sub(algotest.Epoch), i, len(reqs), reqs[i].Key, reqs[i].Limit, reqs[i].Hits, reqs[i].Shadow, reqs[i].Peek,
						algotest.Format(got[i]), algotest.Format(want[i]))
				}
			}
		}
		// The counts are where the reference keeps them, and nowhere else.
		if ks, err := c.Keys(ctx, lua.opts.Prefix+"*").Result(); err != nil || len(ks) == 0 {
			t.Fatalf("run %d left no keys: %v", run, err)
		} else {
			for _, k := range ks {
				if _, err := strconv.Atoi(k[len(lua.opts.Prefix+"d_k_0_"):]); err != nil || k[:len(lua.opts.Prefix+"d_k_")] != lua.opts.Prefix+"d_k_" {
					t.Fatalf("run %d wrote %q, not a reference key", run, k)
				}
			}
		}
	}
}

// TestReferenceLayoutOnCluster decides two descriptors whose reference
// keys (which carry no hash tag) lie on different slots in one request:
// each is decided on its own slot and counted where the reference counts.
func TestReferenceLayoutOnCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	now := time.Unix(1_700_000_000, 0)
	prefix := uniquePrefix(t)
	b := dial(t, Config{URL: cl.URL, Mode: Cluster}, Options{Prefix: prefix, Now: func() time.Time { return now }})
	ctx := context.Background()
	perHour := algo.Limit{Algorithm: algo.FixedWindow, Requests: 5, Window: time.Hour}
	stems := [][]byte{refKey("d", "user", "a"), refKey("d", "user", "b"), refKey("d", "user", "c")}
	keys := make([]string, len(stems))
	slots := map[int]bool{}
	for i, s := range stems {
		keys[i] = prefix + string(s) + strconv.FormatInt(now.Unix()/3600*3600, 10)
		slots[slot(keys[i])] = true
		referenceINCR(t, b.Client(), prefix, s, 3600, now, int64(i+1))
	}
	if len(slots) < 2 {
		t.Fatalf("keys %q share a slot; the test wants them apart", keys)
	}
	reqs := make([]algo.Request, len(stems))
	for i, s := range stems {
		reqs[i] = algo.Request{Key: fmt.Appendf(nil, "n%d", i), RefKey: s, Limit: perHour, Hits: 1}
	}
	out := make([]algo.Decision, len(reqs))
	if err := b.Decide(ctx, reqs, out); err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		if want := uint64(5 - (i + 1) - 1); !out[i].Allowed || out[i].Remaining != want {
			t.Errorf("descriptor %d: %s; want allowed, %d remaining", i, algotest.Format(out[i]), want)
		}
		if v, err := b.Client().Get(ctx, keys[i]).Int64(); err != nil || v != int64(i+2) {
			t.Errorf("GET %s = %d, %v; want %d", keys[i], v, err, i+2)
		}
	}
}

// TestReferenceLayoutReset: an operator's Reset of a request kept in the
// reference layout deletes its current window's reference key, which
// reference pods count in too, and its native key.
func TestReferenceLayoutReset(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	now := time.Unix(1_700_000_000/60*60+10, 0)
	b := New(c, Options{Prefix: fmt.Sprintf("reset:%d:", time.Now().UnixNano()), Now: func() time.Time { return now }})
	stem := refKey("rl", "user", "alice")
	perMinute := algo.Limit{Algorithm: algo.FixedWindow, Requests: 10, Window: time.Minute}
	full := b.opts.Prefix + string(stem) + strconv.FormatInt(now.Unix()/60*60, 10)
	req := []algo.Request{{Key: []byte("native"), RefKey: stem, Limit: perMinute, Hits: 4}}
	out := make([]algo.Decision, 1)
	if err := b.Decide(ctx, req, out); err != nil || !out[0].Allowed {
		t.Fatalf("4 hits: %+v, %v", out[0], err)
	}
	if v, err := c.Get(ctx, full).Int64(); err != nil || v != 4 {
		t.Fatalf("GET %s = %d, %v; want 4", full, v, err)
	}
	if err := b.Reset(ctx, req); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Exists(ctx, full).Result(); err != nil || n != 0 {
		t.Fatalf("%s after the reset: exists %d, %v; want gone", full, n, err)
	}
	req[0].Hits = 0
	if err := b.Decide(ctx, req, out); err != nil || out[0].Remaining != 10 {
		t.Fatalf("after the reset: %+v, %v; want 10 remaining", out[0], err)
	}
}

// TestReferenceLayoutDecidesAtItsInstant: a request kept in the reference
// layout is decided at the instant that named its key (algo.Plain.At, the
// replica's clock), not at the script's clock, so that the two cannot
// disagree about the window. The replica's clock is 30 s into a minute;
// the script runs 75 s later, 45 s into the next minute, as when Redis's
// clock (TIME) is ahead of the replica's or the call waited: the answer
// must still be the named window's, resetting in 30 s, and count in its
// key. A script that decided at its own clock (the `now = at` lines of
// decide.lua removed, on the plain path or the general one) answers the
// next window's reset, 15 s, and fails this (shown for each path); no
// other test has the two clocks differ.
func TestReferenceLayoutDecidesAtItsInstant(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	at := time.Unix(1_700_000_000/60*60+30, 0)
	script := at.Add(75 * time.Second)
	b := New(c, Options{Prefix: fmt.Sprintf("refat:%d:", time.Now().UnixNano()), Now: func() time.Time { return at }})
	stem := refKey("rl", "user", "dave")
	full := b.opts.Prefix + string(stem) + strconv.FormatInt(at.Unix()/60*60, 10)
	perMinute := algo.Limit{Algorithm: algo.FixedWindow, Requests: 10, Window: time.Minute}
	for _, tc := range []struct {
		name string
		reqs []algo.Request
	}{
		// One request takes the plain fixed-window path, a counting one
		// refused the general path.
		{"plain path", []algo.Request{{Key: []byte("native"), RefKey: stem, Limit: perMinute, Hits: 3}}},
		{"general path", []algo.Request{{Key: []byte("native"), RefKey: stem, Limit: perMinute, Hits: 20, Count: true}}},
	} {
		out := make([]algo.Decision, len(tc.reqs))
		if err := b.decide(ctx, script, tc.reqs, out); err != nil {
			t.Fatal(err)
		}
		if out[0].ResetAfter != 30*time.Second {
			t.Errorf("%s: %s; want the window named at %v, resetting in 30s, not the script clock's next window", tc.name, algotest.Format(out[0]), at.Format(time.TimeOnly))
		}
	}
	if v, err := c.Get(ctx, full).Int64(); err != nil || v != 23 {
		t.Fatalf("GET %s = %d, %v; want 23: 3 admitted, then 20 refused and counted", full, v, err)
	}
}
