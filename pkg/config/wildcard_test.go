package config

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// TestWildcardMatches checks the matcher on every form of wildcard. The
// cases marked "ref:" mirror the outcomes envoyproxy/ratelimit's
// test/config/config_test.go documents in the named test and sub-test.
func TestWildcardMatches(t *testing.T) {
	cases := []struct {
		pattern string
		yes, no []string
	}{
		// ref: TestWildcardConfig, the trailing wildcard "foo*".
		{"foo*", []string{"foo1", "foo2", "foo", "foo*"}, []string{"bar", "fo", "xfoo1"}},
		// ref: TestWildcardConfig, the middle wildcard "bar*b" (a "*" may
		// match nothing: "barb").
		{"bar*b", []string{"barab", "bar123b", "barb"}, []string{"bara", "xbarb", "bar", "ba"}},
		// ref: TestWildcardConfig, several wildcards "foo*bar*baz".
		{"foo*bar*baz", []string{"foo123bar456baz", "foobarbaz"}, []string{"foo123baz", "bar456baz", "foobazbar"}},
		// ref: TestShareThreshold, "share_threshold with middle wildcard".
		{"/api*v1", []string{"/api/v1", "/api-beta-v1", "/apiXYZv1", "/apiv1"}, []string{"/api/v2", "/api/v1/", "api/v1"}},
		// ref: TestShareThreshold, "share_threshold with multi-wildcard".
		{"svc*ep*rpc", []string{"svcAepBrpc", "svcXXXepYYYrpc", "svceprpc"}, []string{"svcABCrpc", "svcep", "epsvcrpc"}},
		// ref: TestShareThreshold, "share_threshold with nested middle
		// wildcards".
		{"t*prod", []string{"t1prod", "t99prod", "tprod"}, []string{"t1dev", "prod"}},
		{"res*v2", []string{"resAv2", "resBBBv2"}, []string{"resAv1"}},
		// "*" alone matches every value, the empty one included.
		{"*", []string{"", "x", "/any/thing", "*"}, nil},
		{"**", []string{"", "x"}, nil},
		// A leading "*": a suffix.
		{"*foo", []string{"foo", "xfoo", "foofoo"}, []string{"fo", "foox", ""}},
		{"*.pdf", []string{"a.pdf", ".pdf"}, []string{"a.pdfx", "pdf"}},
		// The first and last pieces never overlap.
		{"ab*ba", []string{"abba", "ab-ba", "ababa"}, []string{"aba", "ab"}},
		{"a*a", []string{"aa", "aba"}, []string{"a"}},
		{"a*a*a", []string{"aaa", "abaca"}, []string{"aa", "aba"}},
		// Leftmost middle pieces: "x*ab*abc" must not be fooled by an early
		// "ab" that a later piece needs.
		{"x*ab*abc", []string{"xababc", "xabqabc"}, []string{"xabc", "xab"}},
		{"*a*", []string{"a", "bab"}, []string{"", "b"}},
	}
	for _, c := range cases {
		w := newWildcard("k", c.pattern, nil)
		for _, v := range c.yes {
			if !w.matches(v) {
				t.Errorf("%q does not match %q; it should", c.pattern, v)
			}
		}
		for _, v := range c.no {
			if w.matches(v) {
				t.Errorf("%q matches %q; it should not", c.pattern, v)
			}
		}
	}
}

// TestWildcardFastPath checks that a value with one trailing "*", the only
// form before wildcards anywhere were accepted, is still matched by a
// prefix alone.
func TestWildcardFastPath(t *testing.T) {
	for pattern, prefix := range map[string]string{"foo*": "foo", "*": "", "/files/*": "/files/"} {
		if w := newWildcard("k", pattern, nil); w.parts != nil || w.prefix != prefix {
			t.Errorf("%q compiled to prefix %q, parts %q; want the prefix %q alone", pattern, w.prefix, w.parts, prefix)
		}
	}
	for _, pattern := range []string{"*foo", "a*b", "a**", "**"} {
		if w := newWildcard("k", pattern, nil); w.parts == nil {
			t.Errorf("%q compiled to the prefix %q alone", pattern, w.prefix)
		}
	}
}

// TestWildcardAgreesWithOracle compares the matcher with a plain
// backtracking one on random patterns and values over a small alphabet, so
// that pieces repeat and overlap often.
func TestWildcardAgreesWithOracle(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	str := func(alphabet string, max int) string {
		b := make([]byte, rng.IntN(max+1))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(b)
	}
	matched := 0
	for range 200_000 {
		pattern := str("ab*", 7)
		if !isWildcard(pattern) {
			pattern += "*"
		}
		v := str("ab", 9)
		w := newWildcard("k", pattern, nil)
		got, want := w.matches(v), globOracle(pattern, v)
		if got != want {
			t.Fatalf("%q against %q: %v, want %v", pattern, v, got, want)
		}
		if got {
			matched++
		}
	}
	if matched < 20_000 || matched > 180_000 {
		t.Errorf("%d of 200000 random pairs matched; the test should see both outcomes often", matched)
	}
}

