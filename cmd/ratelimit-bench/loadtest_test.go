package main

import (
	"bytes"
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
)

func TestParseScenarios(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"all", scenarioGroups},
		{"leased", []string{groupLeased}},
		{" leased , floors", []string{groupLeased, groupFloors}},
		{"standard,all", scenarioGroups},
	} {
		got, err := parseScenarios(tc.in)
		if err != nil {
			t.Errorf("%q: %v", tc.in, err)
			continue
		}
		if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, slices.Sorted(slices.Values(tc.want))) {
			t.Errorf("%q: groups %v, want %v", tc.in, keys, tc.want)
		}
	}
	for _, in := range []string{"", "lease", "leased,", "standard floors"} {
		if _, err := parseScenarios(in); err == nil || !strings.Contains(err.Error(), "want all, or some of standard, redis-benchmark, leased, floors") {
			t.Errorf("%q: err %v, want one listing the groups", in, err)
		}
	}
}

// TestLoadtestFlagsRefuseBeforeStarting checks that a wrong -scenarios or
// -zipf-s is a usage error before any process starts (the binaries named
// do not exist: starting anything would fail otherwise).
func TestLoadtestFlagsRefuseBeforeStarting(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-scenarios", "leasd"}, `unknown group "leasd"`},
		{[]string{"-zipf-s", "0"}, "-zipf-s 0: want a number above 0"},
	} {
		var out, errOut bytes.Buffer
		args := append([]string{"loadtest", "-ratelimitd", "/nonexistent/ratelimitd", "-duration", "1s"}, tc.args...)
		if code := Main(context.Background(), args, &out, &errOut); code != exitUsage || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want %d and %q", tc.args, code, errOut.String(), exitUsage, tc.want)
		}
	}
	var out, errOut bytes.Buffer
	if code := Main(context.Background(), []string{"loadtest", "-h"}, &out, &errOut); code != exitOK {
		t.Fatalf("-h: exit %d", code)
	}
	for _, g := range scenarioGroups {
		if !strings.Contains(errOut.String(), "\n  "+g+": ") {
			t.Errorf("-h does not describe the group %s:\n%s", g, errOut.String())
		}
	}
}

// TestLeasedRuns checks the leased group's scenarios: Zipf keys, each
// domain at Workers callers then at 1, closed loop, reports named apart.
func TestLeasedRuns(t *testing.T) {
	lt := &loadtest{cfg: &loadtestConfig{Workers: 50, Conns: 4, Keys: 10_000, ZipfS: 1.1}}
	runs := lt.leasedRuns("ratelimitd, Redis (FCALL)", "redis", zipfExact, zipfLeased)
	want := []struct {
		domain  string
		workers int
	}{{zipfExact, 50}, {zipfExact, 1}, {zipfLeased, 50}, {zipfLeased, 1}}
	if len(runs) != len(want) {
		t.Fatalf("%d runs, want %d: %+v", len(runs), len(want), runs)
	}
	files := map[string]bool{}
	for i, g := range runs {
		if g.domain != want[i].domain || g.workers != want[i].workers || !g.zipf || g.rate != 0 || g.conns > g.workers {
			t.Errorf("run %d: %+v, want domain %s at %d callers, Zipf, closed loop", i, g, want[i].domain, want[i].workers)
		}
		if !strings.Contains(g.name, "Zipf(1.1) over 10,000 keys") || !strings.Contains(g.name, "domain "+g.domain) {
			t.Errorf("run %d: the name %q does not say the keys and the domain", i, g.name)
		}
		file := strings.Replace(g.file, "%d", "50", 1)
		if files[file] {
			t.Errorf("run %d: the report %s is another run's too", i, file)
		}
		files[file] = true
	}
}

func TestCompareLeased(t *testing.T) {
	row := func(name string, dps, p50, redisCPU float64) scenario {
		return scenario{Name: name, DecisionsPerS: dps, P50: p50, RedisCPU: redisCPU, ServerCPU: 20, BenchCPU: 10, DecisionsPerCall: -1}
	}
	onRedis := []scenario{
		row("exact 50", 20000, 2000, 10),
		row("exact 1", 3000, 300, 12),
		row("leased 50", 38000, 1000, 0.5),
		row("leased 1", 5000, 180, 0.4),
	}
	onMemory := []scenario{
		row("memory 50", 40000, 900, -1),
		row("memory 1", 5200, 160, -1),
	}
	rows := compareLeased(onRedis, onMemory, 50)
	var names []string
	for _, r := range rows {
		names = append(names, r.Name)
	}
	if want := []string{"exact 50", "leased 50", "memory 50", "exact 1", "leased 1", "memory 1"}; !slices.Equal(names, want) {
		t.Fatalf("rows %q, want %q", names, want)
	}
	notes := strings.Join(rows[1].Notes, "\n")
	for _, want := range []string{
		"Redis CPU-µs per decision 0.05× the exact domain's (0.50 against 10.00 at 50 callers)",
		"decisions/s 0.95× the memory backend's on the leased domain (38,000 against 40,000 at 50 callers)",
	} {
		if !strings.Contains(notes, want) {
			t.Errorf("leased row at 50 callers: notes\n%s\nwant %q", notes, want)
		}
	}
	if want := "p50 1.12× the memory backend's on the leased domain (180µs against 160µs at 1 caller)"; !slices.Contains(rows[4].Notes, want) {
		t.Errorf("leased row at 1 caller: notes %q, want %q", rows[4].Notes, want)
	}
	for _, i := range []int{0, 2, 3, 5} {
		if len(rows[i].Notes) != 0 {
			t.Errorf("%s: notes %q, want none", rows[i].Name, rows[i].Notes)
		}
	}
}
