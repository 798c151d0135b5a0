package refstats_test

import (
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/metrics/refstats"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// BenchmarkReport measures counting one decision of a known key, plain
// and detailed.
func BenchmarkReport(b *testing.B) {
	rs, err := config.Parse(config.File{Name: "rules.yaml", Data: []byte(rules)})
	if err != nil {
		b.Fatal(err)
	}
	dom := rs.Domain("web")
	for _, c := range []struct {
		name string
		d    []string
	}{
		{"plain", []string{"user", "ann"}},
		{"detailed", []string{"to_number", "2061111111"}},
	} {
		b.Run(c.name, func(b *testing.B) {
			st := refstats.New(refstats.Options{})
			d := desc(c.d...)
			rule := dom.Match(entries(d.Entries))
			if rule == nil {
				b.Fatal("no rule")
			}
			r := service.Report{Domain: "web", Rule: rule, Descriptor: d, Outcome: service.OutcomeOK, Hits: 1, Limit: 100, Used: 50}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				st.Report(r)
			}
		})
	}
}

// entries views descriptor entries as a config.Descriptor.
type entries []*rlv3.RateLimitDescriptor_Entry

func (e entries) Len() int                     { return len(e) }
func (e entries) Entry(i int) (string, string) { return e[i].Key, e[i].Value }
