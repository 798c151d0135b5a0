package config

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

var update = flag.Bool("update", false, "rewrite testdata/invalid/*.golden from the current errors")

// entries is a Descriptor for tests: key, value pairs. Pass it by pointer,
// as the service passes its descriptors: a pointer converts to an
// interface without allocating.
type entries [][2]string

func (e *entries) Len() int                     { return len(*e) }
func (e *entries) Entry(i int) (string, string) { return (*e)[i][0], (*e)[i][1] }

func parse(t testing.TB, src string) *Rules {
	t.Helper()
	r, err := Parse(File{Name: "test.yaml", Data: []byte(src)})
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return r
}

// TestInvalidRuleFiles loads each file (or directory) in testdata/invalid
// and compares every reported problem with its .golden file.
func TestInvalidRuleFiles(t *testing.T) {
	paths, err := filepath.Glob("testdata/invalid/*")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range paths {
		if strings.HasSuffix(path, ".golden") {
			continue
		}
		name := strings.TrimSuffix(filepath.Base(path), ".yaml")
		t.Run(name, func(t *testing.T) {
			rules, err := Load(path)
			if err == nil {
				t.Fatal("loaded without error")
			}
			if rules != nil {
				t.Error("returned rules along with the error: an invalid set must not half-load")
			}
			for _, e := range unwrap(err) {
				var ce *Error
				if !errors.As(e, &ce) || ce.File == "" || ce.Line == 0 {
					t.Errorf("problem without file and line: %v", e)
				}
			}
			got := err.Error() + "\n"
			golden := filepath.Join("testdata/invalid", name+".golden")
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("errors differ from %s\ngot:\n%s\nwant:\n%s", golden, got, want)
			}
		})
	}
}

