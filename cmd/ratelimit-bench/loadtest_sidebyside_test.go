package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/refproc"
	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// TestSideContenders checks who the side-by-side group compares:
// nobody without a reference or a baseline (the group is skipped),
// ratelimitd first, each ratelimitd also in the reference's key format
// with -side-compat, the reference last and started without flags.
func TestSideContenders(t *testing.T) {
	if cs := (&sideConfig{Compat: true}).contenders("bin/ratelimitd", "127.0.0.1:1"); cs != nil {
		t.Fatalf("nothing to compare with: %v, want nil (the group skipped)", cs)
	}
	c := &sideConfig{Reference: "/r/ratelimit", Baseline: "/b/ratelimitd", BaselineFlags: "-redis-coalesce 1", RatelimitdFlags: " -redis-coalesce 2 ", Compat: true}
	cs := c.contenders("bin/ratelimitd", "127.0.0.1:1")
	var labels []string
	for _, ct := range cs {
		labels = append(labels, ct.label)
	}
	want := []string{"ratelimitd", "ratelimitd -redis-key-format reference", "baseline ratelimitd", "baseline ratelimitd -redis-key-format reference", "envoyproxy/ratelimit"}
	if !slices.Equal(labels, want) {
		t.Fatalf("contenders %q, want %q", labels, want)
	}
	redis := []string{"-backend", "redis", "-redis-url", "redis://127.0.0.1:1"}
	for i, args := range [][]string{
		append(slices.Clone(redis), "-redis-coalesce", "2"),
		append(slices.Clone(redis), "-redis-coalesce", "2", "-redis-key-format", "reference"),
		append(slices.Clone(redis), "-redis-coalesce", "1"),
		append(slices.Clone(redis), "-redis-coalesce", "1", "-redis-key-format", "reference"),
		nil,
	} {
		if !slices.Equal(cs[i].args, args) {
			t.Errorf("%s: flags %q, want %q", cs[i].label, cs[i].args, args)
		}
	}
	if cs[0].bin != "bin/ratelimitd" || cs[2].bin != "/b/ratelimitd" || !cs[4].ref || cs[4].bin != "/r/ratelimit" {
		t.Errorf("binaries: %+v", cs)
	}
	c.Compat, c.Baseline = false, ""
	if cs := c.contenders("bin/ratelimitd", "127.0.0.1:1"); len(cs) != 2 || cs[0].ref || !cs[1].ref {
		t.Errorf("reference alone, without -side-compat: %+v", cs)
	}
}

// TestSideRows checks the summary of the rounds: medians per figure,
// and the ratios of each round against the same round of ratelimitd:
// the reference's row compares it with every ratelimitd, a baseline's
// with ratelimitd.
func TestSideRows(t *testing.T) {
	cs := []contender{{label: "ratelimitd"}, {label: "baseline ratelimitd"}, {label: "envoyproxy/ratelimit", ref: true}}
	row := func(rate, server, redis float64) scenario {
		return scenario{DecisionsPerS: rate, P50: 1, P99: 2, P999: 3, ServerCPU: server, RedisCPU: redis, BenchCPU: 1, DecisionsPerCall: -1}
	}
	runs := [][]scenario{
		{row(15000, 50, 20), row(16000, 40, 16), row(14000, 60, 30)},
		{row(15000, 50, 20), row(8000, 40, 16), row(14000, 60, 30)},
		{row(10000, 120, 18), row(10000, 100, 20), row(7000, 120, 30)},
	}
	rows := sideRows("one_limit", cs, runs, 50)
	if len(rows) != 3 {
		t.Fatalf("%d rows, want 3", len(rows))
	}
	if r := rows[0]; r.DecisionsPerS != 15000 || r.ServerCPU != 50 || r.RedisCPU != 20 || r.DecisionsPerCall != -1 || len(r.Notes) != 0 {
		t.Errorf("ratelimitd's medians: %+v", r)
	}
	if r := rows[2]; r.DecisionsPerS != 10000 || r.ServerCPU != 120 || r.RedisCPU != 20 {
		t.Errorf("the reference's medians: %+v", r)
	}
	if !strings.Contains(rows[0].Name, "median of 3 rounds") || !strings.Contains(rows[2].Name, "domain one_limit: envoyproxy/ratelimit, 50 callers") {
		t.Errorf("names: %q, %q", rows[0].Name, rows[2].Name)
	}
	if n := rows[1].Notes; len(n) != 1 || !strings.Contains(n[0], "decisions/s ×1.00 (×1.00, ×2.00, ×1.00)") {
		t.Errorf("baseline's note: %q", n)
	}
	// Rounds: 15000/10000, 16000/10000, 14000/7000; 120/50, 100/40, 120/60; 18/20, 20/16, 30/30.
	want := "ratelimitd against it, median of the rounds' ratios (each round): decisions/s ×1.60 (×1.50, ×1.60, ×2.00); server CPU-µs/decision ×2.40 (×2.40, ×2.50, ×2.00) cheaper; Redis CPU-µs/decision ×1.00 (×0.90, ×1.25, ×1.00) cheaper"
	if n := rows[2].Notes; len(n) != 2 || n[0] != want || !strings.HasPrefix(n[1], "baseline ratelimitd against it") {
		t.Errorf("the reference's notes:\n%q\nwant first\n%q", n, want)
	}
}

