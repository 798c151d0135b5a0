package region

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
)

// BenchmarkDecide measures what the engine adds to a decision of a global
// limit: the same one-request batches over 10,000 keys on the memory
// backend, alone and through an engine with two peers whose counts it
// knows for every key, in parallel. Compare the two sub-benchmarks'
// ns/op (benchstat).
func BenchmarkDecide(b *testing.B) {
	const keys = 10_000
	limit := algo.Limit{Algorithm: algo.FixedWindow, Requests: 1_000_000, Window: time.Minute}
	names := make([][]byte, keys)
	for i := range names {
		names[i] = fmt.Appendf(nil, "global_limit\x00user_id\x00user-%d", i)
	}
	run := func(b *testing.B, backend algo.Backend) {
		b.ReportAllocs()
		var callers atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			reqs := make([]algo.Request, 1)
			out := make([]algo.Decision, 1)
			i := int(callers.Add(1)) * keys / 3 // each caller on keys of its own, mostly
			for pb.Next() {
				reqs[0] = algo.Request{Key: names[i%keys], Limit: limit, Hits: 1, Global: algo.GlobalShare}
				if err := backend.Decide(context.Background(), reqs, out); err != nil {
					b.Fatal(err)
				}
				i += 7919 // a prime: the keys in a scattered order
			}
		})
	}
	b.Run("backend", func(b *testing.B) {
		mem := memory.New(memory.Options{MaxKeys: 2 * keys})
		defer mem.Close()
		run(b, mem)
	})
	b.Run("engine", func(b *testing.B) {
		mem := memory.New(memory.Options{MaxKeys: 2 * keys})
		defer mem.Close()
		e, err := New(mem, Options{
			Region: "eu", Peers: []Peer{{Name: "us", Addr: "passthrough:///us"}, {Name: "ap", Addr: "passthrough:///ap"}},
			Store: NewMemoryStore(nil), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Dial:         func(string) (grpc.ClientConnInterface, error) { return nil, nil },
			Authenticate: func(context.Context, string) error { return nil }, // nothing is pushed to it
		})
		if err != nil {
			b.Fatal(err)
		}
		now := time.Now()
		for _, p := range []string{"us", "ap"} {
			e.hear(p, now.Add(time.Hour), 1) // heard throughout: never cut off
			for _, k := range names {
				e.merge(&Count{Region: p, Key: k, Window: windowOf(now, limit.Window), Count: 1}, now)
			}
		}
		run(b, e)
	})
}