func unwrap(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func TestLoadReferenceFormat(t *testing.T) {
	rules, err := Load("testdata/valid/reference.yaml")
	if err != nil {
		t.Fatalf("a file in envoyproxy/ratelimit's format did not load: %v", err)
	}
	d := rules.Domain("edge")
	if d == nil || d.FailureMode != FailClosed {
		t.Fatalf("domain edge: %+v", d)
	}
	byID := map[string]*Rule{}
	for _, r := range d.Rules() {
		byID[r.ID] = r
	}
	day := 24 * time.Hour
	for _, c := range []struct {
		id     string
		n      uint32
		window time.Duration
	}{
		{"edge.remote_address", 10, time.Second},
		{"edge.remote_address_50.0.0.5", 0, time.Second},
		{"edge.path_/files/*", 100, time.Minute},
		{"edge.path_/api/*", 100, time.Minute},
		{"edge.model_42", 1000, 7 * day},
		{"edge.tenant", 5000, 30 * day},
		{"edge.plan", 100000, 365 * day},
		{"edge.device_id", 5, 7 * day},
	} {
		r := byID[c.id]
		if r == nil {
			t.Errorf("rule %s missing; have %v", c.id, keys(byID))
			continue
		}
		if r.RequestsPerUnit != c.n || r.Window != c.window || r.Algorithm != algo.FixedWindow || r.Burst != 0 {
			t.Errorf("%s: %d per %v (%v, burst %d), want %d per %v with fixed_window", c.id,
				r.RequestsPerUnit, r.Window, r.Algorithm, r.Burst, c.n, c.window)
		}
	}
	if r := byID["edge.service.user_user-a"]; r == nil || !r.ShadowMode || !r.DetailedMetric {
		t.Errorf("shadow rule: %+v", r)
	}
	if r := byID["edge.ldap"]; r == nil || !r.Unlimited || r.Window != 0 || r.Unit != 0 || r.UnitMultiplier != 0 {
		t.Errorf("unlimited rule: %+v", r)
	}
	if r := byID["edge.key_2_value_2.user_bkthomps"]; r == nil || !reflect.DeepEqual(r.Replaces, []string{"specific_limit"}) {
		t.Errorf("replacing rule: %+v", r)
	}
	model := byID["edge.model_42"]
	if !model.QuotaMode || model.UnitMultiplier != 7 || model.Unit != Day ||
		!reflect.DeepEqual(model.Metadata, map[string]any{"backend": map[string]any{"name": "small", "tier": 2}}) {
		t.Errorf("model rule: %+v", model)
	}
	files := byID["edge.path_/files/*"]
	if p := files.Path[0]; !p.Wildcard || !p.ShareThreshold || p.Value != "/files/*" {
		t.Errorf("shared wildcard path: %+v", p)
	}
	if files.File != "testdata/valid/reference.yaml" || files.Line != 34 {
		t.Errorf("rule location %s:%d, want testdata/valid/reference.yaml:34", files.File, files.Line)
	}
}

func TestExamplesLoad(t *testing.T) {
	rules, err := Load("../../examples")
	if err != nil {
		t.Fatalf("examples: %v", err)
	}
	var names []string
	for _, d := range rules.Domains() {
		names = append(names, d.Name)
	}
	if want := []string{"accounts", "algorithms", "api", "auth", "exports", "messaging", "posts", "rewards", "search"}; !reflect.DeepEqual(names, want) {
		t.Errorf("example domains %v, want %v", names, want)
	}
	// Every algorithm, a rule with several limits, and a leased limit
	// have an example.
	shown := map[algo.Algorithm]bool{}
	several, leased, slots, slotsAlone := false, false, false, false
	for _, d := range rules.Domains() {
		for _, r := range d.Rules() {
			slots = slots || r.Concurrency != nil
			slotsAlone = slotsAlone || r.Concurrency != nil && len(r.Limits) == 0
			for _, l := range r.Limits {
				shown[l.Algorithm] = true
				leased = leased || l.Consistency == Leased
			}
			several = several || len(r.Limits) > 1
		}
	}
	if !leased {
		t.Error("no example rule is leased")
	}
	if !slots || !slotsAlone {
		t.Errorf("examples show a concurrency limit: %v, one alone: %v; want both", slots, slotsAlone)
	}
	for _, a := range algo.Algorithms() {
		if !shown[a] {
			t.Errorf("no example rule uses %v", a)
		}
	}
	if !several {
		t.Error("no example rule has rate_limits")
	}
}

func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\ndescriptors: [{key: k, rate_limit: {requests_per_unit: 1, unit: second}}]\n")
	write("b.yml", "domain: b\n")
	write("notes.txt", "not a rule file")
	write(".hidden.yaml", "this: is not even valid")
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A ConfigMap-style symbolic link to a file elsewhere is followed.
	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "c.yaml"), []byte("domain: c\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(other, "c.yaml"), filepath.Join(dir, "c.yaml")); err != nil {
		t.Fatal(err)
	}

	rules, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yml"), filepath.Join(dir, "c.yaml")}
	if got := rules.Files(); !reflect.DeepEqual(got, want) {
		t.Errorf("files %v, want %v", got, want)
	}
	if rules.Domain("a") == nil || rules.Domain("b") == nil || rules.Domain("c") == nil || rules.Domain("d") != nil {
		t.Errorf("domains: %v", rules.Domains())
	}
	if len(rules.Hash()) != 64 {
		t.Errorf("hash %q is not a hex SHA-256", rules.Hash())
	}
	again, _ := Load(dir)
	if again.Hash() != rules.Hash() {
		t.Error("the same files hash differently")
	}
	write("b.yml", "domain: b\ndescriptors: []\n")
	changed, _ := Load(dir)
	if changed.Hash() == rules.Hash() {
		t.Error("changed files hash the same")
	}

	if _, err := Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no rule files") {
		t.Errorf("empty directory: err = %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: err = %v", err)
	}
}

