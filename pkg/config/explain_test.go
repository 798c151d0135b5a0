package config

import (
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// explainRules has every way to match: exact values, key-only defaults,
// overlapping wildcards (with and without share_threshold, and "*"),
// nested levels with and without limits of their own, a descriptor
// without a rate_limit, an unlimited rule and a shadow rule.
const explainRules = `
domain: explain
descriptors:
  - key: user_id
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: user_id
    value: admin
    rate_limit: {unlimited: true}
  - key: user_id
    value: bot-*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: user_id
    value: bot-crawler
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /files/*
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value: /files/big/*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: path
    value: "*"
    descriptors:
      - key: method
        value: GET
        rate_limit: {unit: second, requests_per_unit: 100}
      - key: method
        rate_limit: {unit: second, requests_per_unit: 50}
  - key: tenant
    descriptors:
      - key: model
        value: gpt-*
        share_threshold: true
        descriptors:
          - key: user_id
            rate_limit: {unit: hour, requests_per_unit: 1000}
          - key: user_id
            value: a*
            rate_limit: {unit: hour, requests_per_unit: 5}
      - key: model
        value: gpt-4
        rate_limit: {unit: minute, requests_per_unit: 7}
        descriptors:
          - key: region
            value: eu
            rate_limit: {unit: minute, requests_per_unit: 3}
      - key: model
  - key: tenant
    value: acme
    rate_limit: {unit: day, requests_per_unit: 100000}
    descriptors:
      - key: model
        rate_limit: {unit: minute, requests_per_unit: 70}
  - key: healthcheck
`

// globRules has wildcards of every form envoyproxy/ratelimit accepts: "*"
// inside the value, several of them, leading, alone, doubled, overlapping
// each other, with and without share_threshold, on levels with and without
// limits of their own.
const globRules = `
domain: glob
descriptors:
  - key: path
    value: /api*v1
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: path
    value: "*.pdf"
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    value: /api/v1
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: route
    value: svc*ep*rpc
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: route
    value: svc**
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: route
    value: "*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 70}
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - key: resource
        value: res*v2
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 60}
      - key: resource
        value: "*a*a*"
        rate_limit: {unit: minute, requests_per_unit: 61}
`

func explainDomain(t testing.TB) *Domain {
	t.Helper()
	return parse(t, explainRules).Domain("explain")
}

// TestExplainAgreesWithMatch explains many random descriptors and checks
// that Explain always ends with the rule Match returns, and that its steps
// are consistent with it. The descriptors are walks down the rules' paths
// (exact values, values matching or nearly matching wildcards, any value
// for key-only descriptors), cut short, extended or altered at random, so
// that every outcome and every kind of match is reached often. The rule
// sets are explainRules, the reference rule file and the examples.
func TestExplainAgreesWithMatch(t *testing.T) {
	domains := []*Domain{explainDomain(t), parse(t, globRules).Domain("glob")}
	for _, path := range []string{"testdata/valid/reference.yaml", "../../examples"} {
		rules, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		domains = append(domains, rules.Domains()...)
	}
	n := 8000
	if testing.Short() {
		n = 1000
	}
	rng := rand.New(rand.NewPCG(1, 2))
	outcomes := make(map[Outcome]int)
	kinds := make(map[MatchKind]int)
	for _, d := range domains {
		g := newDescGen(d)
		for range n {
			desc := g.descriptor(rng)
			want := d.Match(&desc)
			e := d.Explain(&desc)
			if e.Rule != want {
				t.Fatalf("domain %s, descriptor %q: Explain's rule %v, Match's %v\n%s",
					d.Name, desc, ruleName(e.Rule), ruleName(want), strings.Join(e.Why(), "\n"))
			}
			checkExplanation(t, desc, &e)
			outcomes[e.Outcome]++
			for _, s := range e.Steps {
				kinds[s.Kind]++
			}
		}
	}
	// The generator must reach every outcome and kind often, or the
	// property proves less than it claims.
	total := n * len(domains)
	for _, o := range []Outcome{Matched, EntryUnmatched, NoRateLimit, EmptyDescriptor} {
		if outcomes[o] < total/100 {
			t.Errorf("only %d of %d random descriptors had outcome %v", outcomes[o], total, o)
		}
	}
	for _, k := range []MatchKind{NoMatch, ByValue, ByWildcard, ByKeyDefault} {
		if kinds[k] < total/100 {
			t.Errorf("only %d steps matched by %v", kinds[k], k)
		}
	}
	t.Logf("%d descriptors over %d domains: outcomes %v, steps by kind %v", total, len(domains), outcomes, kinds)
}

// descGen makes random descriptors for a domain from its rules' paths.
type descGen struct {
	paths  [][]PathElem
	keys   []string
	values []string
}

func newDescGen(d *Domain) *descGen {
	g := &descGen{keys: []string{"unknown"}, values: []string{"", "x", "*"}}
	for _, r := range d.Rules() {
		g.paths = append(g.paths, r.Path)
		for _, e := range r.Path {
			g.keys = append(g.keys, e.Key)
			// The value itself (a wildcard's pattern taken literally) and,
			// for a wildcard, its pattern with every "*" dropped.
			g.values = append(g.values, e.Value, strings.ReplaceAll(e.Value, "*", ""))
		}
	}
	return g
}

func (g *descGen) descriptor(rng *rand.Rand) entries {
	if rng.IntN(50) == 0 {
		return entries{}
	}
	path := g.paths[rng.IntN(len(g.paths))]
	var desc entries
	for _, e := range path {
		desc = append(desc, [2]string{e.Key, g.value(rng, e)})
	}
	switch rng.IntN(8) {
	case 0: // cut short
		desc = desc[:rng.IntN(len(desc))]
		if len(desc) == 0 {
			desc = entries{{g.keys[rng.IntN(len(g.keys))], g.values[rng.IntN(len(g.values))]}}
		}
	case 1: // one more entry
		desc = append(desc, [2]string{g.keys[rng.IntN(len(g.keys))], g.values[rng.IntN(len(g.values))]})
	case 2: // another key
		desc[rng.IntN(len(desc))][0] = g.keys[rng.IntN(len(g.keys))]
	case 3: // another value
		desc[rng.IntN(len(desc))][1] = g.values[rng.IntN(len(g.values))]
	}
	return desc
}

// value returns a value for an entry walking to e: mostly one that matches
// it, sometimes a near miss.
func (g *descGen) value(rng *rand.Rand, e PathElem) string {
	switch rng.IntN(6) {
	case 0:
		return g.values[rng.IntN(len(g.values))]
	case 1: // a near miss: one byte of the value, or of a wildcard's literal text, dropped
		if lit := strings.ReplaceAll(e.Value, "*", ""); lit != "" {
			i := rng.IntN(len(lit))
			return lit[:i] + lit[i+1:]
		}
	}
	switch {
	case e.Value == "":
		return g.values[rng.IntN(len(g.values))] + "v"
	case e.Wildcard:
		// Each "*" stands for a run of its own: empty, a byte, several, or
		// a "*" (the pattern taken literally when every run is one).
		var b strings.Builder
		for i, part := range strings.Split(e.Value, "*") {
			if i > 0 {
				b.WriteString([]string{"", "1", "abc", "*"}[rng.IntN(4)])
			}
			b.WriteString(part)
		}
		return b.String()
	}
	return e.Value
}

// globOracle reports whether v matches pattern, each "*" matching any run
// of bytes: a plain backtracking matcher, written independently of the
// package's, for the tests to judge it by.
func globOracle(pattern, v string) bool {
	if pattern == "" {
		return v == ""
	}
	if pattern[0] == '*' {
		for i := 0; i <= len(v); i++ {
			if globOracle(pattern[1:], v[i:]) {
				return true
			}
		}
		return false
	}
	return v != "" && v[0] == pattern[0] && globOracle(pattern[1:], v[1:])
}

func ruleName(r *Rule) string {
	if r == nil {
		return "none"
	}
	return r.ID
}

// checkExplanation checks that e is a consistent explanation of desc.
func checkExplanation(t *testing.T, desc entries, e *Explanation) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("descriptor %q: "+format+"\n%s", append([]any{desc}, append(args, strings.Join(e.Why(), "\n"))...)...)
	}
	if len(e.Steps) > len(desc) {
		fail("%d steps for %d entries", len(e.Steps), len(desc))
	}
	for i, s := range e.Steps {
		if s.Key != desc[i][0] || s.Value != desc[i][1] {
			fail("step %d is for entry %q=%q", i, s.Key, s.Value)
		}
		if s.Kind == NoMatch {
			if i != len(e.Steps)-1 || s.Rule != nil || s.Elem != (PathElem{}) || len(s.Outranked) != 0 {
				fail("step %d matched nothing but the walk went on or it names a match", i)
			}
			for _, a := range s.Available {
				if a.Key == s.Key && (a.Value == "" || a.Value == s.Value || a.Wildcard && globOracle(a.Value, s.Value)) {
					fail("step %d matched nothing, yet it lists %+v, which matches", i, a)
				}
			}
			continue
		}
		if s.Elem.Key != s.Key {
			fail("step %d matched a descriptor of key %q", i, s.Elem.Key)
		}
		switch s.Kind {
		case ByValue: // a wildcard too, when the value is its pattern
			if s.Elem.Value != s.Value {
				fail("step %d matched by value %+v", i, s.Elem)
			}
		case ByWildcard:
			if !s.Elem.Wildcard || !globOracle(s.Elem.Value, s.Value) {
				fail("step %d matched by wildcard %+v", i, s.Elem)
			}
		case ByKeyDefault:
			if s.Elem.Value != "" {
				fail("step %d matched by key default %+v", i, s.Elem)
			}
		}
		for _, o := range s.Outranked {
			if o.Key != s.Key || elemKind(o) < s.Kind || o.Wildcard && !globOracle(o.Value, s.Value) {
				fail("step %d: %+v outranked by a %v match", i, o, s.Kind)
			}
		}
	}
	switch e.Outcome {
	case EmptyDescriptor:
		if len(desc) != 0 || e.Rule != nil || len(e.Steps) != 0 {
			fail("outcome %v", e.Outcome)
		}
	case EntryUnmatched:
		if e.Rule != nil || len(e.Steps) == 0 || e.Steps[len(e.Steps)-1].Kind != NoMatch {
			fail("outcome %v", e.Outcome)
		}
	case NoRateLimit:
		if e.Rule != nil || len(e.Steps) != len(desc) || e.Steps[len(e.Steps)-1].Rule != nil {
			fail("outcome %v", e.Outcome)
		}
	case Matched:
		if e.Rule == nil || len(e.Steps) != len(desc) || e.Steps[len(e.Steps)-1].Rule != e.Rule {
			fail("outcome %v", e.Outcome)
		}
		// The path walked is the rule's path, flags included.
		for i, s := range e.Steps {
			if !reflect.DeepEqual(s.Elem, e.Rule.Path[i]) {
				fail("step %d matched %+v, the rule's path has %+v", i, s.Elem, e.Rule.Path[i])
			}
		}
	default:
		fail("outcome %v", e.Outcome)
	}
	if len(e.Why()) != len(e.Steps)+1 {
		fail("%d sentences for %d steps", len(e.Why()), len(e.Steps))
	}
}

