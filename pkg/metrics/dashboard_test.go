package metrics

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// dashboardPath is the Grafana dashboard over ratelimitd's metrics.
const dashboardPath = "../../deploy/grafana/ratelimitd.json"

// cmdMetrics are the metrics cmd/ratelimitd/metrics.go registers itself,
// copied from it (cmd is package main and cannot be imported): name, type
// and const labels. Keep in step with that file; TestDashboardMetricsExist
// in integration/ checks the dashboard against a real server's /metrics.
var cmdMetrics = []struct {
	name   string
	gauge  bool
	labels prometheus.Labels
}{
	{name: "ratelimitd_local_cache_hits_total"},
	{name: "ratelimitd_local_cache_misses_total"},
	{name: "ratelimitd_local_cache_keys", gauge: true},
	{name: "ratelimitd_memory_keys", gauge: true},
	{name: "ratelimitd_memory_evictions_total"},
	{name: "ratelimitd_backend_circuit_state", gauge: true},
	{name: "ratelimitd_backend_calls_total"},
	{name: "ratelimitd_backend_errors_total"},
	{name: "ratelimitd_backend_timeouts_total"},
	{name: "ratelimitd_backend_rejected_total"},
	{name: "ratelimitd_backend_circuit_opens_total"},
	{name: "ratelimitd_panics_total"},
	{name: "ratelimitd_config_reloads_total"},
	{name: "ratelimitd_config_reload_rejections_total"},
	{name: "ratelimitd_config_last_reload_timestamp_seconds", gauge: true},
	{name: "ratelimitd_config_loaded_timestamp_seconds", gauge: true},
	{name: "ratelimitd_config_info", gauge: true, labels: prometheus.Labels{"hash": "0"}},
	{name: "ratelimitd_lease_taken_total"},
	{name: "ratelimitd_lease_taken_hits_total"},
	{name: "ratelimitd_lease_returned_total"},
	{name: "ratelimitd_lease_returned_hits_total"},
	{name: "ratelimitd_lease_expired_hits_total"},
	{name: "ratelimitd_lease_stranded_hits_total"},
	{name: "ratelimitd_lease_held_hits", gauge: true},
	{name: "ratelimitd_lease_keys", gauge: true},
	{name: "ratelimitd_lease_evictions_total"},
	{name: "ratelimitd_reserve_hits", gauge: true, labels: prometheus.Labels{"domain": "ai", "rule": "ai.user", "limit": "0"}},
	{name: "ratelimitd_reserve_ttl_seconds", gauge: true, labels: prometheus.Labels{"domain": "ai", "rule": "ai.user", "limit": "0"}},
	{name: "ratelimitd_reserve_settles_total", labels: prometheus.Labels{"domain": "ai", "rule": "ai.user", "limit": "0", "released": "true"}},
	{name: "ratelimitd_reserve_settles_total", labels: prometheus.Labels{"domain": "ai", "rule": "ai.user", "limit": "0", "released": "false"}},
	{name: "ratelimitd_lease_decisions_total", labels: prometheus.Labels{"path": "local"}},
	{name: "ratelimitd_lease_decisions_total", labels: prometheus.Labels{"path": "backend"}},
	{name: "ratelimitd_lease_backend_calls_total"},
	{name: "ratelimitd_lease_background_errors_total"},
}

// exported returns the metric families ratelimitd exports, gathered from a
// registry populated as cmd does: this package's collectors, with a series
// of each label value they can take, and cmd's own. Registering both on
// one registry also checks that no name clashes.
func exported(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := New(reg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	rules := parseRules(t).Domain("messaging")
	for o := range service.Outcome(numOutcomes) {
		m.Decided("messaging", nil, desc("api_key", "k1"), o, 1)
	}
	d := desc("internal", "x")
	m.Decided("messaging", rules.Match(descriptor{d}), d, service.OutcomeUnlimited, 1)
	m.BackendCall(time.Millisecond, nil)
	m.BackendCall(time.Millisecond, errors.New("down"))
	m.Rules(parseRules(t))
	m.Slots(&service.SlotReport{Domain: "messaging", Rule: "messaging.export", Key: []byte("k"),
		Acquired: 1, Refused: 1, Released: 1, Expired: 1, InFlight: 1, Until: time.Minute})
	for _, c := range cmdMetrics {
		zero := func() float64 { return 0 }
		opts := prometheus.Opts{Name: c.name, Help: c.name, ConstLabels: c.labels}
		var col prometheus.Collector = prometheus.NewCounterFunc(prometheus.CounterOpts(opts), zero)
		if c.gauge {
			col = prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts), zero)
		}
		if err := reg.Register(col); err != nil {
			t.Fatalf("registering cmd's %s beside this package's metrics: %v", c.name, err)
		}
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := make(map[string]*dto.MetricFamily)
	for _, mf := range fams {
		byName[mf.GetName()] = mf
	}
	return byName
}

// panel is what the test reads of a Grafana panel.
type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // of a row
}

type dashboard struct {
	Title         string  `json:"title"`
	UID           string  `json:"uid"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"` // a string, or {"query": "..."}
		} `json:"list"`
	} `json:"templating"`
}

