package region

import (
	"context"
	"flag"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/lease"
)

// seed is the seed of the package's property tests (TestOvershootBound,
// TestMergeIgnoresLossDuplicationAndOrder): fixed, so that every run tries
// the same schedules and a failure repeats; -seed tries others.
var seed = flag.Uint64("seed", 1, "seed of the property tests; 0 draws one from the clock")

// seedOf returns the seed of the property test t, and logs it with the
// command that repeats the run.
func seedOf(t *testing.T) uint64 {
	s := *seed
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d: go test -run '^%s$' ./pkg/region -seed %d repeats this run", s, t.Name(), s)
	return s
}

// TestOvershootBound is a property test of the overshoot bound of
// docs/multi-region.md. Two to four regions offer random hits of one
// global limit; each region's sync rounds come at random, and each push of
// a round is lost with a random probability; time jumps at random, so that
// peers are counted as cut off and heard again. Whatever the schedule:
//
//   - what a region knows of a peer's count is never less than that
//     peer's count at its last push that reached it: loss, repetition and
//     the order of pushes change nothing;
//   - for every region i that admitted, the regions admitted in all at
//     most the limit plus what the others admitted after i last heard
//     them, at i's last admission: the bound's derivation, step by step;
//   - once the links hold for one sync round, every region knows every
//     count exactly: nothing admitted is forgotten.
func TestOvershootBound(t *testing.T) {
	seed := seedOf(t)
	rng := rand.New(rand.NewPCG(seed, 11))
	key := []byte("k")
	var over, overMax, cuts int // rounds that overshot, the most, peers counted cut off at an admission
	for round := range 40 {
		names := []string{"r0", "r1", "r2", "r3"}[:2+rng.IntN(3)]
		w := newWorldEvery(t, names, nil, 4*time.Millisecond)
		limit := algo.Limit{Algorithm: algo.FixedWindow, Requests: uint64(20 + rng.IntN(300)), Window: time.Hour}
		win := windowOf(w.clk.Now(), limit.Window)
		w.sync()
		counted := map[string]uint64{}               // each region's own count: what it admitted
		reached := map[[2]string]uint64{}            // from, to: from's count at its last push that reached to
		lastKnown := map[string]map[string]uint64{}  // region → peer → the count it knew at its last admission
		known := func(at string) map[string]uint64 { // what region at knows of each peer
			e := w.engines[at]
			_, remote := stateOf(e, string(key), win)
			out := map[string]uint64{}
			for _, p := range e.peers {
				if remote != nil {
					out[p.Name] = remote[e.index[p.Name]]
				}
			}
			return out
		}
		loss := rng.Float64() * 0.6
		for step := range 500 {
			r := names[rng.IntN(len(names))]
			switch x := rng.IntN(10); {
			case x < 6:
				k := known(r)
				for _, p := range w.engines[r].peers {
					if w.engines[r].cutOff(p, w.clk.Now()) {
						cuts++
					}
				}
				for _, m := range names {
					if m != r && k[m] < reached[[2]string{m, r}] {
						t.Fatalf("seed %d round %d step %d: %s knows %d of %s, less than the %d that reached it", seed, round, step, r, k[m], m, reached[[2]string{m, r}])
					}
				}
				hits := uint64(1 + rng.IntN(3))
				out := make([]algo.Decision, 1)
				if err := w.engines[r].Decide(w.ctx, []algo.Request{{Key: key, Limit: limit, Hits: hits, Global: algo.GlobalShare}}, out); err != nil {
					t.Fatal(err)
				}
				if out[0].Allowed {
					counted[r] += hits
					lastKnown[r] = k
				}
			case x < 9: // a sync round of r's, each push lost with probability loss
				lost := map[string]bool{}
				for _, m := range names {
					if m != r {
						lost[m] = rng.Float64() < loss
						w.links[[2]string{r, m}].down.Store(lost[m])
					}
				}
				var wg sync.WaitGroup
				w.engines[r].tick(w.ctx, &wg)
				wg.Wait()
				for m, l := range lost {
					w.links[[2]string{r, m}].down.Store(false)
					if !l {
						reached[[2]string{r, m}] = counted[r]
					}
				}
			default: // time passes: a peer unheard for a second is cut off
				w.clk.Advance(time.Duration(rng.IntN(700)) * time.Millisecond)
			}
		}
		var total uint64
		for _, c := range counted {
			total += c
		}
		for i, k := range lastKnown {
			bound := limit.Requests
			for _, j := range names {
				if j != i {
					bound += counted[j] - k[j]
				}
			}
			if total > bound {
				t.Fatalf("seed %d round %d: %v admitted %d of %d; %s last admitted knowing %v, so at most %d", seed, round, counted, total, limit.Requests, i, k, bound)
			}
		}
		if total > limit.Requests {
			over, overMax = over+1, max(overMax, int(total-limit.Requests))
		}
		w.sync()
		for _, i := range names {
			k := known(i)
			for _, j := range names {
				if j != i && k[j] != counted[j] {
					t.Fatalf("seed %d round %d: after a sync %s knows %v, the regions counted %v", seed, round, i, k, counted)
				}
			}
		}
	}
	t.Logf("40 rounds: %d overshot the limit, by %d at most, each within its bound; %d offers met a peer cut off", over, overMax, cuts)
	if over == 0 || cuts == 0 {
		t.Errorf("no round overshot (%d) or met a partition (%d): the schedules do not exercise the bound", over, cuts)
	}
}

// TestLeasedGlobal: a limit of scope: global and consistency: leased.
// Each region's lease engine takes slices of the limit through its region
// engine, which lowers the limit by the peers' counts; what a region
// counts, and pushes, includes the slices it holds. So, synced between,
// the regions admit the limit together and no more, each deciding in
// process; without a sync, the overshoot is what the others took since.
func TestLeasedGlobal(t *testing.T) {
	w := newWorld(t, []string{"eu", "us"}, nil)
	leases := map[string]*lease.Engine{}
	for name, e := range w.engines {
		le, err := lease.New(e, lease.Options{Now: w.clk.Now, Manual: true})
		if err != nil {
			t.Fatal(err)
		}
		leases[name] = le
	}
	limit := algo.Limit{Algorithm: algo.FixedWindow, Requests: 200, Window: time.Hour}
	offer := func(region string, n int) (admitted int) {
		for range n {
			out := make([]algo.Decision, 1)
			if err := leases[region].Decide(context.Background(), []algo.Request{{Key: []byte("k"), Limit: limit, Hits: 1, Leased: true, Global: algo.GlobalShare}}, out); err != nil {
				t.Fatal(err)
			}
			if out[0].Allowed {
				admitted++
			}
			leases[region].Flush(context.Background()) // prefetches and returns, at once
		}
		return admitted
	}
	w.sync()
	eu := offer("eu", 120)
	w.sync()
	us := offer("us", 300)
	w.sync()
	eu += offer("eu", 300)
	if eu+us != 200 {
		t.Fatalf("synced between turns, eu admitted %d and us %d: want 200 together", eu, us)
	}
	// The counts every region knows hold what both admitted: the leases
	// are spent.
	for _, r := range []string{"eu", "us"} {
		c := w.counts(r, "k", limit, algo.GlobalShare)
		if c["eu"]+c["us"] != 200 {
			t.Errorf("%s knows %v: want 200 counted in all", r, c)
		}
	}
}