func TestMatch(t *testing.T) {
	type probe struct {
		entries entries
		want    string // rule ID, "" for no match
	}
	cases := []struct {
		name   string
		rules  string
		probes []probe
	}{
		{"exact values", `
domain: mongo_cps
descriptors:
  - {key: database, value: users, rate_limit: {unit: second, requests_per_unit: 500}}
  - {key: database, value: default, rate_limit: {unit: second, requests_per_unit: 500}}
`, []probe{
			{entries{{"database", "users"}}, "mongo_cps.database_users"},
			{entries{{"database", "default"}}, "mongo_cps.database_default"},
			{entries{{"database", "other"}}, ""},
			{entries{{"table", "users"}}, ""},
		}},
		{"nested descriptors and key-only defaults", `
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
`, []probe{
			{entries{{"message_type", "marketing"}, {"to_number", "2061111111"}}, "messaging.message_type_marketing.to_number"},
			{entries{{"to_number", "2061111111"}}, "messaging.to_number"},
			{entries{{"message_type", "marketing"}}, ""}, // a placeholder level without a limit
			{entries{{"message_type", "transactional"}, {"to_number", "2061111111"}}, ""},
		}},
		{"exact value wins over the key-only default", `
domain: edge
descriptors:
  - {key: remote_address, rate_limit: {unit: second, requests_per_unit: 10}}
  - {key: remote_address, value: 50.0.0.5, rate_limit: {unit: second, requests_per_unit: 0}}
`, []probe{
			{entries{{"remote_address", "50.0.0.1"}}, "edge.remote_address"},
			{entries{{"remote_address", "50.0.0.5"}}, "edge.remote_address_50.0.0.5"},
			{entries{{"remote_address", ""}}, "edge.remote_address"},
		}},
		{"the descriptor depth must equal the rule depth", `
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit: {requests_per_unit: 300, unit: second}
    descriptors:
      - key: subkey
        rate_limit: {requests_per_unit: 100, unit: second}
  - key: other
    rate_limit: {requests_per_unit: 1, unit: second}
`, []probe{
			{entries{{"key", "value"}}, "example4.key_value"},
			{entries{{"key", "value"}, {"subkey", "subvalue"}}, "example4.key_value.subkey"},
			{entries{{"key", "value"}, {"subkey", "subvalue"}, {"deeper", "x"}}, ""},
			{entries{{"other", "x"}, {"subkey", "subvalue"}}, ""},
			{entries{}, ""},
		}},
		{"an exact value does not fall back to the key-only rule deeper down", `
domain: fallback
descriptors:
  - key: a
    value: x
    descriptors:
      - {key: b, rate_limit: {unit: second, requests_per_unit: 1}}
  - key: a
    descriptors:
      - {key: c, rate_limit: {unit: second, requests_per_unit: 2}}
`, []probe{
			{entries{{"a", "x"}, {"b", "1"}}, "fallback.a_x.b"},
			{entries{{"a", "y"}, {"c", "1"}}, "fallback.a.c"},
			// a=x matched exactly, and its level has no c: no match, even
			// though the key-only a has one.
			{entries{{"a", "x"}, {"c", "1"}}, ""},
		}},
		{"unlimited and whitelisted descriptors", `
domain: internal
descriptors:
  - {key: ldap, rate_limit: {unlimited: true}}
  - {key: azure, rate_limit: {unit: minute, requests_per_unit: 100}}
  - {key: healthcheck}
`, []probe{
			{entries{{"ldap", "x"}}, "internal.ldap"},
			{entries{{"azure", "x"}}, "internal.azure"},
			{entries{{"healthcheck", "x"}}, ""},
		}},
		{"wildcards", `
domain: files
descriptors:
  - {key: path, value: /files/report.pdf, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: path, value: /files/*, rate_limit: {unit: second, requests_per_unit: 10}}
  - {key: path, value: /files/big/*, rate_limit: {unit: second, requests_per_unit: 2}}
  - {key: path, value: "*", rate_limit: {unit: second, requests_per_unit: 1000}}
  - {key: path, rate_limit: {unit: second, requests_per_unit: 5000}}
  - {key: paths, value: x*, rate_limit: {unit: second, requests_per_unit: 7}}
`, []probe{
			{entries{{"path", "/files/report.pdf"}}, "files.path_/files/report.pdf"},
			{entries{{"path", "/files/a.csv"}}, "files.path_/files/*"},
			// The first matching wildcard in file order wins, as in
			// envoyproxy/ratelimit, even when a later one is longer.
			{entries{{"path", "/files/big/a.iso"}}, "files.path_/files/*"},
			{entries{{"path", "/files"}}, "files.path_*"},
			{entries{{"path", ""}}, "files.path_*"},
			{entries{{"paths", "xyz"}}, "files.paths_x*"},
			{entries{{"paths", "y"}}, ""},
		}},
		{"wildcards with nested descriptors", `
domain: models
descriptors:
  - key: model
    value: gpt-*
    share_threshold: true
    descriptors:
      - key: tenant
        rate_limit: {unit: minute, requests_per_unit: 100}
`, []probe{
			{entries{{"model", "gpt-4"}, {"tenant", "acme"}}, "models.model_gpt-*.tenant"},
			{entries{{"model", "llama"}, {"tenant", "acme"}}, ""},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rules := parse(t, c.rules)
			d := rules.Domains()[0]
			for _, p := range c.probes {
				got := ""
				if r := d.Match(&p.entries); r != nil {
					got = r.ID
				}
				if got != p.want {
					t.Errorf("Match(%v) = %q, want %q", p.entries, got, p.want)
				}
			}
		})
	}
}

func TestRulePath(t *testing.T) {
	d := parse(t, `
domain: models
descriptors:
  - key: model
    value: gpt-*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: tenant
        rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 100, name: per_tenant}
`).Domain("models")
	r := d.Match(&entries{{"model", "gpt-4"}, {"tenant", "acme"}})
	want := []PathElem{
		{Key: "model", Value: "gpt-*", Wildcard: true, ShareThreshold: true, ValueToMetric: true},
		{Key: "tenant"},
	}
	if !reflect.DeepEqual(r.Path, want) {
		t.Errorf("path %+v, want %+v", r.Path, want)
	}
	if r.Name != "per_tenant" || r.Domain != "models" || r.RequestsPerUnit != 100 || r.Window != 5*time.Minute {
		t.Errorf("rule %+v", r)
	}
}

