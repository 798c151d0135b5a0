package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/reftest"
)

// writeTree writes files (path below root → content) and returns root.
func writeTree(t *testing.T, root string, files map[string]string) string {
	t.Helper()
	for name, data := range files {
		full := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func oneLimit(domain string) string {
	return "domain: " + domain + "\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
}

// referenceLayout is the runtime tree envoyproxy/ratelimit was run on,
// and referenceAnswers its answers (RUNTIME_ROOT=layout/rt,
// RUNTIME_SUBDIRECTORY=ratelimit, RUNTIME_APPDIRECTORY=config).
const (
	referenceLayout  = "testdata/reference/layout"
	referenceAnswers = "testdata/reference/layout.answers.txt"
)

func domainNames(r *Rules) []string {
	var names []string
	for _, d := range r.Domains() {
		names = append(names, d.Name)
	}
	return names
}

// warningsText joins the warnings, one a line, paths relative to root.
func warningsText(r *Rules, root string) string {
	var b strings.Builder
	for _, w := range r.Warnings() {
		b.WriteString(strings.ReplaceAll(w.Error(), root+string(filepath.Separator), ""))
		b.WriteByte('\n')
	}
	return b.String()
}

// TestReferenceLayout reads a runtime tree as envoyproxy/ratelimit does
// and finds the domains and limits it found on the same tree
// (testdata/reference/layout.answers.txt): subdirectories read, files of
// any name read, a symbolic link to a directory not followed, a file's
// second document not read, the last of a field given twice used, null
// rate_limit meaning no limit, and with RUNTIME_WATCH_ROOT=true, the
// siblings of the application directory whose name starts with "config.".
func TestReferenceLayout(t *testing.T) {
	sections, err := reftest.Read(referenceAnswers)
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs(referenceLayout)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		section string
		path    string
		opts    Options
		domains []string // those the reference logged loading
	}{
		// RUNTIME_WATCH_ROOT=true: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY,
		// keys starting with "config.".
		{"RUNTIME_WATCH_ROOT=true", "rt/ratelimit", Options{Reference: true, Prefix: "config."},
			[]string{"deeper", "dup", "firstdoc", "nested", "noext", "nulls", "sibling", "top"}},
		// RUNTIME_WATCH_ROOT=false: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/
		// config, every key.
		{"RUNTIME_WATCH_ROOT=false", "rt/ratelimit/config", Options{Reference: true},
			[]string{"deeper", "dup", "firstdoc", "nested", "noext", "nulls", "top"}},
	} {
		rules, err := LoadOptions(filepath.Join(root, c.path), c.opts)
		if err != nil {
			t.Fatal(err)
		}
		if got := domainNames(rules); !slices.Equal(got, c.domains) {
			t.Errorf("%s: domains %v, the reference loaded %v", c.section, got, c.domains)
		}
		s := reftest.Find(sections, c.section)
		if s == nil || len(s.Cases) < 10 {
			t.Fatalf("%s: no recorded answers", c.section)
		}
		// The limit the reference applied to each descriptor, the
		// currentLimit of its first answer; none when it had none.
		for _, rc := range s.Cases {
			desc := entries{}
			for _, e := range rc.Entries {
				desc = append(desc, [2]string{e.Key, e.Value})
			}
			want := rc.Answers[0]
			var r *Rule
			if d := rules.Domain(rc.Domain); d != nil {
				r = d.Match(&desc)
			}
			switch {
			case want.Limit == 0 && r != nil:
				t.Errorf("%s: %s %v: rule %s at line %d; the reference applied none", c.section, rc.Domain, desc, r.ID, r.Line)
			case want.Limit != 0 && r == nil:
				t.Errorf("%s: %s %v: no rule; the reference applied %d per %s", c.section, rc.Domain, desc, want.Limit, want.Unit)
			case want.Limit != 0 && (r.RequestsPerUnit != want.Limit || want.Unit != "MINUTE" || r.Window != time.Minute):
				t.Errorf("%s: %s %v: %d per %v; the reference applied %d per %s", c.section, rc.Domain, desc, r.RequestsPerUnit, r.Window, want.Limit, want.Unit)
			}
		}
	}

	// Nothing is dropped without a word.
	rules, err := LoadOptions(filepath.Join(root, "rt/ratelimit"), Options{Reference: true, Prefix: "config."})
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"rt/ratelimit/config/.hidden.yaml: not read: names starting with \".\" are skipped; rename it without the dot to load it",
		"rt/ratelimit/config/linkdir: not read: a symbolic link to a directory, which envoyproxy/ratelimit does not follow either; link the files themselves, or move the directory here",
		"rt/ratelimit/config/dup.yaml:5:5: descriptors[0].rate_limit: given twice in one mapping; this value is used and the one at line 4 ignored, as envoyproxy/ratelimit does",
		"rt/ratelimit/config/dup.yaml:8:5: descriptors[1].value: given twice in one mapping; this value is used and the one at line 7 ignored, as envoyproxy/ratelimit does",
		"rt/ratelimit/config/sub/nested.yaml:1:1: name: not used: a rule set is known by its domain; envoyproxy/ratelimit ignores it too",
		"rt/ratelimit/config/sub/nested.yaml:6:1: an empty YAML document (a \"---\" with nothing after it): nothing to read",
		"rt/ratelimit/config/twodocs.yaml:5:1: a second YAML document, not read: envoyproxy/ratelimit reads only a file's first document, so its rules are not enforced; move them into a file of their own",
		"",
	}, "\n")
	if got := warningsText(rules, root); got != want {
		t.Errorf("warnings:\n%s\nwant:\n%s", got, want)
	}
}

