package refstats_test

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/metrics/refstats"
)

var update = flag.Bool("update", false, "rewrite testdata/reference-events.txt from the statistics the scenario flushes")

// The goldens of the reference's Prometheus series. reference-events.txt
// is the statsd statistics of the decide scenario, as the reference names
// them (pinned by TestStatsdLines); reference-prometheus.golden is what
// envoyproxy/ratelimit's USE_PROMETHEUS shows for them, written by
// testdata/goldengen: statsd_exporter v0.26.1 (the reference's) mapping
// them by the reference's own src/stats/prom/default_mapper.yaml (commit
// in its first line). Neither comes from ratelimitd's mapping.
const (
	eventsFile = "testdata/reference-events.txt"
	goldenFile = "testdata/reference-prometheus.golden"
)

// recorder is a sink that keeps every sample flushed.
type recorder struct{ samples []refstats.Sample }

func (r *recorder) Flush(s []refstats.Sample) { r.samples = append(r.samples, s...) }

// eventLines are the samples as goldengen reads them, sorted.
func eventLines(samples []refstats.Sample) []string {
	var lines []string
	for _, s := range samples {
		kind := "counter"
		if s.Kind == refstats.Timer {
			kind = "timer"
		}
		lines = append(lines, fmt.Sprintf("%s %s %s", kind, s.Name, strconv.FormatFloat(s.Value, 'g', -1, 64)))
	}
	sort.Strings(lines)
	return lines
}

// TestReferenceEvents: the statistics goldengen was given are those the
// scenario flushes; with -update it rewrites them, and the golden must
// then be written again with goldengen.
func TestReferenceEvents(t *testing.T) {
	rec := &recorder{}
	e := start(t, rec)
	e.decide(t)
	e.stats.Flush()
	got := eventLines(rec.samples)
	if *update {
		if err := os.WriteFile(eventsFile, []byte(strings.Join(got, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s: run testdata/goldengen to write %s", eventsFile, goldenFile)
		return
	}
	b, err := os.ReadFile(eventsFile)
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Split(strings.TrimSpace(string(b)), "\n"); !slices.Equal(got, want) {
		t.Errorf("the scenario flushes:\n%s\n\n%s holds:\n%s\nrun with -update, then testdata/goldengen", strings.Join(got, "\n"), eventsFile, strings.Join(want, "\n"))
	}
}

// readGolden returns the series of the golden, without comments.
func readGolden(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(goldenFile)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	sort.Strings(out)
	return out
}
