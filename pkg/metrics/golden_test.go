package metrics

import (
	"bytes"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// gatherAndCompare is testutil.GatherAndCompare: it gathers g's families
// named names and compares their text exposition with expected, itself in
// the text format. testutil would need github.com/kylelemons/godebug added
// to go.mod; this does the same with what the module already requires:
// parse expected, normalize both sides, encode both as text, compare.
func gatherAndCompare(t *testing.T, g prometheus.Gatherer, expected string, names ...string) {
	t.Helper()
	got, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	want, err := parser.TextToMetricFamilies(strings.NewReader(expected))
	if err != nil {
		t.Fatalf("expected text: %v", err)
	}
	var wantFams []*dto.MetricFamily
	for _, mf := range want {
		if mf.Help == nil {
			mf.Help = new(string) // the parser leaves an empty help unset
		}
		wantFams = append(wantFams, mf)
	}
	gotText, wantText := encode(t, filter(got, names)), encode(t, filter(wantFams, names))
	if gotText != wantText {
		t.Errorf("metrics differ (-want +got):\n%s", lineDiff(wantText, gotText))
	}
}

// filter keeps the families named names, sorted by name, each with its
// metrics sorted by label values.
func filter(fams []*dto.MetricFamily, names []string) []*dto.MetricFamily {
	var out []*dto.MetricFamily
	for _, mf := range fams {
		if !slices.Contains(names, mf.GetName()) {
			continue
		}
		sort.SliceStable(mf.Metric, func(i, j int) bool { return labelKey(mf.Metric[i]) < labelKey(mf.Metric[j]) })
		out = append(out, mf)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
	return out
}

func labelKey(m *dto.Metric) string {
	var b strings.Builder
	for _, l := range m.GetLabel() {
		fmt.Fprintf(&b, "%s=%q,", l.GetName(), l.GetValue())
	}
	return b.String()
}

func encode(t *testing.T, fams []*dto.MetricFamily) string {
	t.Helper()
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain).WithEscapingScheme(model.NoEscaping))
	for _, mf := range fams {
		if err := enc.Encode(mf); err != nil {
			t.Fatalf("encode %s: %v", mf.GetName(), err)
		}
	}
	return buf.String()
}

// lineDiff lists the lines only in want (-) and only in got (+).
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for _, l := range w {
		if !slices.Contains(g, l) {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range g {
		if !slices.Contains(w, l) {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}