// elemKind is the match kind a descriptor of the rule file gives.
func elemKind(e PathElem) MatchKind {
	switch {
	case e.Value == "":
		return ByKeyDefault
	case e.Wildcard:
		return ByWildcard
	}
	return ByValue
}

func TestExplain(t *testing.T) {
	d := explainDomain(t)
	cases := []struct {
		name    string
		desc    entries
		outcome Outcome
		rule    string // rule ID, "" for none
		kinds   []MatchKind
		why     []string // substrings of Why, in order, each in its own sentence
	}{
		{"exact value", entries{{"user_id", "admin"}}, Matched, "explain.user_id_admin", []MatchKind{ByValue},
			[]string{`level 1: entry "user_id"="admin" matched the descriptor with key "user_id" and value "admin" exactly; it holds rule explain.user_id_admin (test.yaml:6); it outranks "user_id" (any value), which matches too`,
				"result: rule explain.user_id_admin (test.yaml:6) matches"}},
		{"exact value outranks a wildcard", entries{{"user_id", "bot-crawler"}}, Matched, "explain.user_id_bot-crawler", []MatchKind{ByValue},
			[]string{`it outranks "user_id"="bot-*" (wildcard), "user_id" (any value), which match too`, "result"}},
		{"key default", entries{{"user_id", "42"}}, Matched, "explain.user_id", []MatchKind{ByKeyDefault},
			[]string{`level 1: entry "user_id"="42" matched the key-only descriptor "user_id" (any value): no descriptor of key "user_id" has the exact value and no wildcard of it matches; it holds rule explain.user_id (test.yaml:4)`,
				"result: rule explain.user_id (test.yaml:4) matches"}},
		{"wildcard with share_threshold", entries{{"user_id", "bot-7"}}, Matched, "explain.user_id_bot-*", []MatchKind{ByWildcard},
			[]string{`matched the wildcard "user_id"="bot-*" (wildcard), the first wildcard of key "user_id" in file order whose prefix starts the value (no descriptor has the exact value); with share_threshold, every value matching it shares one counter; it holds rule explain.user_id_bot-* (test.yaml:9); it outranks "user_id" (any value)`,
				"result"}},
		{"wildcard without share_threshold, first in file order", entries{{"path", "/files/big/a.iso"}}, Matched, "explain.path_/files/*", []MatchKind{ByWildcard},
			[]string{`matched the wildcard "path"="/files/*" (wildcard), the first wildcard of key "path" in file order whose prefix starts the value (no descriptor has the exact value); without share_threshold, each value has its own counter; it holds rule explain.path_/files/* (test.yaml:17); it outranks "path"="/files/big/*" (wildcard), "path"="*" (wildcard), which match too`,
				"result"}},
		{"nested levels", entries{{"tenant", "t1"}, {"model", "gpt-4o"}, {"user_id", "zed"}}, Matched, "explain.tenant.model_gpt-*.user_id",
			[]MatchKind{ByKeyDefault, ByWildcard, ByKeyDefault},
			[]string{`level 1: entry "tenant"="t1" matched the key-only descriptor "tenant" (any value)`,
				`level 2: entry "model"="gpt-4o" matched the wildcard "model"="gpt-*" (wildcard)`,
				`level 3: entry "user_id"="zed" matched the key-only descriptor "user_id" (any value)`,
				"result: rule explain.tenant.model_gpt-*.user_id"}},
		{"no fallback to the key default deeper down", entries{{"tenant", "acme"}, {"model", "gpt-4"}}, Matched, "explain.tenant_acme.model", []MatchKind{ByValue, ByKeyDefault},
			[]string{`level 1: entry "tenant"="acme" matched the descriptor with key "tenant" and value "acme" exactly; it holds rule explain.tenant_acme (test.yaml:51); it outranks "tenant" (any value), which matches too`,
				`level 2: entry "model"="gpt-4" matched the key-only descriptor "model" (any value)`,
				"result: rule explain.tenant_acme.model"}},
		{"no match, the key is absent", entries{{"color", "red"}}, EntryUnmatched, "", []MatchKind{NoMatch},
			[]string{`level 1: entry "color"="red" matches nothing at this level: no descriptor has key "color"; the level offers "healthcheck" (any value), "path"="/files/*" (wildcard), "path"="/files/big/*" (wildcard), "path"="*" (wildcard), "tenant"="acme", "tenant" (any value), "user_id"="admin", "user_id"="bot-crawler", "user_id"="bot-*" (wildcard), "user_id" (any value)`,
				"result: no rule, level 1 matched nothing"}},
		{"no match, the value is absent", entries{{"tenant", "x"}, {"model", "gpt-4"}, {"region", "us"}}, EntryUnmatched, "", []MatchKind{ByKeyDefault, ByValue, NoMatch},
			[]string{"level 1", `level 2: entry "model"="gpt-4" matched the descriptor with key "model" and value "gpt-4" exactly; it holds rule explain.tenant.model_gpt-4 (test.yaml:43); it outranks "model"="gpt-*" (wildcard), "model" (any value), which match too`,
				`level 3: entry "region"="us" matches nothing at this level: key "region" is here only as "region"="eu", and there is no key-only descriptor "region" for any value`,
				"result: no rule, level 3 matched nothing"}},
		{"no match, too many entries", entries{{"user_id", "42"}, {"path", "/"}}, EntryUnmatched, "", []MatchKind{ByKeyDefault, NoMatch},
			[]string{"level 1", `level 2: entry "path"="/" matches nothing at this level: the descriptor matched at level 1 has no nested descriptors, so no rule has as many entries as this descriptor`,
				"result: no rule, level 2 matched nothing"}},
		{"no rate limit, too few entries", entries{{"path", "/x"}}, NoRateLimit, "", []MatchKind{ByWildcard},
			[]string{`level 1: entry "path"="/x" matched the wildcard "path"="*" (wildcard)`,
				`result: no rule, the descriptor ends at level 1 on a descriptor without a rate_limit of its own; the rules below it need more entries: "method"="GET", "method" (any value)`}},
		{"no rate limit, a descriptor left unlimited", entries{{"healthcheck", "x"}}, NoRateLimit, "", []MatchKind{ByKeyDefault},
			[]string{`level 1: entry "healthcheck"="x" matched the key-only descriptor "healthcheck" (any value)`,
				"result: no rule, the descriptor ends at level 1 on a descriptor without a rate_limit of its own"}},
		{"empty descriptor", entries{}, EmptyDescriptor, "", nil, []string{"result: no rule, the descriptor has no entries"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := d.Explain(&c.desc)
			checkExplanation(t, c.desc, &e)
			if e.Outcome != c.outcome || ruleName(e.Rule) != cmpName(c.rule) {
				t.Errorf("outcome %v rule %s, want %v %s", e.Outcome, ruleName(e.Rule), c.outcome, cmpName(c.rule))
			}
			var kinds []MatchKind
			for _, s := range e.Steps {
				kinds = append(kinds, s.Kind)
			}
			if !reflect.DeepEqual(kinds, c.kinds) {
				t.Errorf("kinds %v, want %v", kinds, c.kinds)
			}
			why := e.Why()
			j := 0
			for _, w := range c.why {
				for j < len(why) && !strings.Contains(why[j], w) {
					j++
				}
				if j == len(why) {
					t.Errorf("no sentence (in order) contains %q:\n%s", w, strings.Join(why, "\n"))
					break
				}
				j++
			}
		})
	}
}