func TestUnitsAndFailureModes(t *testing.T) {
	for u := Second; u <= Year; u++ {
		got, err := ParseUnit(strings.ToUpper(u.String()))
		if err != nil || got != u {
			t.Errorf("ParseUnit(%q) = %v, %v", strings.ToUpper(u.String()), got, err)
		}
	}
	if Month.Duration() != 30*24*time.Hour || Year.Duration() != 365*24*time.Hour || Week.Duration() != 7*24*time.Hour {
		t.Error("month, year or week has the wrong length")
	}
	for _, m := range []string{"open", "closed", "error", "local"} {
		if got, err := ParseFailureMode(m); err != nil || string(got) != m {
			t.Errorf("ParseFailureMode(%q) = %v, %v", m, got, err)
		}
	}
	if _, err := ParseFailureMode("Open"); err == nil {
		t.Error("ParseFailureMode accepted Open")
	}
	// Every algorithm loads from a rule file under its name, and a
	// not-rule-file one (concurrency) does not.
	for _, a := range algo.Algorithms() {
		r := parse(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1, unit: second, algorithm: "+a.String()+"}\n")
		if got := r.Domain("d").Rules()[0].Limits[0].Algorithm; got != a {
			t.Errorf("algorithm: %v loads as %v", a, got)
		}
	}
	if _, err := Parse(File{Name: "c.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1, unit: second, algorithm: " +
		algo.Concurrency.String() + "}\n")}); err == nil {
		t.Errorf("algorithm: %v loaded; it is made by a concurrency block, not named", algo.Concurrency)
	}
}

func TestMatchDoesNotAllocate(t *testing.T) {
	d := parse(t, benchRules).Domain("messaging")
	for _, e := range benchDescriptors {
		if n := testing.AllocsPerRun(100, func() { d.Match(&e) }); n != 0 {
			t.Errorf("Match(%v) allocates %v times", e, n)
		}
	}
}

const benchRules = `
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: path
    value: /files/*
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: route
    value: svc*ep*rpc
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 10}
`

var benchDescriptors = map[string]entries{
	"exact_then_key":   {{"message_type", "marketing"}, {"to_number", "2061111111"}},
	"key_only":         {{"to_number", "2061111111"}},
	"wildcard":         {{"path", "/files/report.pdf"}},
	"wildcard_glob":    {{"route", "svcUsersepGetrpc"}},
	"wildcard_literal": {{"path", "/files/*"}},
	"no_match":         {{"unknown", "x"}},
	"too_deep_no_rule": {{"to_number", "1"}, {"x", "y"}},
}

func BenchmarkMatch(b *testing.B) {
	d := parse(b, benchRules).Domain("messaging")
	for name, e := range benchDescriptors {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				d.Match(&e)
			}
		})
	}
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// TestAliasBombs feeds rule files whose aliases expand enormously
// ("billion laughs"): one nests them, nine levels of ten anchored
// descriptors each listing the ten below (10^9 descriptors); one repeats
// them, a list of 2,000 descriptors reused 9,000 times (18 million). Both
// must be refused before anything is walked, with one problem each, at an
// alias, naming the bound.
func TestAliasBombs(t *testing.T) {
	var deep strings.Builder
	deep.WriteString("domain: deep\ndescriptors:\n")
	for i := range 9 {
		for j := range 10 {
			fmt.Fprintf(&deep, "  - &a%d_%d {key: k%d_%d", i, j, i, j)
			if i > 0 {
				deep.WriteString(", descriptors: [")
				for k := range 10 {
					if k > 0 {
						deep.WriteString(", ")
					}
					fmt.Fprintf(&deep, "*a%d_%d", i-1, k)
				}
				deep.WriteString("]")
			}
			deep.WriteString("}\n")
		}
	}

	var wide strings.Builder
	wide.WriteString("domain: wide\ndescriptors:\n  - key: root\n    descriptors: &big [")
	for i := range 2000 {
		if i > 0 {
			wide.WriteString(", ")
		}
		fmt.Fprintf(&wide, "{key: k%d}", i)
	}
	wide.WriteString("]\n")
	for i := range 9000 {
		fmt.Fprintf(&wide, "  - {key: r%d, descriptors: *big}\n", i)
	}

	for name, c := range map[string]struct{ src, at string }{
		"deep": {deep.String(), "deep.yaml:83:37: descriptors[80].descriptors[0]: aliases expand the file by 3950616000 YAML nodes"},
		"wide": {wide.String(), "wide.yaml:5:28: descriptors[1].descriptors: aliases expand the file by 54000000 YAML nodes"},
	} {
		_, err := Parse(File{Name: name + ".yaml", Data: []byte(c.src)})
		if err == nil || !strings.HasPrefix(err.Error(), c.at) || !strings.Contains(err.Error(), "at most 1000000 are accepted") || len(unwrap(err)) != 1 {
			t.Errorf("%s: err = %.400v", name, err)
		}
	}
}

