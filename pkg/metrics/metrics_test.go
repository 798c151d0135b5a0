package metrics

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"weak"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/breaker"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

const testRules = `
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 4}
  - key: to_number
    detailed_metric: true
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: sender
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: internal
    rate_limit: {unlimited: true}
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: files
    value: /shared/*
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: files
    value: /own/*
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
`

func parseRules(t testing.TB) *config.Rules {
	t.Helper()
	rs, err := config.Parse(config.File{Name: "messaging.yaml", Data: []byte(testRules)})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// newService returns a service on backend be (the memory backend when
// nil) under the test rules, observed by m.
func newService(t testing.TB, m *Metrics, be algo.Backend) *service.Service {
	t.Helper()
	if be == nil {
		mem := memory.New(memory.Options{SweepInterval: -1})
		t.Cleanup(func() { mem.Close() })
		be = mem
	}
	svc, err := service.New(be, parseRules(t), service.Options{
		// A clock that moves on by a millisecond each time it is read, so
		// that every backend call the service times takes 1ms.
		Observer: m, NearLimitRatio: 0.5, Now: clocktest.New(time.Unix(1_700_000_040, 0)).Ticking(time.Millisecond),
	})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func newMetrics(t testing.TB, opts Options) (*Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := New(reg, opts)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

func desc(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// call asks svc about descriptors ds of domain messaging, hits each.
func call(t testing.TB, svc *service.Service, hits uint32, ds ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "messaging", Descriptors: ds, HitsAddend: hits})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// header is the HELP and TYPE lines of a metric.
func header(name, help, typ string) string {
	return fmt.Sprintf("# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

var (
	decisionsHeader = header("ratelimitd_decisions_total", helpDecisions, "counter")
	hitsHeader      = header("ratelimitd_hits_total", helpHits, "counter")
	droppedHeader   = header("ratelimitd_metric_series_dropped_total", helpDropped, "counter")
)

// TestResults drives every result through a real service: ok, near_limit
// and over_limit of a rule, near_limit and shadow_mode of a shadow rule,
// unlimited, and an override; with the hits asked for. The counters of
// each result a rule can have start at zero.
func TestResults(t *testing.T) {
	m, reg := newMetrics(t, Options{})
	svc := newService(t, m, nil)

	marketing := desc("message_type", "marketing", "to_number", "2061111111")
	codes := ""
	for range 5 { // 4 a day, near past 2: ok, ok, near, near, over
		codes += call(t, svc, 0, marketing).OverallCode.String()[:2]
	}
	if codes != "OKOKOKOKOV" {
		t.Errorf("codes %s", codes)
	}
	call(t, svc, 0, desc("sender", "s1")) // 1 a minute: near
	call(t, svc, 0, desc("sender", "s1")) // over, but shadow: admitted
	call(t, svc, 3, desc("internal", "x"))
	override := desc("api_key", "k1")
	override.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: 2 /* MINUTE */}
	for range 3 { // ok, near, over
		call(t, svc, 0, override)
	}
	call(t, svc, 0, desc("color", "red")) // no rule: not counted

	gatherAndCompare(t, reg, decisionsHeader+`
ratelimitd_decisions_total{domain="messaging",result="near_limit",rule="messaging.message_type_marketing.to_number"} 2
ratelimitd_decisions_total{domain="messaging",result="ok",rule="messaging.message_type_marketing.to_number"} 2
ratelimitd_decisions_total{domain="messaging",result="over_limit",rule="messaging.message_type_marketing.to_number"} 1
ratelimitd_decisions_total{domain="messaging",result="near_limit",rule="messaging.sender"} 1
ratelimitd_decisions_total{domain="messaging",result="ok",rule="messaging.sender"} 0
ratelimitd_decisions_total{domain="messaging",result="shadow_mode",rule="messaging.sender"} 1
ratelimitd_decisions_total{domain="messaging",result="unlimited",rule="messaging.internal"} 1
ratelimitd_decisions_total{domain="messaging",result="near_limit",rule="override"} 1
ratelimitd_decisions_total{domain="messaging",result="ok",rule="override"} 1
ratelimitd_decisions_total{domain="messaging",result="over_limit",rule="override"} 1
`+hitsHeader+`
ratelimitd_hits_total{domain="messaging",rule="messaging.message_type_marketing.to_number"} 5
ratelimitd_hits_total{domain="messaging",rule="messaging.sender"} 2
ratelimitd_hits_total{domain="messaging",rule="messaging.internal"} 3
ratelimitd_hits_total{domain="messaging",rule="override"} 3
`, "ratelimitd_decisions_total", "ratelimitd_hits_total")
}

// TestDetailedMetric: a rule with detailed_metric is counted under the
// domain and the descriptor's key_value pairs; a rule without it, matched
// by the same values, under its ID.
func TestDetailedMetric(t *testing.T) {
	m, reg := newMetrics(t, Options{})
	svc := newService(t, m, nil)
	call(t, svc, 0, desc("to_number", "2061111111"))
	call(t, svc, 0, desc("to_number", "2061111111"))
	two := desc("to_number", "2062222222")
	two.HitsAddend = wrapperspb.UInt64(2) // the descriptor's own hits
	call(t, svc, 0, two)
	call(t, svc, 0, desc("message_type", "marketing", "to_number", "2062222222"))

	gatherAndCompare(t, reg, decisionsHeader+`
ratelimitd_decisions_total{domain="messaging",result="near_limit",rule="messaging.to_number_2061111111"} 0
ratelimitd_decisions_total{domain="messaging",result="ok",rule="messaging.to_number_2061111111"} 2
ratelimitd_decisions_total{domain="messaging",result="over_limit",rule="messaging.to_number_2061111111"} 0
ratelimitd_decisions_total{domain="messaging",result="near_limit",rule="messaging.to_number_2062222222"} 0
ratelimitd_decisions_total{domain="messaging",result="ok",rule="messaging.to_number_2062222222"} 1
ratelimitd_decisions_total{domain="messaging",result="over_limit",rule="messaging.to_number_2062222222"} 0
ratelimitd_decisions_total{domain="messaging",result="near_limit",rule="messaging.message_type_marketing.to_number"} 0
ratelimitd_decisions_total{domain="messaging",result="ok",rule="messaging.message_type_marketing.to_number"} 1
ratelimitd_decisions_total{domain="messaging",result="over_limit",rule="messaging.message_type_marketing.to_number"} 0
`+hitsHeader+`
ratelimitd_hits_total{domain="messaging",rule="messaging.to_number_2061111111"} 2
ratelimitd_hits_total{domain="messaging",rule="messaging.to_number_2062222222"} 2
ratelimitd_hits_total{domain="messaging",rule="messaging.message_type_marketing.to_number"} 1
`, "ratelimitd_decisions_total", "ratelimitd_hits_total")
}

// TestValueToMetric: a key-only level with value_to_metric names the
// request's value, the other levels as in the rule ID; a wildcard level
// with value_to_metric names it too, unless share_threshold makes its
// values share one counter.
func TestValueToMetric(t *testing.T) {
	m, reg := newMetrics(t, Options{})
	svc := newService(t, m, nil)
	call(t, svc, 0, desc("route", "/api", "method", "GET"))
	call(t, svc, 0, desc("route", "/api", "method", "POST"))
	call(t, svc, 0, desc("route", "/web", "method", "GET"))
	call(t, svc, 0, desc("files", "/shared/a"))
	call(t, svc, 0, desc("files", "/shared/b"))
	call(t, svc, 0, desc("files", "/own/a"))

	gatherAndCompare(t, reg, hitsHeader+`
ratelimitd_hits_total{domain="messaging",rule="messaging.route_/api.method"} 2
ratelimitd_hits_total{domain="messaging",rule="messaging.route_/web.method"} 1
ratelimitd_hits_total{domain="messaging",rule="messaging.files_/shared/*"} 2
ratelimitd_hits_total{domain="messaging",rule="messaging.files_/own/a"} 1
`+droppedHeader+`
ratelimitd_metric_series_dropped_total 0
`, "ratelimitd_hits_total", "ratelimitd_metric_series_dropped_total")
}

// TestCap: past MaxDetailedSeries detailed labels, of detailed_metric and
// value_to_metric rules together, new values are counted under the plain
// rule ID and as dropped, with one warning; labels already made go on.
func TestCap(t *testing.T) {
	var logs bytes.Buffer
	m, reg := newMetrics(t, Options{MaxDetailedSeries: 2, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	svc := newService(t, m, nil)
	call(t, svc, 0, desc("to_number", "1"))
	call(t, svc, 0, desc("route", "/api", "method", "GET"))
	call(t, svc, 0, desc("to_number", "2"))                 // capped
	call(t, svc, 0, desc("to_number", "3"))                 // capped
	call(t, svc, 0, desc("route", "/web", "method", "GET")) // capped
	call(t, svc, 0, desc("to_number", "1"))                 // already made
	call(t, svc, 0, desc("files", "/shared/x"))             // one series per wildcard: not detailed

	gatherAndCompare(t, reg, hitsHeader+`
ratelimitd_hits_total{domain="messaging",rule="messaging.to_number_1"} 2
ratelimitd_hits_total{domain="messaging",rule="messaging.route_/api.method"} 1
ratelimitd_hits_total{domain="messaging",rule="messaging.to_number"} 2
ratelimitd_hits_total{domain="messaging",rule="messaging.route.method"} 1
ratelimitd_hits_total{domain="messaging",rule="messaging.files_/shared/*"} 1
`+droppedHeader+`
ratelimitd_metric_series_dropped_total 3
`, "ratelimitd_hits_total", "ratelimitd_metric_series_dropped_total")
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 {
		t.Errorf("%d warnings, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "max_detailed_series=2") {
		t.Errorf("warning does not name the cap:\n%s", logs.String())
	}

	// A negative cap makes no detailed label at all, and drops nothing.
	m, reg = newMetrics(t, Options{MaxDetailedSeries: -1})
	svc = newService(t, m, nil)
	call(t, svc, 0, desc("to_number", "1"))
	gatherAndCompare(t, reg, hitsHeader+`
ratelimitd_hits_total{domain="messaging",rule="messaging.to_number"} 1
`+droppedHeader+`
ratelimitd_metric_series_dropped_total 0
`, "ratelimitd_hits_total", "ratelimitd_metric_series_dropped_total")
}

// TestUnknownDomain: requests of a domain no rule file defines are not
// decided, and so add no label values, overrides included.
func TestUnknownDomain(t *testing.T) {
	m, reg := newMetrics(t, Options{})
	svc := newService(t, m, nil)
	d := desc("api_key", "k1")
	d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: 2}
	if _, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "other", Descriptors: []*rlv3.RateLimitDescriptor{d}}); err != nil {
		t.Fatal(err)
	}
	gatherAndCompare(t, reg, "", "ratelimitd_decisions_total", "ratelimitd_hits_total")
}

// failing is a backend whose every call fails with err.
type failing struct{ err error }

func (f failing) Decide(context.Context, []algo.Request, []algo.Decision) error { return f.err }

// waiting is a backend that answers only when its context ends.
type waiting struct{}

func (waiting) Decide(ctx context.Context, _ []algo.Request, _ []algo.Decision) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestBackend drives successful and failing backend calls through real
// services, one of each error kind, every call taking 1ms by the service's
// clock: past a context deadline (the caller's, or the breaker's), a
// network timeout, a call cancelled by its caller, another error, and one
// refused by the open circuit, which is not timed.
func TestBackend(t *testing.T) {
	m, reg := newMetrics(t, Options{})
	call(t, newService(t, m, nil), 0, desc("sender", "s1"))

	expired, cancel := context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer cancel()
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	req := &rlsv3.RateLimitRequest{Domain: "messaging", Descriptors: []*rlv3.RateLimitDescriptor{desc("sender", "s1")}}
	svc := newService(t, m, waiting{})
	for _, ctx := range []context.Context{expired, canceled} {
		if _, err := svc.ShouldRateLimit(ctx, req); err == nil {
			t.Errorf("no error past the caller's context: %v", ctx.Err())
		}
	}
	call(t, newService(t, m, breaker.New(waiting{}, breaker.Options{Timeout: time.Millisecond})), 0, desc("sender", "s1"))
	netTimeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	call(t, newService(t, m, failing{netTimeout}), 0, desc("sender", "s1"))
	svc = newService(t, m, breaker.New(failing{errors.New("connection refused")}, breaker.Options{Failures: 1, Cooldown: time.Hour}))
	call(t, svc, 0, desc("sender", "s1")) // other, and the circuit opens
	call(t, svc, 0, desc("sender", "s1")) // circuit_open

	gatherAndCompare(t, reg, header("ratelimitd_backend_call_errors_total", helpErrors, "counter")+`
ratelimitd_backend_call_errors_total{kind="canceled"} 1
ratelimitd_backend_call_errors_total{kind="circuit_open"} 1
ratelimitd_backend_call_errors_total{kind="other"} 1
ratelimitd_backend_call_errors_total{kind="timeout"} 3
`+header("ratelimitd_backend_call_duration_seconds", helpLatency, "histogram")+`
ratelimitd_backend_call_duration_seconds_bucket{le="5e-05"} 0
ratelimitd_backend_call_duration_seconds_bucket{le="0.0001"} 0
ratelimitd_backend_call_duration_seconds_bucket{le="0.0002"} 0
ratelimitd_backend_call_duration_seconds_bucket{le="0.0004"} 0
ratelimitd_backend_call_duration_seconds_bucket{le="0.0008"} 0
ratelimitd_backend_call_duration_seconds_bucket{le="0.0016"} 6
ratelimitd_backend_call_duration_seconds_bucket{le="0.0032"} 6
ratelimitd_backend_call_duration_seconds_bucket{le="0.0064"} 6
ratelimitd_backend_call_duration_seconds_bucket{le="0.0128"} 6
ratelimitd_backend_call_duration_seconds_bucket{le="0.0256"} 6
ratelimitd_backend_call_duration_seconds_bucket{le="0.0512"} 6
ratelimitd_backend_call_duration_seconds_bucket{le="0.1024"} 6
ratelimitd_backend_call_duration_seconds_bucket{le="+Inf"} 6
ratelimitd_backend_call_duration_seconds_sum 0.006
ratelimitd_backend_call_duration_seconds_count 6
`, "ratelimitd_backend_call_errors_total", "ratelimitd_backend_call_duration_seconds")
}

// TestClassify checks each error kind, wrapped or not.
func TestClassify(t *testing.T) {
	for _, c := range []struct {
		err  error
		want ErrorKind
	}{
		{context.DeadlineExceeded, KindTimeout},
		{fmt.Errorf("redis: %w", context.DeadlineExceeded), KindTimeout},
		{&net.OpError{Op: "dial", Err: os.ErrDeadlineExceeded}, KindTimeout},
		{breaker.ErrOpen, KindCircuitOpen},
		{fmt.Errorf("backend: %w", breaker.ErrOpen), KindCircuitOpen},
		{context.Canceled, KindCanceled},
		{errors.New("ERR unknown command"), KindOther},
		{&net.OpError{Op: "dial", Err: errors.New("connection refused")}, KindOther},
	} {
		if got := Classify(c.err); got != c.want {
			t.Errorf("Classify(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestReload: each reload brings new rule pointers; their decisions add
// up under the same series, and the pointer cache stays bounded.
func TestReload(t *testing.T) {
	m, reg := newMetrics(t, Options{})
	d := desc("message_type", "marketing", "to_number", "1")
	const reloads = 200
	for range reloads {
		rule := parseRules(t).Domain("messaging").Match(descriptor{d})
		m.Decided("messaging", rule, d, service.OutcomeOK, 1)
	}
	n := 0
	m.byRule.Range(func(any, any) bool { n++; return true })
	if max := 2*len(m.byID) + 16; n > max || m.cached > max {
		t.Errorf("%d cached rule pointers (%d counted) for %d rule IDs; want at most %d", n, m.cached, len(m.byID), max)
	}
	gatherAndCompare(t, reg, hitsHeader+fmt.Sprintf(`
ratelimitd_hits_total{domain="messaging",rule="messaging.message_type_marketing.to_number"} %d
`, reloads), "ratelimitd_hits_total")
}

// descriptor adapts a descriptor for config.Domain.Match.
type descriptor struct{ d *rlv3.RateLimitDescriptor }

func (d descriptor) Len() int { return len(d.d.Entries) }
func (d descriptor) Entry(i int) (string, string) {
	return d.d.Entries[i].Key, d.d.Entries[i].Value
}

// TestConcurrent decides from many goroutines at once, new detailed labels
// racing the cap, and checks that every decision was counted once.
func TestConcurrent(t *testing.T) {
	m, reg := newMetrics(t, Options{MaxDetailedSeries: 50})
	rules := parseRules(t).Domain("messaging")
	const goroutines, each = 8, 500
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				d := desc("to_number", fmt.Sprint((g*each+i)%100))
				if i%3 == 0 {
					d = desc("internal", "x")
				}
				m.Decided("messaging", rules.Match(descriptor{d}), d, service.OutcomeOK, 1)
				if i%7 == 0 {
					m.Decided("messaging", nil, d, service.OutcomeOverLimit, 1)
				}
			}
		})
	}
	wg.Wait()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sums := map[string]float64{}
	series := map[string]int{}
	for _, mf := range fams {
		for _, mt := range mf.Metric {
			sums[mf.GetName()] += mt.GetCounter().GetValue()
			series[mf.GetName()]++
		}
	}
	overrides := goroutines * ((each + 6) / 7)
	if want := float64(goroutines*each + overrides); sums["ratelimitd_hits_total"] != want || sums["ratelimitd_decisions_total"] != want {
		t.Errorf("hits %v, decisions %v; want %v", sums["ratelimitd_hits_total"], sums["ratelimitd_decisions_total"], want)
	}
	// 50 detailed labels, the plain to_number, internal and override.
	if want := 50 + 3; series["ratelimitd_hits_total"] != want {
		t.Errorf("%d hits series, want %d", series["ratelimitd_hits_total"], want)
	}
	if sums["ratelimitd_metric_series_dropped_total"] == 0 {
		t.Error("nothing dropped past the cap")
	}
}

// TestNoAllocs: deciding a rule without detailed metrics, an override, or
// an already made detailed label allocates nothing.
func TestNoAllocs(t *testing.T) {
	m, _ := newMetrics(t, Options{})
	rules := parseRules(t).Domain("messaging")
	plain := desc("message_type", "marketing", "to_number", "1")
	detailed := desc("to_number", "2061111111")
	override := desc("api_key", "k1")
	override.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: 2}
	for _, c := range []struct {
		name string
		rule *config.Rule
		d    *rlv3.RateLimitDescriptor
	}{
		{"plain", rules.Match(descriptor{plain}), plain},
		{"override", nil, override},
		{"detailed", rules.Match(descriptor{detailed}), detailed},
	} {
		m.Decided("messaging", c.rule, c.d, service.OutcomeOK, 1) // make the series
		if n := testing.AllocsPerRun(1000, func() { m.Decided("messaging", c.rule, c.d, service.OutcomeOK, 1) }); n != 0 {
			t.Errorf("%s: %v allocations per Decided, want 0", c.name, n)
		}
	}
	if n := testing.AllocsPerRun(1000, func() { m.BackendCall(time.Millisecond, nil) }); n != 0 {
		t.Errorf("%v allocations per successful BackendCall, want 0", n)
	}
}

// TestRegister: New fails on a registry that already holds its metrics,
// and refuses a nil one.
func TestRegister(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := New(reg, Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(reg, Options{}); err == nil {
		t.Error("registered twice on one registry")
	}
	if _, err := New(nil, Options{}); err == nil {
		t.Error("nil registerer accepted")
	}
}

func BenchmarkDecided(b *testing.B) {
	rules := parseRules(b).Domain("messaging")
	override := desc("api_key", "k1")
	override.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: 2}
	for _, c := range []struct {
		name string
		d    *rlv3.RateLimitDescriptor
	}{
		{"plain", desc("message_type", "marketing", "to_number", "1")},
		{"override", override},
		{"detailed", desc("to_number", "2061111111")},
	} {
		m, _ := newMetrics(b, Options{})
		var rule *config.Rule
		if c.d.Limit == nil {
			rule = rules.Match(descriptor{c.d})
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				m.Decided("messaging", rule, c.d, service.OutcomeOK, 1)
			}
		})
		b.Run(c.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					m.Decided("messaging", rule, c.d, service.OutcomeOK, 1)
				}
			})
		})
	}
}

