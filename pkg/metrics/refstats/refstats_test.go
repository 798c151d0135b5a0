package refstats_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/metrics/refstats"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

const rules = `
domain: web
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: to_number
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: remote_address
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: route
    value: /api
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 100}
  - key: internal
    rate_limit: {unlimited: true}
`

// epoch is a whole minute, where the server's clock stands.
var epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// failing is a backend that fails while fail is set, else asks next.
type failing struct {
	next algo.Backend
	fail atomic.Bool
}

func (f *failing) Decide(ctx context.Context, reqs []algo.Request, out []algo.Decision) error {
	if f.fail.Load() {
		return errors.New("backend down")
	}
	return f.next.Decide(ctx, reqs, out)
}

// env is an in-process ratelimitd whose reference statistics go to sinks.
type env struct {
	svc     *service.Service
	stats   *refstats.Stats
	backend *failing
	client  rlsv3.RateLimitServiceClient
}

func start(t *testing.T, sinks ...refstats.Sink) *env {
	t.Helper()
	rs, err := config.Parse(config.File{Name: "rules.yaml", Data: []byte(rules)})
	if err != nil {
		t.Fatal(err)
	}
	now := func() time.Time { return epoch }
	st := refstats.New(refstats.Options{Sinks: sinks, Now: now})
	be := &failing{next: memory.New(memory.Options{Now: now, SweepInterval: -1})}
	svc, err := service.New(be, rs, service.Options{Now: now, Observer: st})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(st.UnaryServerInterceptor(), svc.UnaryInterceptor()))
	svc.RegisterGRPC(gs)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return &env{svc: svc, stats: st, backend: be, client: rlsv3.NewRateLimitServiceClient(cc)}
}

func desc(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// ask sends one request; it returns the overall code, or the gRPC code of
// the error.
func (e *env) ask(t *testing.T, domain string, hits uint32, ds ...*rlv3.RateLimitDescriptor) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
	if err != nil {
		return status.Code(err).String()
	}
	return resp.OverallCode.String()
}

// decide makes the decisions whose statistics the tests check, asserting
// each answer.
func (e *env) decide(t *testing.T) {
	t.Helper()
	// 10 per minute: the near-limit threshold is floor(10 × 0.8) = 8.
	for _, c := range []struct {
		hits uint32
		want string
	}{
		{7, "OK"},         // 0 → 7: within 7
		{2, "OK"},         // 7 → 9: within 2, near 1 (9 − 8)
		{3, "OVER_LIMIT"}, // 9 → 12, refused and not taken: over 2, near 1 (10 − 9)
		{1, "OK"},         // 9 → 10: within 1, near 1
		{1, "OVER_LIMIT"}, // 10 → 11: over 1
	} {
		if got := e.ask(t, "web", c.hits, desc("user", "ann")); got != c.want {
			t.Fatalf("user, %d hits: %s, want %s", c.hits, got, c.want)
		}
	}
	// A shadow rule of 1 per minute: the threshold is 0.
	for range 2 {
		if got := e.ask(t, "web", 1, desc("trial", "x")); got != "OK" {
			t.Fatalf("trial: %s, want OK (shadow mode)", got)
		}
	}
	// Detailed metrics name the value; IPv4 dots become underscores.
	e.ask(t, "web", 1, desc("to_number", "2061111111"))
	e.ask(t, "web", 1, desc("remote_address", "10.0.0.1"))
	// Two levels; unlimited counts nothing; an override names its values.
	e.ask(t, "web", 1, desc("route", "/api", "method", "GET"), desc("internal", "yes"))
	o := desc("tenant", "acme")
	o.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: 2} // MINUTE
	o.HitsAddend = wrapperspb.UInt64(2)
	e.ask(t, "web", 1, o)
	// An unknown domain, two descriptors.
	e.ask(t, "nowhere", 1, desc("a", "b"), desc("c", "d"))
	// A bad request, and a request whose backend call fails (failure
	// mode open admits it).
	if got := e.ask(t, "", 1, desc("user", "ann")); got != codes.InvalidArgument.String() {
		t.Fatalf("empty domain: %s, want InvalidArgument", got)
	}
	e.backend.fail.Store(true)
	if got := e.ask(t, "web", 1, desc("user", "bob")); got != "OK" {
		t.Fatalf("backend down: %s, want OK (failure mode open)", got)
	}
	e.backend.fail.Store(false)
	e.stats.ConfigLoaded(true)
	e.stats.ConfigLoaded(true)
	e.stats.ConfigLoaded(false)
}