func TestAlgorithmsAndBounds(t *testing.T) {
	// Each rule sits right at a bound, or is a case the bounds must let
	// through: every one loads.
	r := parse(t, `
domain: algorithms
descriptors:
  - {key: log, rate_limit: {algorithm: sliding_window_log, requests_per_unit: 10000, unit: hour}}
  - {key: counter, rate_limit: {algorithm: sliding_window_counter, requests_per_unit: 4294967295, unit: second}}
  - {key: token, rate_limit: {algorithm: token_bucket, requests_per_unit: 67108864, unit: second, burst: 67108864}}
  - {key: leaky, rate_limit: {algorithm: leaky_bucket, requests_per_unit: 10, unit: second}}
  - {key: gcra, rate_limit: {algorithm: gcra, requests_per_unit: 1, unit: year, burst: 100}}
  - {key: fill, rate_limit: {algorithm: burst_fill, requests_per_unit: 4294967295, unit: year, unit_multiplier: 100}}
  - {key: zero, rate_limit: {algorithm: token_bucket, requests_per_unit: 0, unit: second, burst: 67108864}}
`).Domain("algorithms")
	want := map[string]Limit{
		"algorithms.log":     {RequestsPerUnit: 10000, Unit: Hour, UnitMultiplier: 1, Window: time.Hour, Algorithm: algo.SlidingWindowLog},
		"algorithms.counter": {RequestsPerUnit: maxUint32, Unit: Second, UnitMultiplier: 1, Window: time.Second, Algorithm: algo.SlidingWindowCounter},
		"algorithms.token":   {RequestsPerUnit: MaxBucket, Unit: Second, UnitMultiplier: 1, Window: time.Second, Algorithm: algo.TokenBucket, Burst: MaxBucket},
		"algorithms.leaky":   {RequestsPerUnit: 10, Unit: Second, UnitMultiplier: 1, Window: time.Second, Algorithm: algo.LeakyBucket},
		"algorithms.gcra":    {RequestsPerUnit: 1, Unit: Year, UnitMultiplier: 1, Window: 365 * 24 * time.Hour, Algorithm: algo.GCRA, Burst: 100},
		"algorithms.fill":    {RequestsPerUnit: maxUint32, Unit: Year, UnitMultiplier: 100, Window: MaxWindow, Algorithm: algo.BurstFill},
		"algorithms.zero":    {Unit: Second, UnitMultiplier: 1, Window: time.Second, Algorithm: algo.TokenBucket, Burst: MaxBucket},
	}
	rules := r.Rules()
	if len(rules) != len(want) {
		t.Fatalf("%d rules, want %d", len(rules), len(want))
	}
	for _, rule := range rules {
		if len(rule.Limits) != 1 || rule.Limits[0] != want[rule.ID] {
			t.Errorf("%s: limits %+v, want [%+v]", rule.ID, rule.Limits, want[rule.ID])
			continue
		}
		l := rule.Limits[0]
		if rule.RequestsPerUnit != l.RequestsPerUnit || rule.Window != l.Window || rule.Algorithm != l.Algorithm || rule.Burst != l.Burst {
			t.Errorf("%s: the rule's own fields %+v differ from its only limit", rule.ID, rule)
		}
	}
	if got := want["algorithms.gcra"].Capacity(); got != 100 {
		t.Errorf("capacity with burst: %d", got)
	}
	if got := want["algorithms.leaky"].Capacity(); got != 10 {
		t.Errorf("capacity without burst: %d, want requests_per_unit", got)
	}
}