func BenchmarkBackendCall(b *testing.B) {
	m, _ := newMetrics(b, Options{})
	b.ReportAllocs()
	for b.Loop() {
		m.BackendCall(300*time.Microsecond, nil)
	}
}

// TestRulesTable: the rules put in force with Rules are found in its
// table, by index, and cached nowhere else; a rule of another set with
// the same index is told apart, and counted under its own ID; the series
// carry a creation time, as prometheus counters do.
func TestRulesTable(t *testing.T) {
	m, reg := newMetrics(t, Options{})
	plain := desc("message_type", "marketing", "to_number", "1")
	first := parseRules(t)
	m.Rules(first)
	m.Decided("messaging", first.Domain("messaging").Match(descriptor{plain}), plain, service.OutcomeOK, 1)

	// New pointers for the same IDs, decided before and after Rules.
	second := parseRules(t)
	rule := second.Domain("messaging").Match(descriptor{plain})
	m.Decided("messaging", rule, plain, service.OutcomeOK, 1)
	m.Rules(second)
	m.Decided("messaging", rule, plain, service.OutcomeNearLimit, 1)
	cached := 0
	m.byRule.Range(func(any, any) bool { cached++; return true })
	if cached != 0 {
		t.Errorf("%d rule pointers cached besides the table", cached)
	}

	// Another set, whose first rule has the first index too.
	other, err := config.Parse(config.File{Name: "other.yaml", Data: []byte("domain: other\ndescriptors:\n  - {key: k, rate_limit: {unit: second, requests_per_unit: 1}}\n")})
	if err != nil {
		t.Fatal(err)
	}
	k := desc("k", "v")
	otherRule := other.Domain("other").Match(descriptor{k})
	if otherRule.Index() != 0 || m.table.Load().entries[0].rule == otherRule {
		t.Fatalf("index %d", otherRule.Index())
	}
	m.Decided("other", otherRule, k, service.OutcomeOK, 3)

	gatherAndCompare(t, reg, decisionsHeader+`
ratelimitd_decisions_total{domain="messaging",result="near_limit",rule="messaging.message_type_marketing.to_number"} 1
ratelimitd_decisions_total{domain="messaging",result="ok",rule="messaging.message_type_marketing.to_number"} 2
ratelimitd_decisions_total{domain="messaging",result="over_limit",rule="messaging.message_type_marketing.to_number"} 0
ratelimitd_decisions_total{domain="other",result="near_limit",rule="other.k"} 0
ratelimitd_decisions_total{domain="other",result="ok",rule="other.k"} 1
ratelimitd_decisions_total{domain="other",result="over_limit",rule="other.k"} 0
`+hitsHeader+`
ratelimitd_hits_total{domain="messaging",rule="messaging.message_type_marketing.to_number"} 3
ratelimitd_hits_total{domain="other",rule="other.k"} 3
`, "ratelimitd_decisions_total", "ratelimitd_hits_total")

	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range fams {
		if name := mf.GetName(); name == "ratelimitd_decisions_total" || name == "ratelimitd_hits_total" {
			for _, mt := range mf.Metric {
				if ts := mt.GetCounter().GetCreatedTimestamp(); ts == nil || ts.AsTime().IsZero() {
					t.Errorf("%s %v: no creation time", name, mt.GetLabel())
				}
			}
		}
	}
}