// TestNativeLayout: native mode reads the *.yaml and *.yml files directly
// in the directory and warns of every other file that looks like rules;
// it accepts null rate_limit, a top-level name and an empty trailing
// document, and refuses a field given twice and a second document.
func TestNativeLayout(t *testing.T) {
	root := writeTree(t, t.TempDir(), map[string]string{
		"top.yaml":            "name: eg/first-listener\n" + oneLimit("top") + "---\n",
		"nulls.yml":           "domain: nulls\ndescriptors:\n  - key: outer\n    rate_limit: null\n    descriptors:\n      - key: inner\n        rate_limit: {unit: minute, requests_per_unit: 1}\n",
		"sub/nested.yaml":     oneLimit("nested"),
		"sub/deeper/rules":    oneLimit("deeper"),
		"sub/README.md":       "# notes, no rules\n",
		"envoy/envoy.yaml":    "static_resources:\n  listeners: []\n", // another program's YAML beside the rules: no warning
		"rules.conf":          oneLimit("conf"),
		"NOTES.txt":           "nothing here\n",
		".hidden.yml":         oneLimit("hidden"),
		".rules":              oneLimit("dotted"),
		"..2026_11_27/x.yaml": oneLimit("configmap-internals"),
	})
	rules, err := Load(root)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := domainNames(rules), []string{"nulls", "top"}; !slices.Equal(got, want) {
		t.Errorf("domains %v, want %v", got, want)
	}
	if r := rules.Domain("nulls").Match(&entries{{"outer", ""}}); r != nil {
		t.Errorf("rate_limit: null made a rule at line %d", r.Line)
	}
	if r := rules.Domain("nulls").Match(&entries{{"outer", ""}, {"inner", ""}}); r == nil || r.RequestsPerUnit != 1 {
		t.Errorf("the rule below rate_limit: null: %+v", r)
	}
	want := strings.Join([]string{
		".hidden.yml: not read: names starting with \".\" are skipped; rename it without the dot to load it",
		".rules: not read: names starting with \".\" are skipped; rename it without the dot to load it",
		"rules.conf: not read: it holds a domain, but only files named *.yaml or *.yml are rule files; rename it to load it",
		"sub/deeper/rules: not read: rule files are read only directly in " + root + ", not in its subdirectories; move it there (envoyproxy/ratelimit's compatibility mode reads subdirectories)",
		"sub/nested.yaml: not read: rule files are read only directly in " + root + ", not in its subdirectories; move it there (envoyproxy/ratelimit's compatibility mode reads subdirectories)",
		"top.yaml:1:1: name: not used: a rule set is known by its domain; envoyproxy/ratelimit ignores it too",
		"top.yaml:6:1: an empty YAML document (a \"---\" with nothing after it): nothing to read",
		"",
	}, "\n")
	if got := warningsText(rules, root); got != want {
		t.Errorf("warnings:\n%s\nwant:\n%s", got, want)
	}

	// What native mode refuses and the reference's reading accepts.
	for name, src := range map[string]string{
		"a field given twice": "domain: d\ndescriptors:\n  - key: k\n    key: j\n",
		"a second document":   oneLimit("d") + "---\n" + oneLimit("e"),
	} {
		if _, err := Parse(File{Name: "f.yaml", Data: []byte(src)}); err == nil {
			t.Errorf("%s: accepted in native mode", name)
		}
		if _, err := ParseOptions(Options{Reference: true}, File{Name: "f.yaml", Data: []byte(src)}); err != nil {
			t.Errorf("%s: refused in reference mode: %v", name, err)
		}
	}
}