func TestRateLimits(t *testing.T) {
	d := parse(t, `
domain: api
descriptors:
  - key: user
    shadow_mode: true
    rate_limits:
      - {name: per_second, requests_per_unit: 10, unit: second}
      - {requests_per_unit: 1000, unit: hour}
      - {name: smooth, requests_per_unit: 1000, unit: hour, algorithm: token_bucket, burst: 50}
  - key: single
    rate_limit: {name: one, requests_per_unit: 5, unit: minute}
  - key: admin
    rate_limit: {unlimited: true, replaces: [{name: smooth}]}
`).Domain("api")
	user := d.Match(&entries{{"user", "u1"}})
	want := []Limit{
		{Name: "per_second", RequestsPerUnit: 10, Unit: Second, UnitMultiplier: 1, Window: time.Second},
		{RequestsPerUnit: 1000, Unit: Hour, UnitMultiplier: 1, Window: time.Hour},
		{Name: "smooth", RequestsPerUnit: 1000, Unit: Hour, UnitMultiplier: 1, Window: time.Hour, Algorithm: algo.TokenBucket, Burst: 50},
	}
	if user == nil || !reflect.DeepEqual(user.Limits, want) {
		t.Fatalf("limits %+v, want %+v", user, want)
	}
	if user.Name != "per_second" || user.RequestsPerUnit != 10 || user.Unit != Second || user.Window != time.Second || !user.ShadowMode || user.Unlimited {
		t.Errorf("the rule's own fields are not its first limit's: %+v", user)
	}
	for name, has := range map[string]bool{"per_second": true, "smooth": true, "one": false, "": false} {
		if user.HasName(name) != has {
			t.Errorf("HasName(%q) = %v, want %v", name, !has, has)
		}
	}
	single := d.Match(&entries{{"single", "s"}})
	if len(single.Limits) != 1 || single.Limits[0].Name != "one" || !single.HasName("one") {
		t.Errorf("single rule: %+v", single)
	}
	admin := d.Match(&entries{{"admin", "a"}})
	if admin.Limits != nil || !reflect.DeepEqual(admin.Replaces, []string{"smooth"}) {
		t.Errorf("unlimited rule: %+v", admin)
	}
}

// TestConsistency reads rate_limit.consistency: exact by default, leased
// on every leasable algorithm, per entry of rate_limits.
func TestConsistency(t *testing.T) {
	r := parse(t, `
domain: api
descriptors:
  - key: plain
    rate_limit: {requests_per_unit: 10, unit: second}
  - key: window
    rate_limit: {requests_per_unit: 10, unit: second, consistency: leased}
  - key: buckets
    rate_limits:
      - {requests_per_unit: 10, unit: second, algorithm: token_bucket, consistency: leased}
      - {requests_per_unit: 100, unit: minute, algorithm: gcra, consistency: exact}
      - {requests_per_unit: 1000, unit: hour, algorithm: sliding_window_counter, consistency: leased}
`)
	want := map[string][]Consistency{
		"plain":   {Exact},
		"window":  {Leased},
		"buckets": {Leased, Exact, Leased},
	}
	for k, cs := range want {
		rule := r.Domain("api").Match(&entries{{k, "v"}})
		if rule == nil {
			t.Fatalf("%s: no rule", k)
		}
		for i, c := range cs {
			if got := rule.Limits[i].Consistency; got != c {
				t.Errorf("%s: limit %d is %v, want %v", k, i, got, c)
			}
		}
	}
	for _, a := range algo.Algorithms() {
		_, err := Parse(File{Name: "a.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1, unit: second, algorithm: " +
			a.String() + ", consistency: leased}\n")})
		if (err == nil) != a.Leasable() {
			t.Errorf("%v leased: error %v, want one only when it does not lease", a, err)
		}
	}
}

// TestMetadataAsYAML11 reads a descriptor's metadata as
// envoyproxy/ratelimit's YAML 1.1 parser does (gopkg.in/yaml.v2): plain
// yes, on, off and their kin are booleans, quoted ones strings, a date
// the text written, and merge keys expanded.
func TestMetadataAsYAML11(t *testing.T) {
	r := parse(t, `
domain: m
descriptors:
  - key: k
    metadata:
      flags: {fast: yes, cheap: off, Y: Y, quoted: "yes", mixed: yEs}
      since: 2024-01-02
      n: [1, 2.5, ~, 0x10]
      base: &base {a: 1, b: 2}
      derived: {<<: *base, b: 3}
    rate_limit: {unit: minute, requests_per_unit: 1}
`)
	want := map[string]any{
		"flags":   map[string]any{"fast": true, "cheap": false, "Y": true, "quoted": "yes", "mixed": "yEs"},
		"since":   "2024-01-02",
		"n":       []any{1, 2.5, nil, 16},
		"base":    map[string]any{"a": 1, "b": 2},
		"derived": map[string]any{"a": 1, "b": 3},
	}
	if got := r.Domain("m").Match(&entries{{"k", "v"}}).Metadata; !reflect.DeepEqual(got, want) {
		t.Errorf("metadata %#v\nwant %#v", got, want)
	}
}

