package config

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
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
				if !r.Unlimited && (r.Window <= 0 || r.Window > MaxWindow) {
					t.Fatalf("accepted rule %s with window %v", r.ID, r.Window)
				}
			}
		}
	})
}
