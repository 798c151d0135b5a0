package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// The load test's own rules: one descriptor (user_id) limited once, as the
// incumbent's reference figures are, and limited twice, as examples/api.yaml
// does, which doubles the keys every decision reads and writes. The
// limits are high enough that the uniform load over 10,000 users is
// admitted.
const (
	oneLimit  = "one_limit"
	twoLimits = "two_limits"
)

// The leased group's rules: the same descriptor limited to 1,000,000 hits
// a minute in a fixed window, so that the Zipf load rarely meets the limit
// even on its hottest key, decided exactly (one Redis call per decision)
// and leased (most decisions in process, from budget leased out of Redis
// in batches). Both limit alike but for the consistency, so that their
// rows differ only in where the decisions are made.
const (
	zipfExact  = "zipf_exact"
	zipfLeased = "zipf_leased"
)

// loadtestRules are the rule files of the load test's own rules, by name,
// limiting descriptors of key.
func loadtestRules(key string) map[string]string {
	return map[string]string{
		oneLimit + ".yaml": `# written by ratelimit-bench loadtest
domain: ` + oneLimit + `
descriptors:
  - key: ` + key + `
    rate_limit:
      requests_per_unit: 1000
      unit: second
`,
		twoLimits + ".yaml": `# written by ratelimit-bench loadtest
domain: ` + twoLimits + `
descriptors:
  - key: ` + key + `
    rate_limits:
      - requests_per_unit: 1000
        unit: second
      - requests_per_unit: 1000000
        unit: hour
`,
		zipfExact + ".yaml":   zipfRule(zipfExact, key, "exact"),
		zipfLeased + ".yaml":  zipfRule(zipfLeased, key, "leased"),
		globalLimit + ".yaml": globalRule(key),
	}
}

// zipfRule is the rule file of a leased group's domain: a fixed window of
// 1,000,000 per minute on key, of the given consistency.
func zipfRule(domain, key, consistency string) string {
	return `# written by ratelimit-bench loadtest
domain: ` + domain + `
descriptors:
  - key: ` + key + `
    rate_limit:
      requests_per_unit: 1000000
      unit: minute
      algorithm: fixed_window
      consistency: ` + consistency + `
`
}

// writeRules writes the load test's own rules, limiting descriptors of
// key, into dir.
func writeRules(dir, key string) error {
	for name, text := range loadtestRules(key) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// checkLeasedRules checks that the rules at path hold what the leased
// group compares: domains zipfExact and zipfLeased limiting (key, any
// value) alike, every limit exact in the first and leased in the second.
// Rules given with -config may lack them; the error says so before any
// server starts.
func checkLeasedRules(path, key string) error {
	rules, err := config.Load(path)
	if err != nil {
		return err
	}
	var limits [2][]config.Limit
	for i, want := range []struct {
		domain string
		cons   config.Consistency
	}{{zipfExact, config.Exact}, {zipfLeased, config.Leased}} {
		dom := rules.Domain(want.domain)
		if dom == nil {
			return fmt.Errorf("%s: no domain %s, which the leased scenarios load: add it (ratelimit-bench loadtest without -config writes one), or leave leased out of -scenarios", path, want.domain)
		}
		rule := dom.Match(oneEntry{key, "user-0"})
		if rule == nil || len(rule.Limits) == 0 {
			return fmt.Errorf("%s: domain %s has no limited rule for (%s, user-0)", path, want.domain, key)
		}
		for _, l := range rule.Limits {
			if l.Consistency != want.cons {
				return fmt.Errorf("%s: domain %s limits (%s, user-0) with consistency %s: want %s", path, want.domain, key, l.Consistency, want.cons)
			}
			l.Consistency = config.Exact // compared below, apart from it
			limits[i] = append(limits[i], l)
		}
	}
	if !slices.Equal(limits[0], limits[1]) {
		return fmt.Errorf("%s: domains %s and %s limit (%s, user-0) differently (%v and %v): the leased scenarios compare where decisions are made, so only the consistency may differ", path, zipfExact, zipfLeased, key, limits[0], limits[1])
	}
	return nil
}

// oneEntry is a descriptor of one entry, for config.Domain.Match.
type oneEntry [2]string

func (d oneEntry) Len() int                      { return 1 }
func (d oneEntry) Entry(int) (key, value string) { return d[0], d[1] }
