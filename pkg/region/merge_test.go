package region

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

func pushOf(region, key string, start, length int64, count uint64) *ratelimitdv1.PushRequest {
	return &ratelimitdv1.PushRequest{Region: region, Weight: 1, Counts: []*ratelimitdv1.RegionCount{
		{Key: []byte(key), WindowStartMs: start, WindowMs: length, Count: count},
	}}
}

// TestMergeIgnoresLossDuplicationAndOrder is a property test of the
// exchange: two senders each send a growing count of a few keys as
// pushes; the receiver gets a random part of them, some twice, in random
// order, and then each sender's last push (the protocol sends every count
// again at least every FullEvery pushes, so a later one always comes).
// What the receiver knows, and what a replica of its region that reads
// the store from scratch learns, is then every sender's last count,
// whatever was lost, repeated or reordered.
func TestMergeIgnoresLossDuplicationAndOrder(t *testing.T) {
	seed := seedOf(t)
	rng := rand.New(rand.NewPCG(seed, 7))
	for round := range 50 {
		w := newWorld(t, []string{"eu", "us", "ap"}, nil)
		limit := algo.Limit{Algorithm: algo.FixedWindow, Requests: 1 << 40, Window: time.Hour}
		start := windowOf(w.clk.Now(), time.Hour).Start
		keys := []string{"a", "b", "c"}
		var pushes []*ratelimitdv1.PushRequest
		final := map[string]map[string]uint64{} // region → key → last count
		for _, from := range []string{"us", "ap"} {
			final[from] = map[string]uint64{}
			counts := map[string]uint64{}
			for range 20 {
				req := &ratelimitdv1.PushRequest{Region: from, Weight: 1}
				for _, k := range keys {
					counts[k] += uint64(rng.IntN(5))
					req.Counts = append(req.Counts, &ratelimitdv1.RegionCount{Key: []byte(k), WindowStartMs: start, WindowMs: time.Hour.Milliseconds(), Count: counts[k]})
				}
				pushes = append(pushes, req)
			}
			for k, c := range counts {
				final[from][k] = c
			}
			pushes = append(pushes, pushes[len(pushes)-1]) // the last one, delivered for sure (below)
		}
		// Lose some, repeat some, shuffle, and deliver the last pushes at a
		// random place.
		var delivered []*ratelimitdv1.PushRequest
		for i, p := range pushes {
			last := i == 20 || i == len(pushes)-1
			switch {
			case last:
				delivered = append(delivered, p)
			case rng.IntN(3) == 0: // lost
			case rng.IntN(3) == 0:
				delivered = append(delivered, p, p)
			default:
				delivered = append(delivered, p)
			}
		}
		rng.Shuffle(len(delivered), func(i, j int) { delivered[i], delivered[j] = delivered[j], delivered[i] })
		srv := syncServer{e: w.engines["eu"]}
		for _, p := range delivered {
			if _, err := srv.Push(w.from(p.Region), p); err != nil {
				t.Fatal(err)
			}
		}
		for _, k := range keys {
			got := w.counts("eu", k, limit, algo.GlobalShare)
			if got["us"] != final["us"][k] || got["ap"] != final["ap"][k] {
				t.Fatalf("seed %d round %d key %s: eu knows us %d, ap %d; the senders' last counts are %d, %d",
					seed, round, k, got["us"], got["ap"], final["us"][k], final["ap"][k])
			}
		}
		// A replica that reads the store from scratch (one that starts)
		// comes to the same counts.
		fresh, err := New(memory.New(memory.Options{Now: w.clk.Now}), Options{Region: "eu", Peers: []Peer{{Name: "us", Addr: "us"}, {Name: "ap", Addr: "ap"}},
			Store: w.engines["eu"].opts.Store, Now: w.clk.Now, Dial: w.engines["eu"].opts.Dial, Authenticate: w.engines["eu"].opts.Authenticate})
		if err != nil {
			t.Fatal(err)
		}
		fresh.load(w.ctx, w.clk.Now())
		for _, k := range keys {
			var got [2]uint64
			if _, remote := stateOf(fresh, k, Window{Length: time.Hour.Milliseconds(), Start: start}); remote != nil {
				got = [2]uint64{remote[fresh.index["us"]], remote[fresh.index["ap"]]}
			}
			if got != [2]uint64{final["us"][k], final["ap"][k]} {
				t.Fatalf("seed %d round %d key %s: a replica reading the store knows us, ap %v, want %d, %d", seed, round, k, got, final["us"][k], final["ap"][k])
			}
		}
	}
}