// TestReferenceRules checks that the rules the side-by-side group gives
// the reference are ratelimitd's own files of the measured domains, in
// refproc's rule directory, and that a domain the reference could not
// decide alike is refused.
func TestReferenceRules(t *testing.T) {
	dir, root := t.TempDir(), t.TempDir()
	if err := writeRules(dir, "user_id"); err != nil {
		t.Fatal(err)
	}
	if err := writeSideRules(dir, "user_id"); err != nil {
		t.Fatal(err)
	}
	if _, err := config.Load(dir); err != nil {
		t.Fatalf("the load test's rules with hour_limit: %v", err)
	}
	if err := referenceRules(dir, root, "user_id", []string{oneLimit, hourLimit}); err != nil {
		t.Fatal(err)
	}
	got, err := filepath.Glob(filepath.Join(refproc.ConfigDir(root), "*"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(refproc.ConfigDir(root), hourLimit+".yaml"), filepath.Join(refproc.ConfigDir(root), oneLimit+".yaml")}
	if !slices.Equal(got, want) {
		t.Fatalf("the reference's rules: %q, want %q", got, want)
	}
	text, err := os.ReadFile(want[0])
	if err != nil || !strings.Contains(string(text), "unit: hour") || strings.Contains(string(text), "algorithm") {
		t.Errorf("%s: %q (%v)", want[0], text, err)
	}
	if err := referenceRules(dir, root, "user_id", []string{twoLimits}); err == nil || !strings.Contains(err.Error(), "with one limit") {
		t.Errorf("two limits on one descriptor: %v, want refused", err)
	}
	if err := referenceRules(dir, root, "user_id", []string{"nope"}); err == nil || !strings.Contains(err.Error(), "no domain nope") {
		t.Errorf("an unknown domain: %v", err)
	}
}

// TestSideFlagsRefuseBeforeStarting: wrong side-by-side flags are usage
// errors before anything starts.
func TestSideFlagsRefuseBeforeStarting(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-side-rounds", "0"}, "-side-rounds 0: want 1 to 50"},
		{[]string{"-side-domains", " , "}, "-side-domains is empty"},
	} {
		var out, errOut bytes.Buffer
		args := append([]string{"loadtest", "-ratelimitd", "/nonexistent/ratelimitd", "-duration", "1s"}, tc.args...)
		if code := Main(context.Background(), args, &out, &errOut); code != exitUsage || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want %d and %q", tc.args, code, errOut.String(), exitUsage, tc.want)
		}
	}
}
