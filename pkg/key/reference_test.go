package key

import (
	"os"
	"strings"
	"testing"
)

// TestReferenceGolden checks reference-layout keys against
// testdata/reference.golden, written from envoyproxy/ratelimit's
// cache_key.go (GenerateCacheKey) and its README's examples: domain, "_",
// then key "_" value "_" per entry, then the window start in seconds.
func TestReferenceGolden(t *testing.T) {
	type e struct{ k, v string }
	cases := []struct {
		name    string
		domain  string
		entries []e
		now     int64
		unit    int64
	}{
		{"one entry, per second", "mongo_cps", []e{{"database", "users"}}, 1234, 1},
		{"two entries, per minute", "messaging", []e{{"message_type", "marketing"}, {"to_number", "2061111111"}}, 1700000059, 60},
		{"per hour", "rl", []e{{"remote_address", "10.0.0.1"}}, 1700003599, 3600},
		{"per day", "rl", []e{{"user", "a"}}, 1700000000, 86400},
		{"per week", "rl", []e{{"user", "a"}}, 1700000000, 604800},
		{"per month (30 days)", "rl", []e{{"user", "a"}}, 1700000000, 2592000},
		{"per year (365 days)", "rl", []e{{"user", "a"}}, 1700000000, 31536000},
		{"empty value", "rl", []e{{"generic_key", ""}}, 60, 60},
		{"share_threshold pattern", "files", []e{{"path", "/files/*"}}, 125, 60},
		{"underscore inside a value", "d", []e{{"a", "b_c"}}, 0, 1},
		{"underscore inside a key", "d", []e{{"a_b", "c"}}, 0, 1},
	}
	var b strings.Builder
	for _, c := range cases {
		k := AppendReference(nil, c.domain)
		for _, x := range c.entries {
			k = AppendReferenceEntry(k, x.k, x.v)
		}
		k = AppendReferenceWindow(k, c.now, c.unit)
		b.WriteString(c.name + "\t" + string(k) + "\n")
	}
	got := b.String()
	const path = "testdata/reference.golden"
	if os.Getenv("UPDATE_GOLDEN") != "" {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (UPDATE_GOLDEN=1 writes it)", err)
	}
	if got != string(want) {
		t.Errorf("reference keys differ from %s:\n got:\n%s\nwant:\n%s", path, got, want)
	}
}

// The reference layout is collision-prone, and the docs say so: this is
// the example they give.
func TestReferenceCollides(t *testing.T) {
	a := AppendReferenceWindow(AppendReferenceEntry(AppendReference(nil, "d"), "a", "b_c"), 60, 60)
	b := AppendReferenceWindow(AppendReferenceEntry(AppendReference(nil, "d"), "a_b", "c"), 60, 60)
	if string(a) != string(b) {
		t.Errorf("%q and %q differ; the reference layout was expected to collide here", a, b)
	}
}

func BenchmarkAppendReference(b *testing.B) {
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendReference(buf[:0], "messaging")
		buf = AppendReferenceEntry(buf, "message_type", "marketing")
		buf = AppendReferenceEntry(buf, "to_number", "2061111111")
		buf = AppendReferenceWindow(buf, 1700000000, 86400)
	}
}