// TestOverLimitHits reads rate_limit.over_limit_hits: the server's default
// when absent, drop or count per limit, per entry of rate_limits.
func TestOverLimitHits(t *testing.T) {
	r := parse(t, `
domain: ai
descriptors:
  - key: plain
    rate_limit: {requests_per_unit: 10, unit: second}
  - key: tokens
    rate_limit: {requests_per_unit: 1000, unit: minute, over_limit_hits: count}
  - key: requests
    rate_limit: {requests_per_unit: 10, unit: second, over_limit_hits: drop}
  - key: both
    rate_limits:
      - {requests_per_unit: 10, unit: second, algorithm: token_bucket, over_limit_hits: count}
      - {requests_per_unit: 100, unit: minute}
`)
	want := map[string][]OverLimitHits{
		"plain":    {OverLimitDefault},
		"tokens":   {OverLimitCount},
		"requests": {OverLimitDrop},
		"both":     {OverLimitCount, OverLimitDefault},
	}
	for k, os := range want {
		rule := r.Domain("ai").Match(&entries{{k, "v"}})
		if rule == nil {
			t.Fatalf("%s: no rule", k)
		}
		for i, o := range os {
			if got := rule.Limits[i].OverLimitHits; got != o {
				t.Errorf("%s: limit %d is %v, want %v", k, i, got, o)
			}
		}
	}
	if got := OverLimitDefault.Or(OverLimitCount); got != OverLimitCount {
		t.Errorf("the default or count = %v", got)
	}
	if got := OverLimitDrop.Or(OverLimitCount); got != OverLimitDrop {
		t.Errorf("drop or count = %v", got)
	}
}

// TestScope reads rate_limit.scope and on_partition: region by default,
// global with share on a partition unless it says exact-local, per entry
// of rate_limits, and global with consistency: leased.
func TestScope(t *testing.T) {
	r := parse(t, `
domain: api
descriptors:
  - key: plain
    rate_limit: {requests_per_unit: 10, unit: second}
  - key: world
    rate_limit: {requests_per_unit: 10, unit: second, scope: global}
  - key: both
    rate_limits:
      - {requests_per_unit: 10, unit: second, scope: global, on_partition: exact-local, consistency: leased}
      - {requests_per_unit: 100, unit: minute, scope: region}
      - {requests_per_unit: 1000, unit: hour, scope: global, on_partition: share}
`)
	type sp struct {
		s Scope
		p Partition
		c Consistency
	}
	want := map[string][]sp{
		"plain": {{Region, Share, Exact}},
		"world": {{Global, Share, Exact}},
		"both":  {{Global, ExactLocal, Leased}, {Region, Share, Exact}, {Global, Share, Exact}},
	}
	for k, ls := range want {
		rule := r.Domain("api").Match(&entries{{k, "v"}})
		if rule == nil {
			t.Fatalf("%s: no rule", k)
		}
		for i, w := range ls {
			if l := rule.Limits[i]; (sp{l.Scope, l.OnPartition, l.Consistency}) != w {
				t.Errorf("%s: limit %d is %v/%v/%v, want %v", k, i, l.Scope, l.OnPartition, l.Consistency, w)
			}
		}
	}
}

// TestConcurrency reads concurrency blocks: alone, beside a rate limit,
// and with the default lease TTL.
func TestConcurrency(t *testing.T) {
	r := parse(t, `
domain: exports
descriptors:
  - key: report
    concurrency: {max_in_flight: 20, lease_ttl: 2m}
  - key: export
    rate_limit: {requests_per_unit: 100, unit: hour}
    concurrency: {max_in_flight: 3}
`)
	d := r.Domain("exports")
	report := d.Match(&entries{{"report", "x"}})
	if report == nil || report.Concurrency == nil || *report.Concurrency != (Concurrency{MaxInFlight: 20, LeaseTTL: 2 * time.Minute}) || len(report.Limits) != 0 {
		t.Fatalf("report: %+v", report)
	}
	export := d.Match(&entries{{"export", "x"}})
	if export == nil || export.Concurrency == nil || *export.Concurrency != (Concurrency{MaxInFlight: 3, LeaseTTL: DefaultLeaseTTL}) || len(export.Limits) != 1 {
		t.Fatalf("export: %+v", export)
	}
}