// TestRulesReplacedAreFreed: once Rules has the next rule set, the
// metrics hold nothing of the rules they counted before.
func TestRulesReplacedAreFreed(t *testing.T) {
	m, _ := newMetrics(t, Options{})
	plain, detailedDesc := desc("message_type", "marketing", "to_number", "1"), desc("to_number", "2061111111")
	old := parseRules(t)
	d := old.Domain("messaging")
	gone := weak.Make(d.Match(descriptor{plain}))
	// Decided before and after the rules are in the table.
	m.Decided("messaging", d.Match(descriptor{plain}), plain, service.OutcomeOK, 1)
	m.Rules(old)
	m.Decided("messaging", d.Match(descriptor{plain}), plain, service.OutcomeOK, 1)
	m.Decided("messaging", d.Match(descriptor{detailedDesc}), detailedDesc, service.OutcomeOK, 1)
	m.Rules(parseRules(t))
	old, d = nil, nil
	runtime.GC()
	if gone.Value() != nil {
		t.Error("a rule of the replaced set is still reachable")
	}
}

// TestLabelsNotUTF8: detailed labels of values that are not UTF-8 are
// exported with U+FFFD in their place, and labels that differ only there
// are one series, counting the decisions of both.
func TestLabelsNotUTF8(t *testing.T) {
	m, reg := newMetrics(t, Options{})
	rules := parseRules(t).Domain("messaging")
	for _, v := range []string{"\xff", "\ufffd", "\xfe", "a"} {
		d := desc("to_number", v)
		m.Decided("messaging", rules.Match(descriptor{d}), d, service.OutcomeOK, 1)
	}
	gatherAndCompare(t, reg, hitsHeader+"\n"+
		"ratelimitd_hits_total{domain=\"messaging\",rule=\"messaging.to_number_\ufffd\"} 3\n"+
		"ratelimitd_hits_total{domain=\"messaging\",rule=\"messaging.to_number_a\"} 1\n",
		"ratelimitd_hits_total")
}