func cmpName(id string) string {
	if id == "" {
		return "none"
	}
	return id
}

// TestExplainShareThresholdOnIntermediateLevels checks that a wildcard
// level without a rule of its own still reports its share_threshold, from
// the rules below it.
func TestExplainShareThresholdOnIntermediateLevels(t *testing.T) {
	d := explainDomain(t)
	e := d.Explain(&entries{{"tenant", "t"}, {"model", "gpt-9"}})
	if e.Outcome != NoRateLimit || len(e.Steps) != 2 {
		t.Fatalf("explanation %+v", e)
	}
	want := PathElem{Key: "model", Value: "gpt-*", Wildcard: true, ShareThreshold: true}
	if s := e.Steps[1]; s.Kind != ByWildcard || s.Elem != want || s.Rule != nil {
		t.Errorf("step %+v, want a wildcard match of %+v without a rule", s, want)
	}
}

func TestExplainCapsLists(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: many\ndescriptors:\n")
	for i := range MaxListed + 5 {
		b.WriteString("  - {key: k, value: v" + string(rune('a'+i)) + ", rate_limit: {unit: second, requests_per_unit: 1}}\n")
	}
	d := parse(t, b.String()).Domain("many")
	e := d.Explain(&entries{{"k", "zz"}})
	s := e.Steps[0]
	if len(s.Available) != MaxListed || s.MoreAvailable != 5 {
		t.Errorf("%d listed and %d more, want %d and 5", len(s.Available), s.MoreAvailable, MaxListed)
	}
	if !strings.Contains(e.Why()[0], "and 5 more") {
		t.Errorf("why %q does not count the rest", e.Why()[0])
	}
}

func TestMatchKindAndOutcomeStrings(t *testing.T) {
	for k, want := range map[MatchKind]string{NoMatch: "no_match", ByValue: "value", ByWildcard: "wildcard", ByKeyDefault: "key_default", 9: "match_kind(9)"} {
		if k.String() != want {
			t.Errorf("%d: %q, want %q", k, k.String(), want)
		}
	}
	for o, want := range map[Outcome]string{Matched: "matched", EntryUnmatched: "entry_unmatched", NoRateLimit: "no_rate_limit", EmptyDescriptor: "empty_descriptor", 0: "outcome(0)"} {
		if o.String() != want {
			t.Errorf("%d: %q, want %q", o, o.String(), want)
		}
	}
}
