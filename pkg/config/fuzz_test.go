package config

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// FuzzParse feeds arbitrary bytes to the rule parser: it must never panic,
// every problem must be an *Error naming the file, and every rule it accepts
// must be usable (a positive window unless unlimited).
func FuzzParse(f *testing.F) {
	for _, glob := range []string{"testdata/valid/*.yaml", "testdata/invalid/*.yaml", "../../examples/*.yaml"} {
		paths, _ := filepath.Glob(glob)
		for _, p := range paths {
			if data, err := os.ReadFile(p); err == nil {
				f.Add(data)
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		rules, err := Parse(File{Name: "fuzz.yaml", Data: data})
		if err != nil {
			if rules != nil {
				t.Fatal("rules returned with an error")
			}
			for _, e := range unwrap(err) {
				var ce *Error
				if !errors.As(e, &ce) || ce.File != "fuzz.yaml" {
					t.Fatalf("problem %v is not an *Error naming the file", e)
				}
			}
			return
		}
		for _, d := range rules.Domains() {
			if d.Name == "" || len(d.Name) > MaxDomainLen {
				t.Fatalf("accepted domain name %q", d.Name)
			}
			for _, r := range d.Rules() {
				if r.Unlimited {
					if r.Limits != nil {
						t.Fatalf("unlimited rule %s has limits %+v", r.ID, r.Limits)
					}
					continue
				}
				if c := r.Concurrency; c != nil {
					if c.MaxInFlight > MaxInFlight || c.LeaseTTL < MinLeaseTTL || c.LeaseTTL > MaxLeaseTTL {
						t.Fatalf("accepted rule %s with concurrency %+v, out of bounds", r.ID, c)
					}
					if len(r.Limits) == 0 {
						continue // a concurrency limit alone
					}
				}
				if len(r.Limits) == 0 || r.Limits[0].Window != r.Window || r.Limits[0].RequestsPerUnit != r.RequestsPerUnit {
					t.Fatalf("rule %s: limits %+v do not start with the rule's own", r.ID, r.Limits)
				}
				for _, l := range r.Limits {
					if l.Window <= 0 || l.Window > MaxWindow {
						t.Fatalf("accepted rule %s with window %v", r.ID, l.Window)
					}
					if l.Algorithm == algo.SlidingWindowLog && l.RequestsPerUnit > MaxLog ||
						l.Algorithm.UsesBurst() && (l.RequestsPerUnit > MaxBucket || l.Capacity() > MaxBucket || l.Capacity() == 0 && l.RequestsPerUnit > 0) ||
						!l.Algorithm.UsesBurst() && l.Burst != 0 {
						t.Fatalf("accepted rule %s with limit %+v, out of its algorithm's bounds", r.ID, l)
					}
				}
			}
		}
	})
}