// TestWildcardRules loads wildcards of every form and checks which rule a
// descriptor gets and whether its level shares one counter (the pattern
// stands in the counter key, see pkg/service) or counts per value. The
// cases marked "ref:" mirror envoyproxy/ratelimit's TestWildcardConfig and
// TestShareThreshold (test/config/config_test.go, rules in
// test/config/wildcard.yaml and share_threshold.yaml).
func TestWildcardRules(t *testing.T) {
	d := parse(t, `
domain: glob
descriptors:
  - {key: midpath, value: /api*v1, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 100}}
  - {key: midwild, value: bar*b, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: multiroute, value: svc*ep*rpc, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 50}}
  - {key: multiwild, value: foo*bar*baz, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: any, value: "*", rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: anyshared, value: "*", share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 2}}
  - {key: suffix, value: "*.pdf", rate_limit: {unit: minute, requests_per_unit: 3}}
  - {key: suffixshared, value: "*.pdf", share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 4}}
  - {key: file, value: test1, rate_limit: {unit: minute, requests_per_unit: 50}}
  - {key: file, value: test*, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 100}}
  - {key: order, value: "a*", rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: order, value: "ab*", rate_limit: {unit: minute, requests_per_unit: 2}}
  - {key: order, rate_limit: {unit: minute, requests_per_unit: 3}}
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - {key: resource, value: res*v2, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 60}}
`).Domain("glob")
	type probe struct {
		entries entries
		want    string // rule ID, "" for none
		shared  []bool // per level: does it share one counter?
	}
	probes := []probe{
		// ref: TestShareThreshold, "share_threshold with middle wildcard".
		{entries{{"midpath", "/api/v1"}}, "glob.midpath_/api*v1", []bool{true}},
		{entries{{"midpath", "/api-beta-v1"}}, "glob.midpath_/api*v1", []bool{true}},
		{entries{{"midpath", "/apiXYZv1"}}, "glob.midpath_/api*v1", []bool{true}},
		{entries{{"midpath", "/api/v2"}}, "", nil},
		// ref: TestWildcardConfig, middle wildcard without share_threshold:
		// one rule, a counter per value.
		{entries{{"midwild", "barab"}}, "glob.midwild_bar*b", []bool{false}},
		{entries{{"midwild", "barb"}}, "glob.midwild_bar*b", []bool{false}},
		{entries{{"midwild", "bara"}}, "", nil},
		{entries{{"midwild", "xbarb"}}, "", nil},
		// ref: TestShareThreshold, "share_threshold with multi-wildcard".
		{entries{{"multiroute", "svcAepBrpc"}}, "glob.multiroute_svc*ep*rpc", []bool{true}},
		{entries{{"multiroute", "svceprpc"}}, "glob.multiroute_svc*ep*rpc", []bool{true}},
		{entries{{"multiroute", "svcABCrpc"}}, "", nil},
		// ref: TestWildcardConfig, several wildcards without share_threshold.
		{entries{{"multiwild", "foo123bar456baz"}}, "glob.multiwild_foo*bar*baz", []bool{false}},
		{entries{{"multiwild", "foo123baz"}}, "", nil},
		// "*" alone, and a leading "*", with and without share_threshold.
		{entries{{"any", "whatever"}}, "glob.any_*", []bool{false}},
		{entries{{"any", ""}}, "glob.any_*", []bool{false}},
		{entries{{"anyshared", "whatever"}}, "glob.anyshared_*", []bool{true}},
		{entries{{"suffix", "a.pdf"}}, "glob.suffix_*.pdf", []bool{false}},
		{entries{{"suffix", "a.pdf.gz"}}, "", nil},
		{entries{{"suffixshared", "b.pdf"}}, "glob.suffixshared_*.pdf", []bool{true}},
		// ref: TestShareThreshold, "Explicit value precedence over
		// wildcard": the exact value has its own rule and counter.
		{entries{{"file", "test1"}}, "glob.file_test1", []bool{false}},
		{entries{{"file", "test23"}}, "glob.file_test*", []bool{true}},
		// The first wildcard in file order wins, but a value that is a
		// later wildcard's pattern, byte for byte, is an exact match of it,
		// as in the reference (which looks it up as key_value first).
		{entries{{"order", "abc"}}, "glob.order_a*", []bool{false}},
		{entries{{"order", "ab*"}}, "glob.order_ab*", []bool{false}},
		{entries{{"order", "zz"}}, "glob.order", []bool{false}},
		// ref: TestShareThreshold, "share_threshold with nested middle
		// wildcards": both levels share.
		{entries{{"tenant", "t1prod"}, {"resource", "resAv2"}}, "glob.tenant_t*prod.resource_res*v2", []bool{true, true}},
		{entries{{"tenant", "t99prod"}, {"resource", "resBBBv2"}}, "glob.tenant_t*prod.resource_res*v2", []bool{true, true}},
		{entries{{"tenant", "t1dev"}, {"resource", "resAv2"}}, "", nil},
	}
	for _, p := range probes {
		r := d.Match(&p.entries)
		got := ""
		if r != nil {
			got = r.ID
		}
		if got != p.want {
			t.Errorf("Match(%q) = %q, want %q", p.entries, got, p.want)
			continue
		}
		if r == nil {
			continue
		}
		for i, e := range r.Path {
			if e.ShareThreshold != p.shared[i] {
				t.Errorf("Match(%q): level %d shares one counter: %v, want %v", p.entries, i, e.ShareThreshold, p.shared[i])
			}
			if e.Wildcard != strings.Contains(e.Value, "*") {
				t.Errorf("Match(%q): level %d %+v: Wildcard disagrees with its value", p.entries, i, e)
			}
		}
	}
}

func BenchmarkWildcard(b *testing.B) {
	for _, c := range []struct{ name, pattern, value string }{
		{"prefix", "/files/*", "/files/report.pdf"},
		{"middle", "/api*v1", "/api/users/v1"},
		{"several", "svc*ep*rpc", "svcUsersepGetrpc"},
	} {
		w := newWildcard("k", c.pattern, nil)
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if !w.matches(c.value) {
					b.Fatal("no match")
				}
			}
		})
	}
}