// wantLines are the statsd lines of decide's statistics, sorted.
var wantLines = []string{
	"ratelimit.service.call.should_rate_limit.redis_error:1|c",
	"ratelimit.service.call.should_rate_limit.service_error:1|c",
	"ratelimit.service.config_load_error:1|c",
	"ratelimit.service.config_load_success:2|c",
	"ratelimit.service.rate_limit.nowhere.domain_not_found:2|c",
	"ratelimit.service.rate_limit.web.remote_address_10_0_0_1.total_hits:1|c",
	"ratelimit.service.rate_limit.web.remote_address_10_0_0_1.within_limit:1|c",
	"ratelimit.service.rate_limit.web.route_/api.method.total_hits:1|c",
	"ratelimit.service.rate_limit.web.route_/api.method.within_limit:1|c",
	"ratelimit.service.rate_limit.web.tenant_acme.total_hits:2|c",
	"ratelimit.service.rate_limit.web.tenant_acme.within_limit:2|c",
	"ratelimit.service.rate_limit.web.to_number_2061111111.total_hits:1|c",
	"ratelimit.service.rate_limit.web.to_number_2061111111.within_limit:1|c",
	"ratelimit.service.rate_limit.web.trial.near_limit:1|c",
	"ratelimit.service.rate_limit.web.trial.over_limit:1|c",
	"ratelimit.service.rate_limit.web.trial.shadow_mode:1|c",
	"ratelimit.service.rate_limit.web.trial.total_hits:2|c",
	"ratelimit.service.rate_limit.web.trial.within_limit:1|c",
	"ratelimit.service.rate_limit.web.user.near_limit:3|c",
	"ratelimit.service.rate_limit.web.user.over_limit:3|c",
	"ratelimit.service.rate_limit.web.user.total_hits:14|c",
	"ratelimit.service.rate_limit.web.user.within_limit:10|c",
	"ratelimit_server.ShouldRateLimit.total_requests:14|c",
}

// timerLine is the response time of each of decide's 14 calls: the clock
// stands still.
const timerLine = "ratelimit_server.ShouldRateLimit.response_time:0|ms"

