package xds

import (
	"strings"
	"testing"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/ratelimitd/ratelimitd/pkg/config"
)

func anys(t *testing.T, cs ...*rlsconfv3.RateLimitConfig) []*anypb.Any {
	t.Helper()
	out := make([]*anypb.Any, len(cs))
	for i, c := range cs {
		a, err := anypb.New(c)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = a
	}
	return out
}

// TestParseMeansWhatAFileMeans converts a resource using every field the
// proto has and checks the rules equal those of the same rules written as
// a file.
func TestParseMeansWhatAFileMeans(t *testing.T) {
	res := &rlsconfv3.RateLimitConfig{Name: "mail", Domain: "messaging", Descriptors: []*rlsconfv3.RateLimitDescriptor{
		{Key: "message_type", Value: "marketing", Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key:            "to_number",
			RateLimit:      &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_DAY, RequestsPerUnit: 5, Name: "daily"},
			ShadowMode:     true,
			DetailedMetric: true,
		}}},
		{Key: "to_number", Value: "2061234567", RateLimit: &rlsconfv3.RateLimitPolicy{
			Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 0,
			Replaces: []*rlsconfv3.RateLimitReplace{{Name: "daily"}},
		}},
		{Key: "vip", RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true}},
	}}
	got, err := Parse(anys(t, res))
	if err != nil {
		t.Fatal(err)
	}
	want, err := config.Parse(config.File{Name: "xds:mail", Data: []byte(`
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5, name: daily}
        shadow_mode: true
        detailed_metric: true
  - key: to_number
    value: "2061234567"
    rate_limit:
      unit: second
      requests_per_unit: 0
      replaces: [{name: daily}]
  - key: vip
    rate_limit: {unlimited: true}
`)})
	if err != nil {
		t.Fatal(err)
	}
	if files := got.Files(); len(files) != 1 || files[0] != "xds:mail" {
		t.Fatalf("files %v, want [xds:mail]", files)
	}
	gr, wr := got.Domain("messaging").Rules(), want.Domain("messaging").Rules()
	if len(gr) != 3 || len(gr) != len(wr) {
		t.Fatalf("%d rules, want %d (3)", len(gr), len(wr))
	}
	for i := range gr {
		g, w := *gr[i], *wr[i]
		g.Line, w.Line = 0, 0 // the generated YAML is laid out differently
		if g.ID != w.ID || g.Name != w.Name || g.Unlimited != w.Unlimited || g.ShadowMode != w.ShadowMode ||
			g.DetailedMetric != w.DetailedMetric || g.RequestsPerUnit != w.RequestsPerUnit || g.Unit != w.Unit ||
			g.Window != w.Window || strings.Join(g.Replaces, ",") != strings.Join(w.Replaces, ",") || len(g.Limits) != len(w.Limits) {
			t.Errorf("rule %d:\n got %+v\nwant %+v", i, g, w)
		}
	}
}

// TestParseRejects: what a file may not hold, a resource may not either,
// and the error names the resource and the field.
func TestParseRejects(t *testing.T) {
	limit := func(p *rlsconfv3.RateLimitPolicy) *rlsconfv3.RateLimitConfig {
		return &rlsconfv3.RateLimitConfig{Name: "r", Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "k", RateLimit: p}}}
	}
	for _, tc := range []struct {
		name string
		res  []*rlsconfv3.RateLimitConfig
		want string
	}{
		{"unit UNKNOWN", []*rlsconfv3.RateLimitConfig{limit(&rlsconfv3.RateLimitPolicy{RequestsPerUnit: 1})}, `xds:r:`},
		{"unit no enum names", []*rlsconfv3.RateLimitConfig{limit(&rlsconfv3.RateLimitPolicy{Unit: 99, RequestsPerUnit: 1})}, `unknown unit "99"`},
		{"unlimited with a unit", []*rlsconfv3.RateLimitConfig{limit(&rlsconfv3.RateLimitPolicy{Unlimited: true, Unit: rlsconfv3.RateLimitUnit_SECOND})}, "unlimited"},
		{"replaces nothing", []*rlsconfv3.RateLimitConfig{limit(&rlsconfv3.RateLimitPolicy{Unit: 1, RequestsPerUnit: 1, Replaces: []*rlsconfv3.RateLimitReplace{{Name: "ghost"}}})}, `"ghost"`},
		{"no domain", []*rlsconfv3.RateLimitConfig{{Name: "r"}}, "domain"},
		{"a domain twice", []*rlsconfv3.RateLimitConfig{
			{Name: "a", Domain: "d"}, {Name: "b", Domain: "d"},
		}, "already defined in xds:a"},
		{"a name twice", []*rlsconfv3.RateLimitConfig{{Name: "a", Domain: "d"}, {Name: "a", Domain: "e"}}, `two resources are named "a"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rules, err := Parse(anys(t, tc.res...))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse = %v, %v; want an error holding %q", rules, err, tc.want)
			}
		})
	}
	other, _ := anypb.New(&rlsconfv3.RateLimitReplace{Name: "x"})
	if _, err := Parse([]*anypb.Any{other}); err == nil || !strings.Contains(err.Error(), "not a RateLimitConfig") {
		t.Fatalf("a resource of another type: %v", err)
	}
}

// TestParseOrder: the same resources in any order make the same rules.
func TestParseOrder(t *testing.T) {
	a := &rlsconfv3.RateLimitConfig{Name: "a", Domain: "da", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "k", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: 2, RequestsPerUnit: 3}}}}
	b := &rlsconfv3.RateLimitConfig{Name: "b", Domain: "db"}
	r1, err := Parse(anys(t, a, b))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := Parse(anys(t, b, a))
	if err != nil {
		t.Fatal(err)
	}
	if r1.Hash() != r2.Hash() || strings.Join(r1.Files(), ",") != "xds:a,xds:b" {
		t.Fatalf("hashes %s %s, files %v", r1.Hash(), r2.Hash(), r1.Files())
	}
	empty, err := Parse(nil)
	if err != nil || len(empty.Domains()) != 0 {
		t.Fatalf("no resources: %v, %v; want an empty rule set", empty, err)
	}
}

func TestParsePairs(t *testing.T) {
	m, err := ParsePairs(" region = eu-west-1 ,pod=rl-0,empty=")
	if err != nil || len(m) != 3 || m["region"] != "eu-west-1" || m["pod"] != "rl-0" || m["empty"] != "" {
		t.Fatalf("ParsePairs = %v, %v", m, err)
	}
	if m, err := ParsePairs(""); err != nil || len(m) != 0 {
		t.Fatalf("empty: %v, %v", m, err)
	}
	for _, bad := range []string{"novalue", "=v", "a=1,a=2"} {
		if _, err := ParsePairs(bad); err == nil {
			t.Errorf("ParsePairs(%q) succeeded", bad)
		}
	}
}
