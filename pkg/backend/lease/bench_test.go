package lease

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/footprint"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
)

// BenchmarkDecide decides one leased request whose key holds a lease (the
// hot path: no call), beside the memory backend deciding it exactly.
func BenchmarkDecide(b *testing.B) {
	l := algo.Limit{Requests: 1 << 40, Window: time.Hour}
	for _, bc := range []struct {
		name   string
		leased bool
	}{{"memory", false}, {"leased", true}} {
		b.Run(bc.name, func(b *testing.B) {
			mem := memory.New(memory.Options{SweepInterval: -1})
			defer mem.Close()
			var be algo.Backend = mem
			if bc.leased {
				e, err := New(mem, Options{})
				if err != nil {
					b.Fatal(err)
				}
				defer e.Close(context.Background())
				be = e
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				reqs := []algo.Request{{Key: []byte("hot|key|of|some|length"), Limit: l, Hits: 1, Leased: true}}
				out := make([]algo.Decision, 1)
				for pb.Next() {
					if err := be.Decide(context.Background(), reqs, out); err != nil {
						b.Fatal(err)
					}
				}
			})
			if e, ok := be.(*Engine); ok {
				st := e.Stats()
				b.ReportMetric(float64(st.Calls)/float64(b.N), "calls/op")
			}
		})
	}
}

// admitAll is a store that admits every request and keeps nothing, so
// that the heap a benchmark measures is the lease engine's alone.
type admitAll struct{}

func (admitAll) Decide(_ context.Context, reqs []algo.Request, out []algo.Decision) error {
	for i := range reqs {
		out[i] = algo.Decision{Allowed: true, Remaining: reqs[i].Limit.Requests - min(reqs[i].Hits, reqs[i].Limit.Requests)}
	}
	return nil
}

// BenchmarkFootprint fills the lease engine's key table with one-off keys
// shaped like real ones (domain, one entry, limit: about 40 bytes), each
// decided once and leasing nothing, as the table holds them for
// Options.TTL under one-off traffic, and reports what each costs
// (internal/footprint): B/key of live heap (the entry, the key, the map
// slot), RSS-B/key of resident set grown once filled (Linux), and
// cycled-RSS-B/key once garbage has run the heap through the collector's
// target as a serving process's calls do (ratelimitd on Redis runs at
// GOGC=400 unless told otherwise: set GOGC to measure it). The store keeps
// nothing. docs/leasing.md gives the numbers and this command:
//
//	GOGC=400 go test -run '^$' -bench Footprint -benchtime 1x -count 5 ./pkg/backend/lease
func BenchmarkFootprint(b *testing.B) {
	for _, keys := range []int{DefaultMaxKeys, 1_000_000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			for b.Loop() {
				e, err := New(admitAll{}, Options{MaxKeys: 2 * keys, Manual: true}) // room in every shard
				if err != nil {
					b.Fatal(err)
				}
				reqs := []algo.Request{{Limit: algo.Limit{Requests: 100, Window: time.Hour}, Hits: 1, Leased: true}}
				out := make([]algo.Decision, 1)
				before := footprint.Baseline()
				for i := range keys {
					reqs[0].Key = fmt.Appendf(reqs[0].Key[:0], "6:search=6:tenant%d:%d|fixed_window/1s", len(strconv.Itoa(i)), i)
					if err := e.Decide(context.Background(), reqs, out); err != nil {
						b.Fatal(err)
					}
				}
				filled := footprint.Take()
				footprint.Cycle()
				cycled := footprint.Take()
				if st := e.Stats(); st.Keys != int64(keys) || st.Evicted != 0 || st.Held != 0 {
					b.Fatalf("%+v after %d one-off keys, want them all tracked, none evicted, nothing held", st, keys)
				}
				footprint.Report(b, before, filled, cycled, keys)
				e.Close(context.Background())
			}
		})
	}
}