var (
	metricName = regexp.MustCompile(`\bratelimitd_[a-zA-Z0-9_:]*`)
	// selector is a metric name and its label matchers.
	selector = regexp.MustCompile(`\b(ratelimitd_[a-zA-Z0-9_:]*)\{([^}]*)\}`)
	matcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
)

// TestDashboard checks deploy/grafana/ratelimitd.json: every panel has a
// title and queries, on the ${DS_PROMETHEUS} data source, and every metric
// a query or variable names is one ratelimitd exports, with the labels
// and label values it selects on.
func TestDashboard(t *testing.T) {
	data, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var dash dashboard
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	if dash.Title == "" || dash.UID == "" || dash.SchemaVersion < 39 {
		t.Errorf("title %q, uid %q, schemaVersion %d; want a title, a uid and schemaVersion 39 or later", dash.Title, dash.UID, dash.SchemaVersion)
	}
	hasDS := false
	queries := map[string]string{} // where -> PromQL
	for _, v := range dash.Templating.List {
		switch {
		case v.Type == "datasource" && v.Name == "DS_PROMETHEUS":
			hasDS = true
		case v.Type == "query":
			q, _ := v.Query.(string)
			if m, ok := v.Query.(map[string]any); ok {
				q, _ = m["query"].(string)
			}
			queries["variable "+v.Name] = q
		}
	}
	if !hasDS {
		t.Error("no data source variable DS_PROMETHEUS")
	}

	var panels []panel
	for _, p := range dash.Panels {
		panels = append(panels, p)
		panels = append(panels, p.Panels...) // a collapsed row holds its panels
	}
	ids := map[int]bool{}
	n := 0
	for _, p := range panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		n++
		where := "panel " + p.Title
		if strings.TrimSpace(p.Title) == "" {
			where = fmt.Sprintf("panel with id %d", p.ID)
			t.Errorf("panel %d has no title", p.ID)
		}
		if p.Datasource == nil || p.Datasource.UID != "${DS_PROMETHEUS}" {
			t.Errorf("%s: data source %+v, want uid ${DS_PROMETHEUS}", where, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s has no queries", where)
		}
		for _, q := range p.Targets {
			if strings.TrimSpace(q.Expr) == "" {
				t.Errorf("%s: query %s has no expr", where, q.RefID)
			}
			queries[where+" query "+q.RefID] = q.Expr
		}
	}
	if n == 0 {
		t.Fatal("no panels")
	}

	fams := exported(t)
	values := map[string][]string{} // label -> values exported
	for _, mf := range fams {
		for _, mt := range mf.Metric {
			for _, l := range mt.Label {
				values[l.GetName()] = append(values[l.GetName()], l.GetValue())
			}
		}
	}
	used := map[string]bool{}
	for where, q := range queries {
		for _, name := range metricName.FindAllString(q, -1) {
			mf := family(fams, name)
			if mf == nil {
				t.Errorf("%s: ratelimitd exports no metric %s", where, name)
				continue
			}
			used[mf.GetName()] = true
		}
		for _, sel := range selector.FindAllStringSubmatch(q, -1) {
			mf := family(fams, sel[1])
			if mf == nil {
				continue // reported above
			}
			for _, mm := range matcher.FindAllStringSubmatch(sel[2], -1) {
				label, op, value := mm[1], mm[2], mm[3]
				switch {
				case label == "instance" || label == "job": // added by the scrape
				case !hasLabel(mf, label):
					t.Errorf("%s: %s has no label %s", where, sel[1], label)
				case op == "=" && !slices.Contains(values[label], value):
					t.Errorf("%s: %s never has %s=%q; its values: %q", where, sel[1], label, value, values[label])
				}
			}
		}
	}
	// The panels the dashboard is for.
	for _, name := range []string{
		"ratelimitd_decisions_total", "ratelimitd_hits_total", "ratelimitd_metric_series_dropped_total",
		"ratelimitd_backend_call_duration_seconds", "ratelimitd_backend_call_errors_total",
		"ratelimitd_backend_circuit_state", "ratelimitd_failure_mode_decisions_total", "ratelimitd_local_cache_hits_total",
		"ratelimitd_config_reloads_total", "ratelimitd_config_reload_rejections_total", "ratelimitd_panics_total",
		"ratelimitd_lease_decisions_total", "ratelimitd_lease_backend_calls_total", "ratelimitd_lease_held_hits",
		"ratelimitd_lease_keys", "ratelimitd_lease_evictions_total",
	} {
		if !used[name] {
			t.Errorf("no panel queries %s", name)
		}
	}
}

// family returns the exported family that name is a series of: itself,
// or, for a histogram, the name without _bucket, _sum or _count.
func family(fams map[string]*dto.MetricFamily, name string) *dto.MetricFamily {
	if mf := fams[name]; mf != nil {
		return mf
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if mf := fams[base]; mf != nil && mf.GetType() == dto.MetricType_HISTOGRAM {
				return mf
			}
		}
	}
	return nil
}

// hasLabel reports whether a series of mf has label, le included for a
// histogram's buckets.
func hasLabel(mf *dto.MetricFamily, label string) bool {
	if label == "le" && mf.GetType() == dto.MetricType_HISTOGRAM {
		return true
	}
	for _, mt := range mf.Metric {
		for _, l := range mt.Label {
			if l.GetName() == label {
				return true
			}
		}
	}
	return false
}
