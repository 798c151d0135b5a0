package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// TestLoadtestRules loads the load test's own rules and checks the
// domains limit user_id once, twice, once and once.
func TestLoadtestRules(t *testing.T) {
	dir := t.TempDir()
	if err := writeRules(dir, "user_id"); err != nil {
		t.Fatal(err)
	}
	for domain, limits := range map[string]int{oneLimit: 1, twoLimits: 2, zipfExact: 1, zipfLeased: 1} {
		lt := &loadtest{cfg: &loadtestConfig{Config: dir, Domain: domain, Key: "user_id"}}
		keys, _, err := lt.scriptCall()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) != limits {
			t.Errorf("domain %s: one decision reads %d keys, want %d", domain, len(keys), limits)
		}
	}
}

// TestLeasedRules loads the load test's own rules with the project's
// config package and checks that the leased group's domains say what its
// scenarios need: one fixed-window limit of 1,000,000 a minute on any
// value of the key, so that the Zipf load rarely meets it, decided exactly
// in one and leased in the other.
func TestLeasedRules(t *testing.T) {
	dir := t.TempDir()
	if err := writeRules(dir, "user_id"); err != nil {
		t.Fatal(err)
	}
	rules, err := config.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for domain, cons := range map[string]config.Consistency{zipfExact: config.Exact, zipfLeased: config.Leased} {
		dom := rules.Domain(domain)
		if dom == nil {
			t.Fatalf("no domain %s", domain)
		}
		// The hottest and the coldest value of the Zipf load.
		for _, value := range []string{"user-0", "user-9999"} {
			rule := dom.Match(oneEntry{"user_id", value})
			if rule == nil || len(rule.Limits) != 1 {
				t.Fatalf("domain %s, (user_id, %s): rule %+v, want one limit", domain, value, rule)
			}
			l := rule.Limits[0]
			if l.RequestsPerUnit != 1_000_000 || l.Unit != config.Minute || l.Window != time.Minute || l.Algorithm != algo.FixedWindow || l.Consistency != cons {
				t.Errorf("domain %s, (user_id, %s): %d per %v (%v window), %s, %s; want 1000000 per minute, fixed_window, %s",
					domain, value, l.RequestsPerUnit, l.Unit, l.Window, l.Algorithm, l.Consistency, cons)
			}
		}
	}
	if err := checkLeasedRules(dir, "user_id"); err != nil {
		t.Errorf("the own rules fail the leased group's check: %v", err)
	}
}

// TestCheckLeasedRulesRefuses checks that rules given with -config are
// refused, before anything starts, when they cannot show what the leased
// group compares.
func TestCheckLeasedRulesRefuses(t *testing.T) {
	own := loadtestRules("user_id")
	for _, tc := range []struct {
		name    string
		edit    func(files map[string]string)
		wantErr string
	}{
		{"no leased domain", func(f map[string]string) { delete(f, zipfLeased+".yaml") }, "no domain " + zipfLeased},
		{"both exact", func(f map[string]string) {
			f[zipfLeased+".yaml"] = strings.Replace(f[zipfLeased+".yaml"], "consistency: leased", "consistency: exact", 1)
		}, "want leased"},
		{"both leased", func(f map[string]string) {
			f[zipfExact+".yaml"] = strings.Replace(f[zipfExact+".yaml"], "consistency: exact", "consistency: leased", 1)
		}, "want exact"},
		{"different limits", func(f map[string]string) {
			f[zipfLeased+".yaml"] = strings.Replace(f[zipfLeased+".yaml"], "requests_per_unit: 1000000", "requests_per_unit: 1000", 1)
		}, "only the consistency may differ"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := map[string]string{}
			for name, text := range own {
				files[name] = text
			}
			tc.edit(files)
			dir := t.TempDir()
			for name, text := range files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := checkLeasedRules(dir, "user_id"); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err %v: want one saying %q", err, tc.wantErr)
			}
		})
	}
}