// udpListener is a statsd server's socket on 127.0.0.1.
func udpListener(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// readLines reads datagrams until n lines came, or fails after 5 s.
func readLines(t *testing.T, c *net.UDPConn, n int) []string {
	t.Helper()
	var lines []string
	buf := make([]byte, 65536)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for len(lines) < n {
		k, err := c.Read(buf)
		if err != nil {
			t.Fatalf("after %d of %d lines %q: %v", len(lines), n, lines, err)
		}
		if k > 1432 {
			t.Errorf("datagram of %d bytes, over 1432", k)
		}
		lines = append(lines, strings.Split(strings.TrimSuffix(string(buf[:k]), "\n"), "\n")...)
	}
	return lines
}

// noMore fails when a datagram comes within d.
func noMore(t *testing.T, c *net.UDPConn, d time.Duration) {
	t.Helper()
	buf := make([]byte, 65536)
	c.SetReadDeadline(time.Now().Add(d))
	if k, err := c.Read(buf); err == nil {
		t.Errorf("unexpected datagram %q", buf[:k])
	}
}

func TestStatsdLines(t *testing.T) {
	lis := udpListener(t)
	sink, err := refstats.NewStatsd(refstats.StatsdOptions{Addr: lis.LocalAddr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	e := start(t, sink)
	e.decide(t)
	e.stats.Flush()

	lines := readLines(t, lis, len(wantLines)+14)
	var counters []string
	timers := 0
	for _, l := range lines {
		if l == timerLine {
			timers++
			continue
		}
		counters = append(counters, l)
	}
	sort.Strings(counters)
	if !slices.Equal(counters, wantLines) {
		t.Errorf("counters:\n%s\nwant:\n%s", strings.Join(counters, "\n"), strings.Join(wantLines, "\n"))
	}
	if timers != 14 {
		t.Errorf("%d lines %q, want 14", timers, timerLine)
	}

	// Nothing changed: nothing is sent. Then only what grew, by how much.
	e.stats.Flush()
	noMore(t, lis, 200*time.Millisecond)
	e.ask(t, "web", 1, desc("user", "cy"))
	e.stats.Flush()
	got := readLines(t, lis, 4)
	sort.Strings(got)
	// Another user: a counter of its own, statistics of the same rule.
	want := []string{
		"ratelimit.service.rate_limit.web.user.total_hits:1|c",
		"ratelimit.service.rate_limit.web.user.within_limit:1|c",
		timerLine,
		"ratelimit_server.ShouldRateLimit.total_requests:1|c",
	}
	if !slices.Equal(got, want) {
		t.Errorf("second flush %q, want %q", got, want)
	}
}

func TestStatsdTags(t *testing.T) {
	tags := map[string]string{"env": "prod", "az": "a:1"}
	for _, c := range []struct {
		dog  bool
		want string
	}{
		{false, "ratelimit.service.config_load_success.__az=a_1.__env=prod:1|c"},
		{true, "ratelimit.service.config_load_success:1|c|#az:a_1,env:prod"},
	} {
		lis := udpListener(t)
		sink, err := refstats.NewStatsd(refstats.StatsdOptions{Addr: lis.LocalAddr().String(), Tags: tags, DogStatsD: c.dog})
		if err != nil {
			t.Fatal(err)
		}
		st := refstats.New(refstats.Options{Sinks: []refstats.Sink{sink}})
		st.ConfigLoaded(true)
		st.Flush()
		if got := readLines(t, lis, 1); got[0] != c.want {
			t.Errorf("dogstatsd %v: %q, want %q", c.dog, got[0], c.want)
		}
		sink.Close()
	}
}

// TestStatsdSampledTimer keeps at most TimerSamples values of a timer per
// flush, each sent with its sample rate.
func TestStatsdSampledTimer(t *testing.T) {
	lis := udpListener(t)
	sink, err := refstats.NewStatsd(refstats.StatsdOptions{Addr: lis.LocalAddr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	st := refstats.New(refstats.Options{Sinks: []refstats.Sink{sink}, TimerSamples: 4, Now: func() time.Time { return epoch }})
	ic := st.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: "/grpc.health.v1.Health/Check"}
	for range 10 {
		ic(context.Background(), nil, info, func(context.Context, any) (any, error) { return nil, nil })
	}
	st.Flush()
	got := readLines(t, lis, 5)
	sort.Strings(got)
	want := []string{
		"ratelimit_server.Check.response_time:0|ms|@0.4",
		"ratelimit_server.Check.response_time:0|ms|@0.4",
		"ratelimit_server.Check.response_time:0|ms|@0.4",
		"ratelimit_server.Check.response_time:0|ms|@0.4",
		"ratelimit_server.Check.total_requests:10|c",
	}
	if !slices.Equal(got, want) {
		t.Errorf("%q, want %q", got, want)
	}
}

// TestMaxKeys stops making keys at the cap and counts what it drops.
func TestMaxKeys(t *testing.T) {
	st := refstats.New(refstats.Options{MaxKeys: 2})
	for _, v := range []string{"a", "b", "c", "a", "c"} {
		st.UnknownDomain(v, 1)
	}
	if st.Keys() != 2 || st.Dropped() != 2 {
		t.Errorf("keys %d, dropped %d; want 2 and 2", st.Keys(), st.Dropped())
	}
}

func TestSanitize(t *testing.T) {
	for in, want := range map[string]string{
		"web.remote_address_10.0.0.1": "web.remote_address_10_0_0_1",
		"a:b|c":                       "a_b_c",
		"x\ny":                        "x_y",
		"v1.2.3":                      "v1.2.3",
		"1234.5.6.7.8":                "1234_5_6_7.8",
		"a\xffb\xc0\xaf":              "a\ufffdb\ufffd",
	} {
		if got := refstats.Sanitize(in); got != want {
			t.Errorf("Sanitize(%q) = %q, want %q", in, got, want)
		}
	}
}

// scrape returns the lines of h's exposition that start with one of
// prefixes, without comments.
func scrape(t *testing.T, h http.Handler, prefixes ...string) []string {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				out = append(out, l)
				break
			}
		}
	}
	sort.Strings(out)
	return out
}

// TestPrometheusDefaultMapping: with the default mapping, the series are
// those envoyproxy/ratelimit's USE_PROMETHEUS shows for the same
// statistics, series for series: testdata/reference-prometheus.golden,
// written by the reference's mapper and statsd_exporter (golden_test.go).
func TestPrometheusDefaultMapping(t *testing.T) {
	sink, err := refstats.NewPrometheus(refstats.PrometheusOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	e := start(t, sink)
	e.decide(t)
	e.stats.Flush()
	got := scrape(t, sink.Handler(), "ratelimit", "statsd_exporter_events_unmapped_total")
	got = slices.DeleteFunc(got, func(l string) bool { return strings.Contains(l, "_bucket{") })
	if want := readGolden(t); !slices.Equal(got, want) {
		t.Errorf("series:\n%s\nthe reference's (%s):\n%s", strings.Join(got, "\n"), goldenFile, strings.Join(want, "\n"))
	}
}

// TestPrometheusMatchesLiveReference: statistics of rules of two and three
// levels, with and without values, map as they did in a run of the
// reference itself (testdata/reference-prometheus-live.txt).
func TestPrometheusMatchesLiveReference(t *testing.T) {
	sink, err := refstats.NewPrometheus(refstats.PrometheusOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	var samples []refstats.Sample
	for _, key := range []string{"user", "route_/api.method", "to_number_2061111111", "svc_a.op_b", "deep.mid.leaf"} {
		for _, stat := range []string{"total_hits", "within_limit"} {
			samples = append(samples, refstats.Sample{Name: "ratelimit.service.rate_limit.web." + key + "." + stat, Kind: refstats.Counter, Value: 1})
		}
	}
	sink.Flush(samples)
	got := scrape(t, sink.Handler(), "ratelimit_service_rate_limit")
	b, err := os.ReadFile("testdata/reference-prometheus-live.txt")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "ratelimit_") {
			want = append(want, l)
		}
	}
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("series:\n%s\nthe reference's:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestPrometheusTags: EXTRA_TAGS (-statsd-tags) label every series.
func TestPrometheusTags(t *testing.T) {
	sink, err := refstats.NewPrometheus(refstats.PrometheusOptions{Tags: map[string]string{"cluster": "eu"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	e := start(t, sink)
	e.decide(t)
	e.stats.Flush()
	got := scrape(t, sink.Handler(), "ratelimit")
	if len(got) < 20 {
		t.Fatalf("%d series", len(got))
	}
	for _, l := range got {
		if !strings.Contains(l, `cluster="eu"`) {
			t.Errorf("a series without the tag: %s", l)
		}
	}
}

// TestPrometheusCustomMapping replaces the default mapping with a file
// written for envoyproxy/ratelimit, timer_type and all.
func TestPrometheusCustomMapping(t *testing.T) {
	file := filepath.Join(t.TempDir(), "mapping.yaml")
	err := os.WriteFile(file, []byte(`mappings:
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: "rl_hits"
    timer_type: "histogram"
    labels:
      dom: "$1"
      rule: "$2"
  - match: "ratelimit.service.rate_limit.*.*.*"
    action: drop
    name: "dropped"
  - match: "ratelimit_server.*.response_time"
    timer_type: summary
    name: "rl_time_ms"
    labels:
      method: "$1"
`), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	mapping, err := refstats.ReadMapping(file)
	if err != nil {
		t.Fatal(err)
	}
	sink, err := refstats.NewPrometheus(refstats.PrometheusOptions{Mapping: mapping})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	e := start(t, sink)
	for range 3 {
		e.ask(t, "web", 1, desc("user", "ann"))
	}
	e.stats.Flush()
	got := scrape(t, sink.Handler(), "rl_", "ratelimit_")
	want := []string{
		`rl_hits{dom="web",rule="user"} 3`,
		`rl_time_ms_count{method="ShouldRateLimit"} 3`,
		`rl_time_ms_sum{method="ShouldRateLimit"} 0`,
		`rl_time_ms{method="ShouldRateLimit",quantile="0.5"} 0`,
		`rl_time_ms{method="ShouldRateLimit",quantile="0.9"} 0`,
		`rl_time_ms{method="ShouldRateLimit",quantile="0.99"} 0`,
		// Unmapped: statsd_exporter's own escaping of the name.
		`ratelimit_server_ShouldRateLimit_total_requests 3`,
	}
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("series:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestPrometheusBadMapping(t *testing.T) {
	for _, m := range []string{"mappings: [", "mappings:\n  - match: a.b\n    nmae: x\n", "- a"} {
		if _, err := refstats.NewPrometheus(refstats.PrometheusOptions{Mapping: m}); err == nil {
			t.Errorf("mapping %q accepted", m)
		}
	}
}

// TestPrometheusSampledTimer counts every call of a sampled timer.
func TestPrometheusSampledTimer(t *testing.T) {
	sink, err := refstats.NewPrometheus(refstats.PrometheusOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	st := refstats.New(refstats.Options{Sinks: []refstats.Sink{sink}, TimerSamples: 4, Now: func() time.Time { return epoch }})
	ic := st.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: shouldRateLimitMethod}
	for range 10 {
		ic(context.Background(), nil, info, func(context.Context, any) (any, error) { return nil, nil })
	}
	st.Flush()
	got := scrape(t, sink.Handler(), "ratelimit_service_response_time_seconds_count", "ratelimit_service_total_requests")
	want := []string{
		`ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"} 10`,
		`ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 10`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("%q, want %q", got, want)
	}
}

const shouldRateLimitMethod = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// TestNamesNotUTF8: a descriptor value that is not UTF-8, which Envoy may
// send and ratelimitd decides, names its statistics with U+FFFD for the
// bytes that are not UTF-8: Prometheus refuses label values that are not
// UTF-8.
func TestNamesNotUTF8(t *testing.T) {
	sink, err := refstats.NewPrometheus(refstats.PrometheusOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	e := start(t, sink)
	// In process: a gRPC client of Go cannot send such a value.
	req := &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*rlv3.RateLimitDescriptor{desc("to_number", "20\xff61")}}
	if _, err := e.svc.ShouldRateLimit(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	e.stats.Flush()
	got := scrape(t, sink.Handler(), "ratelimit_service_rate_limit_total_hits", "statsd_exporter_events_conflict_total")
	want := []string{"ratelimit_service_rate_limit_total_hits{domain=\"web\",key1=\"to_number_20\ufffd61\"} 1"}
	if !slices.Equal(got, want) {
		t.Errorf("series:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestPrometheusConflictingNames: a timer a mapping names as a counter is
// counted as statsd_exporter counts a conflict, by type and name, and the
// exporter goes on.
func TestPrometheusConflictingNames(t *testing.T) {
	sink, err := refstats.NewPrometheus(refstats.PrometheusOptions{Mapping: `mappings:
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: "rl"
    labels: {rule: "$2"}
  - match: "ratelimit_server.*.response_time"
    name: "rl"
    labels: {rule: "$1"}
`})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	e := start(t, sink)
	e.ask(t, "web", 1, desc("user", "ann"))
	e.stats.Flush()
	e.ask(t, "web", 1, desc("user", "ann"))
	e.stats.Flush()
	got := scrape(t, sink.Handler(), "rl", "statsd_exporter_events_conflict_total")
	want := []string{`rl{rule="user"} 2`, `statsd_exporter_events_conflict_total{metric_name="rl",type="observer"} 2`}
	if !slices.Equal(got, want) {
		t.Errorf("series:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