// TestRuleIndex numbers every rule of a set from 0, the domains in load
// order and each one's rules in file order.
func TestRuleIndex(t *testing.T) {
	r, err := Parse(
		File{Name: "b.yaml", Data: []byte("domain: b\ndescriptors:\n  - {key: x, rate_limit: {unit: second, requests_per_unit: 1}}\n  - key: y\n    descriptors:\n      - {key: z, rate_limit: {unit: second, requests_per_unit: 1}}\n")},
		File{Name: "a.yaml", Data: []byte("domain: a\ndescriptors:\n  - {key: x, rate_limit: {unlimited: true}}\n")},
	)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, name := range []string{"b", "a"} {
		for _, rule := range r.Domain(name).Rules() {
			got = append(got, fmt.Sprintf("%d:%s", rule.Index(), rule.ID))
		}
	}
	if want := []string{"0:b.x", "1:b.y.z", "2:a.x"}; !slices.Equal(got, want) || r.NumRules() != 3 {
		t.Errorf("indexes %v of %d rules, want %v of 3", got, r.NumRules(), want)
	}
}

// TestLevelSizes matches in levels kept as a list (at most smallLevel
// descriptors, none a wildcard) and in maps (more, or a wildcard), and in
// one that moves from one to the other as it is built: the same rules.
func TestLevelSizes(t *testing.T) {
	for _, n := range []int{1, smallLevel - 1, smallLevel, smallLevel + 1, 3 * smallLevel} {
		for _, wildcard := range []bool{false, true} {
			var b strings.Builder
			b.WriteString("domain: d\ndescriptors:\n")
			for i := range n {
				fmt.Fprintf(&b, "  - {key: k, value: v%d, rate_limit: {unit: second, requests_per_unit: %d}}\n", i, i+1)
				if i == n/2 {
					b.WriteString("  - {key: k, rate_limit: {unit: minute, requests_per_unit: 1}}\n")
				}
			}
			if wildcard {
				b.WriteString("  - {key: k, value: w*, rate_limit: {unit: hour, requests_per_unit: 1}}\n")
			}
			b.WriteString("  - {key: j, rate_limit: {unit: day, requests_per_unit: 1}}\n")
			d := parse(t, b.String()).Domain("d")
			name := fmt.Sprintf("%d descriptors, wildcard %v", n, wildcard)
			if got, want := d.root.big != nil, n+2 > smallLevel || wildcard; got != want {
				t.Errorf("%s: in maps %v, want %v", name, got, want)
			}
			for i := range n {
				if r := d.Match(&entries{{"k", fmt.Sprintf("v%d", i)}}); r == nil || r.RequestsPerUnit != uint32(i+1) || r.Unit != Second {
					t.Errorf("%s: k=v%d matched %+v", name, i, r)
				}
			}
			for _, v := range []string{"", "x", "w", "v"} {
				want := Minute
				if wildcard && v == "w" {
					want = Hour
				}
				if r := d.Match(&entries{{"k", v}}); r == nil || r.Unit != want {
					t.Errorf("%s: k=%q matched %+v, want the %s rule", name, v, r, want)
				}
			}
			if r := d.Match(&entries{{"j", "v0"}}); r == nil || r.Unit != Day {
				t.Errorf("%s: j=v0 matched %+v", name, r)
			}
			if r := d.Match(&entries{{"x", "v0"}}); r != nil {
				t.Errorf("%s: x=v0 matched %+v", name, r)
			}
		}
	}
}

// TestHashOf: HashOf gives the hash LoadOptions gives the same files, a
// directory or a file, in either reading, valid or not, and another once
// a file changes.
func TestHashOf(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "sub")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, text string) {
		if err := os.WriteFile(name, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dir, "a.yaml"), "domain: a\ndescriptors:\n  - {key: k, rate_limit: {unit: second, requests_per_unit: 1}}\n")
	write(filepath.Join(sub, "b.yaml"), "domain: b\ndescriptors:\n  - {key: k, rate_limit: {unit: second, requests_per_unit: 2}}\n")
	for _, c := range []struct {
		path string
		opts Options
	}{{dir, Options{}}, {dir, Options{Reference: true}}, {filepath.Join(dir, "a.yaml"), Options{}}} {
		r, err := LoadOptions(c.path, c.opts)
		if err != nil {
			t.Fatal(err)
		}
		if h, err := HashOf(c.path, c.opts); err != nil || h != r.Hash() {
			t.Errorf("%s %+v: HashOf %q, %v; LoadOptions' hash %q", c.path, c.opts, h, err, r.Hash())
		}
	}
	before, _ := HashOf(dir, Options{})
	write(filepath.Join(dir, "a.yaml"), "domain: a\ndescriptors: [{key: k, rate_limit: {unit: second}}]\n") // invalid
	if h, err := HashOf(dir, Options{}); err != nil || h == before {
		t.Errorf("after a change: %q, %v; before %q", h, err, before)
	}
	if _, err := HashOf(filepath.Join(dir, "none"), Options{}); err == nil {
		t.Error("no error for a path that does not exist")
	}
}
