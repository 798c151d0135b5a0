package config

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/footprint"
	"github.com/ratelimitd/ratelimitd/internal/rulegen"
)

// scaleSizes are the rule counts the scale benchmarks compare: a domain
// of rulegen.Routes, route=rN each limiting user.
var scaleSizes = []int{100, 1_000, 10_000, 100_000}

// randomRoutes returns k descriptors route=rN, user=uM of n routes, N
// and M drawn at random.
func randomRoutes(n, k int) []entries {
	rng := rand.New(rand.NewPCG(1, uint64(n)))
	out := make([]entries, k)
	for i := range out {
		out[i] = entries{{rulegen.Key, rulegen.Value(rng.IntN(n))}, {rulegen.Nested, fmt.Sprintf("u%d", rng.IntN(10_000))}}
	}
	return out
}

// BenchmarkMatchRules matches descriptors of routes drawn at random in a
// domain of 100 to 100,000 routes: the cost per match should not grow
// with the rules (a map lookup per entry). docs/performance.md ("Rule
// sets at scale") gives the numbers and this command:
//
//	go test -run '^$' -bench MatchRules -benchmem -count 5 ./pkg/config
func BenchmarkMatchRules(b *testing.B) {
	for _, n := range scaleSizes {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			d := parseRoutes(b, n).Domain("scale")
			descs := randomRoutes(n, 1<<14)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if d.Match(&descs[i&(len(descs)-1)]) == nil {
					b.Fatal("no rule")
				}
				i++
			}
		})
	}
}

// BenchmarkLoadRules parses a generated domain of 10,000 and 100,000
// routes: ns/op is the time to load it, and B/rule the live heap each
// rule holds once loaded (internal/footprint: after a collection, the
// file's bytes and the YAML tree freed), RSS-B/rule and cycled-RSS-B/rule
// the resident set it grew by. docs/performance.md gives the numbers and
// this command:
//
//	go test -run '^$' -bench LoadRules -benchtime 3x -count 3 ./pkg/config
func BenchmarkLoadRules(b *testing.B) {
	for _, n := range scaleSizes[2:] {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			data := rulegen.Routes("scale", n)
			var before, filled, cycled footprint.Sample
			for b.Loop() {
				b.StopTimer()
				before = footprint.Baseline()
				b.StartTimer()
				r, err := Parse(File{Name: "scale.yaml", Data: data})
				if err != nil {
					b.Fatalf("%.500v", err)
				}
				b.StopTimer()
				filled = footprint.Take()
				footprint.Cycle()
				cycled = footprint.Take()
				if got := len(r.Domain("scale").rules); got != n {
					b.Fatalf("%d rules", got)
				}
				runtime.KeepAlive(r)
				b.StartTimer()
			}
			footprint.ReportPer(b, before, filled, cycled, n, "rule")
			b.ReportMetric(float64(len(data))/float64(n), "file-B/rule")
		})
	}
}
