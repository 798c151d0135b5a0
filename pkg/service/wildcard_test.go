package service

import (
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/config"
)

const wildcardRules = `
domain: glob
descriptors:
  - {key: midpath, value: /api*v1, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 3}}
  - {key: midwild, value: bar*b, rate_limit: {unit: minute, requests_per_unit: 3}}
  - {key: multiroute, value: svc*ep*rpc, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 3}}
  - {key: anyshared, value: "*", share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 3}}
  - {key: suffix, value: "*foo", rate_limit: {unit: minute, requests_per_unit: 3}}
  - {key: files, value: /files/*, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 3}}
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - {key: resource, value: res*v2, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 3}}
`

// TestWildcardCounters checks, end to end on the memory backend, that the
// values matching a wildcard with share_threshold count in one counter and
// those matching one without it each in their own, whatever the form of
// the wildcard, as envoyproxy/ratelimit's TestShareThreshold documents
// (its cache key then holds the pattern instead of the value).
func TestWildcardCounters(t *testing.T) {
	for _, c := range []struct {
		name   string
		values [][]string // descriptors, as key, value pairs, all matching one rule
		shared bool
	}{
		{"middle, shared", [][]string{{"midpath", "/api/v1"}, {"midpath", "/api-beta-v1"}, {"midpath", "/apiXYZv1"}}, true},
		{"middle, per value", [][]string{{"midwild", "barab"}, {"midwild", "bar123b"}, {"midwild", "barb"}}, false},
		{"several, shared", [][]string{{"multiroute", "svcAepBrpc"}, {"multiroute", "svcXXXepYYYrpc"}, {"multiroute", "svceprpc"}}, true},
		{"alone, shared", [][]string{{"anyshared", "a"}, {"anyshared", ""}, {"anyshared", "zzz"}}, true},
		{"leading, per value", [][]string{{"suffix", "foo"}, {"suffix", "xfoo"}, {"suffix", "yyfoo"}}, false},
		{"nested, shared", [][]string{{"tenant", "t1prod", "resource", "resAv2"}, {"tenant", "t99prod", "resource", "resBBBv2"}, {"tenant", "tprod", "resource", "resv2"}}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, wildcardRules)
			for i, kv := range c.values {
				st := f.call(t, request("glob", desc(kv...))).Statuses[0]
				want := uint32(2) // a counter of its own
				if c.shared {
					want = uint32(2 - i)
				}
				if st.Code != ok || st.LimitRemaining != want {
					t.Fatalf("%q: %v, remaining %d; want OK with %d remaining", kv, st.Code, st.LimitRemaining, want)
				}
			}
		})
	}
}

// TestWildcardKeys pins the counter keys of descriptors matching
// wildcards: a level with share_threshold contributes its pattern as
// written, any other level its value. The keys of trailing-"*" wildcards,
// the only form before wildcards anywhere were accepted, must never
// change, or counters kept in Redis would be lost on upgrade.
func TestWildcardKeys(t *testing.T) {
	rs, err := config.Parse(config.File{Name: "rules.yaml", Data: []byte(wildcardRules)})
	if err != nil {
		t.Fatal(err)
	}
	d := rs.Domain("glob")
	for _, c := range []struct {
		kv   []string
		want string
	}{
		{[]string{"files", "/files/a.pdf"}, "4:glob*5:files8:/files/*"},
		{[]string{"midpath", "/api/v1"}, "4:glob*7:midpath7:/api*v1"},
		{[]string{"midwild", "bar123b"}, "4:glob=7:midwild7:bar123b"},
		{[]string{"multiroute", "svcAepBrpc"}, "4:glob*10:multiroute10:svc*ep*rpc"},
		{[]string{"anyshared", "a"}, "4:glob*9:anyshared1:*"},
		{[]string{"tenant", "t1prod", "resource", "resAv2"}, "4:glob*6:tenant6:t*prod*8:resource6:res*v2"},
	} {
		dsc := desc(c.kv...)
		r := d.Match((*rlsDescriptor)(dsc))
		if r == nil {
			t.Fatalf("%q matches no rule", c.kv)
		}
		if got := string(appendDescriptor(nil, "glob", dsc, r)); got != c.want {
			t.Errorf("%q: key %q, want %q", c.kv, got, c.want)
		}
	}
}
