package config

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/rulegen"
)

// parseRoutes parses a generated domain "scale" of n routes.
func parseRoutes(tb testing.TB, n int) *Rules {
	tb.Helper()
	r, err := Parse(File{Name: "scale.yaml", Data: rulegen.Routes("scale", n)})
	if err != nil {
		tb.Fatalf("%d routes: %.500v", n, err)
	}
	return r
}

// TestLargeDomain loads domains of generated routes, route=rN each with a
// nested user limited, as large as envoyproxy/ratelimit loads: 30,000
// always (past the 21,800 that a bound of 200,000 YAML nodes once
// refused), 100,000 unless -short.
func TestLargeDomain(t *testing.T) {
	sizes := []int{30_000}
	if !testing.Short() {
		sizes = append(sizes, 100_000)
	}
	for _, n := range sizes {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			d := parseRoutes(t, n).Domain("scale")
			if got := len(d.Rules()); got != n {
				t.Fatalf("%d rules, want %d", got, n)
			}
			for _, i := range []int{0, n / 2, n - 1} {
				r := d.Match(&entries{{rulegen.Key, rulegen.Value(i)}, {rulegen.Nested, "u1"}})
				if want := fmt.Sprintf("scale.route_r%d.user", i); r == nil || r.ID != want || r.RequestsPerUnit != 1_000_000 || r.Unit != Second {
					t.Errorf("route %d: rule %+v, want %s at 1000000 per second", i, r, want)
				}
			}
		})
	}
}

// TestSharedLimitAliases loads a large domain whose descriptors all use
// one anchored rate_limit, which aliases expand by 5 nodes a use: what
// aliases add is bounded by the file's own nodes as well as by
// MaxAliasNodes, so a file that shares its limits loads at any size.
func TestSharedLimitAliases(t *testing.T) {
	n := 30_000
	if !testing.Short() {
		n = 250_000 // 1,250,000 nodes added, more than MaxAliasNodes
	}
	var b bytes.Buffer
	b.WriteString("domain: shared\nlimit: &limit {unit: second, requests_per_unit: 10}\ndescriptors:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - {key: tenant, value: t%d, rate_limit: *limit}\n", i)
	}
	// limit is not a field of a rule file: the one error says so, and no
	// other, although every descriptor expands it.
	_, err := Parse(File{Name: "shared.yaml", Data: b.Bytes()})
	if err == nil || len(unwrap(err)) != 1 || !strings.Contains(err.Error(), `shared.yaml:2:1: limit: unknown field "limit"`) {
		t.Fatalf("err = %.500v", err)
	}
	// As envoyproxy/ratelimit's files do it, the anchor on the first use.
	b.Reset()
	b.WriteString("domain: shared\ndescriptors:\n  - {key: tenant, value: t0, rate_limit: &limit {unit: second, requests_per_unit: 10}}\n")
	for i := 1; i < n; i++ {
		fmt.Fprintf(&b, "  - {key: tenant, value: t%d, rate_limit: *limit}\n", i)
	}
	r, err := Parse(File{Name: "shared.yaml", Data: b.Bytes()})
	if err != nil {
		t.Fatalf("%.500v", err)
	}
	if got := len(r.Domain("shared").Rules()); got != n {
		t.Errorf("%d rules, want %d", got, n)
	}
}

// TestAliasBombOneError expands aliases past the bound inside a
// descriptor's metadata, between valid descriptors and a rate_limit: the
// file is refused with the one error of the bound, and nothing that
// walking the rest would have said (no "missing" field).
func TestAliasBombOneError(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: bomb\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	b.WriteString("  - key: b\n    metadata:\n      l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 8; i++ {
		fmt.Fprintf(&b, "      l%d: &l%d [*l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d]\n", i, i, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1)
	}
	b.WriteString("    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: c\n    rate_limit: {unit: second}\n")
	_, err := Parse(File{Name: "bomb.yaml", Data: []byte(b.String())})
	errs := unwrap(err)
	if len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), "bomb.yaml:14:16: descriptors[1].metadata.l7[0]: aliases expand the file by ") ||
		!strings.Contains(errs[0].Error(), "at most 1000000 are accepted") {
		t.Errorf("err = %.600v", err)
	}
}

// TestAliasCycle refuses an alias naming a node that holds it, which
// would nest descriptors without end, with one error at the alias.
func TestAliasCycle(t *testing.T) {
	for name, c := range map[string]struct{ src, want string }{
		"descriptors": {
			"domain: loop\ndescriptors: &all\n  - key: a\n    descriptors: *all\n",
			"loop.yaml:4:18: descriptors[0].descriptors: the alias *all names a node that holds it (anchored at line 2)",
		},
		"descriptor": {
			"domain: loop\ndescriptors:\n  - &d {key: a, descriptors: [*d]}\n",
			"loop.yaml:3:31: descriptors[0].descriptors[0]: the alias *d names a node that holds it (anchored at line 3)",
		},
		"root": {
			"&root {domain: loop, descriptors: [{key: a, descriptors: [*root]}]}\n",
			"loop.yaml:1:59: descriptors[0].descriptors[0]: the alias *root names a node that holds it (anchored at line 1)",
		},
	} {
		_, err := Parse(File{Name: "loop.yaml", Data: []byte(c.src)})
		if errs := unwrap(err); len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), c.want) {
			t.Errorf("%s: err = %.400v, want %q", name, err, c.want)
		}
	}
}

// TestMaxFileSize refuses a file larger than MaxFileSize, given to Parse
// or read by Load, with one error naming the bound, and loads one of
// MaxFileSize bytes.
func TestMaxFileSize(t *testing.T) {
	const head = "domain: big\ndescriptors:\n  - {key: k, rate_limit: {unit: second, requests_per_unit: 1}}\n"
	fill := func(size int) []byte {
		b := make([]byte, size)
		copy(b, head)
		for i := len(head); i < size; i++ {
			b[i] = ' '
		}
		b[size-1] = '\n'
		return b
	}
	if _, err := Parse(File{Name: "big.yaml", Data: fill(MaxFileSize)}); err != nil {
		t.Errorf("a file of MaxFileSize bytes: %.300v", err)
	}
	want := fmt.Sprintf("big.yaml: the file is larger than %d bytes (64 MiB), the most a rule file may hold", MaxFileSize)
	_, err := Parse(File{Name: "big.yaml", Data: fill(MaxFileSize + 1)})
	if errs := unwrap(err); len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), want) {
		t.Errorf("Parse: err = %.300v, want %q", err, want)
	}

	// Load reads no more than a byte past the bound of a larger file.
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "big.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(head); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(2 * MaxFileSize); err != nil { // sparse: zeros, never written
		t.Fatal(err)
	}
	f.Close()
	want = filepath.Join(dir, "big.yaml") + ": the file is larger than"
	for _, path := range []string{dir, filepath.Join(dir, "big.yaml")} {
		_, err := Load(path)
		if errs := unwrap(err); len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), want) {
			t.Errorf("Load(%s): err = %.300v, want %q", path, err, want)
		}
	}
}
