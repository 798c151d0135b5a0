package metrics

import (
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// TestLabelWildcards checks the labels of rules whose wildcards have "*"
// inside the value or several times. They follow envoyproxy/ratelimit's
// statistics names as its TestWildcardConfig (a wildcard without flags is
// named by its pattern) and TestShareThreshold (share_threshold names the
// pattern even with value_to_metric; value_to_metric alone names the
// value) document them.
func TestLabelWildcards(t *testing.T) {
	rs, err := config.Parse(config.File{Name: "glob.yaml", Data: []byte(`
domain: glob
descriptors:
  - {key: midwild, value: bar*b, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: multiwild, value: foo*bar*baz, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: midroute, value: /api*v2, share_threshold: true, value_to_metric: true, rate_limit: {unit: minute, requests_per_unit: 80}}
  - {key: named, value: "*x", value_to_metric: true, rate_limit: {unit: minute, requests_per_unit: 1}}
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - {key: resource, value: res*v2, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 60}}
`)})
	if err != nil {
		t.Fatal(err)
	}
	d := rs.Domain("glob")
	for _, c := range []struct {
		kv   []string
		want string
	}{
		{[]string{"midwild", "bar123b"}, "glob.midwild_bar*b"},
		{[]string{"multiwild", "foo1bar2baz"}, "glob.multiwild_foo*bar*baz"},
		{[]string{"midroute", "/api-beta-v2"}, "glob.midroute_/api*v2"},
		{[]string{"named", "abx"}, "glob.named_abx"},
		{[]string{"tenant", "t1prod", "resource", "resAv2"}, "glob.tenant_t*prod.resource_res*v2"},
	} {
		dsc := desc(c.kv...)
		var r *config.Rule
		for _, rule := range d.Rules() {
			if len(rule.Path) == len(c.kv)/2 && rule.Path[0].Key == c.kv[0] {
				r = rule
			}
		}
		if r == nil {
			t.Fatalf("no rule for %q", c.kv)
		}
		got, ok := appendLabel(nil, r, dsc)
		if !ok || string(got) != c.want {
			t.Errorf("%q: label %q (%v), want %q", c.kv, got, ok, c.want)
		}
	}
}
