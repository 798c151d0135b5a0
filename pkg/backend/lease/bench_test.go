package lease

import (
	"context"
	"testing"
	"time"

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
