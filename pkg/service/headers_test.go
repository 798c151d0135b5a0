package service

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/config"
)

var styles = []HeaderStyle{HeadersRateLimit, HeadersXRateLimit, HeadersStructured}

// newHeaderFixture is newFixture answering with headers of style h.
func newHeaderFixture(t testing.TB, rules string, h HeaderStyle) *fixture {
	t.Helper()
	clk := clocktest.New(start)
	be := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { be.Close() })
	return newFixtureOpts(t, rules, be, clk, Options{ResponseHeaders: h})
}

// headerLines renders headers one "Key: Value" per line, in order.
func headerLines(hs []*corev3.HeaderValue) string {
	var b strings.Builder
	for _, h := range hs {
		fmt.Fprintf(&b, "%s: %s\n", h.GetKey(), h.GetValue())
	}
	return b.String()
}

func TestParseHeaderStyle(t *testing.T) {
	for _, h := range []HeaderStyle{HeadersNone, HeadersRateLimit, HeadersXRateLimit, HeadersStructured, HeadersReference} {
		got, err := ParseHeaderStyle(h.String())
		if err != nil || got != h {
			t.Errorf("ParseHeaderStyle(%q) = %v, %v", h.String(), got, err)
		}
		var u HeaderStyle
		if text, err := h.MarshalText(); err != nil || u.UnmarshalText(text) != nil || u != h {
			t.Errorf("text round trip of %v: %q %v -> %v", h, text, err, u)
		}
	}
	if names := []string{HeadersNone.String(), HeadersRateLimit.String(), HeadersXRateLimit.String(), HeadersStructured.String(), HeadersReference.String()}; strings.Join(names, " ") != "none ratelimit x-ratelimit structured reference" {
		t.Errorf("names %v", names)
	}
	_, err := ParseHeaderStyle("X-RateLimit")
	if err == nil || !strings.Contains(err.Error(), "none, ratelimit, x-ratelimit, structured or reference") {
		t.Errorf("ParseHeaderStyle(X-RateLimit): %v, want an error listing the styles", err)
	}
	if s := HeaderStyle(9).String(); s != "HeaderStyle(9)" {
		t.Errorf("String of an unknown style: %q", s)
	}
	if _, err := HeaderStyle(9).MarshalText(); err == nil {
		t.Error("MarshalText of an unknown style succeeded")
	}
	be := memory.New(memory.Options{SweepInterval: -1})
	defer be.Close()
	if _, err := New(be, &config.Rules{}, Options{ResponseHeaders: 5}); err == nil || !strings.Contains(err.Error(), "response header style") {
		t.Errorf("New with style 5: %v", err)
	}
	if _, err := New(be, &config.Rules{}, Options{HeaderNames: HeaderNames{Reset: "X Reset"}}); err == nil || !strings.Contains(err.Error(), `"X Reset" is not an HTTP header name`) {
		t.Errorf("New with a header name holding a space: %v", err)
	}
}

// figures are what one answer tells a client: q per w seconds (bucket
// capacity burst, 0 when q), r remaining, t the seconds until the limit is
// restored, retry the Retry-After (0 for none).
type figures struct {
	q, w, burst, r, t, retry uint64
}

// wantHeaders renders the headers of style h for figures f of a limit named
// name, the request's only one.
func wantHeaders(h HeaderStyle, name string, f figures) string {
	var b strings.Builder
	switch h {
	case HeadersRateLimit:
		fmt.Fprintf(&b, "RateLimit-Limit: %d\nRateLimit-Remaining: %d\nRateLimit-Reset: %d\n", f.q, f.r, f.t)
	case HeadersXRateLimit:
		fmt.Fprintf(&b, "X-RateLimit-Limit: %d\nX-RateLimit-Remaining: %d\n", f.q, f.r)
		if f.retry != 0 {
			fmt.Fprintf(&b, "X-RateLimit-Retry-After: %d\n", f.retry)
		}
	case HeadersStructured:
		fmt.Fprintf(&b, "RateLimit-Policy: %q;q=%d;w=%d", name, f.q, f.w)
		if f.burst != 0 {
			fmt.Fprintf(&b, ";ratelimitd-burst=%d", f.burst)
		}
		fmt.Fprintf(&b, "\nRateLimit: %q;r=%d;t=%d\n", name, f.r, f.t)
	}
	if f.retry != 0 {
		fmt.Fprintf(&b, "Retry-After: %d\n", f.retry)
	}
	return b.String()
}

// hstep is one call of a sequence: after advancing the clock, a call for
// hits (1 when 0) answered code with figures r, t and retry.
type hstep struct {
	advance     time.Duration
	hits        uint64
	code        rlsv3.RateLimitResponse_Code
	r, t, retry uint64
}

// TestResponseHeadersByAlgorithm drives each algorithm through a rule file
// and checks each style's headers at every step: admitted, refused with
// Retry-After, and refused for more hits than the limit ever holds (no
// Retry-After, the reset figures falling back to the time until the limit
// is restored).
func TestResponseHeadersByAlgorithm(t *testing.T) {
	cases := []struct {
		algorithm, limit string
		q, w, burst      uint64
		steps            []hstep
	}{
		{"fixed_window", "{name: n, requests_per_unit: 2, unit: minute}", 2, 60, 0, []hstep{
			{10 * time.Second, 0, ok, 1, 50, 0},
			{0, 0, ok, 0, 50, 0},
			{0, 0, over, 0, 50, 50},
			{20500 * time.Millisecond, 0, over, 0, 30, 30}, // 29.5 s, rounded up
			{0, 3, over, 0, 30, 0},                         // never: 3 hits > 2
			{30 * time.Second, 0, ok, 1, 60, 0},            // 59.5 s into the next minute
		}},
		{"sliding_window_log", "{name: n, algorithm: sliding_window_log, requests_per_unit: 2, unit: minute}", 2, 60, 0, []hstep{
			{0, 0, ok, 1, 60, 0},
			{30 * time.Second, 0, ok, 0, 60, 0},
			{29500 * time.Millisecond, 0, over, 0, 1, 1}, // the first hit leaves in 0.5 s
			{500 * time.Millisecond, 0, ok, 0, 60, 0},
			{0, 3, over, 0, 60, 0},
		}},
		{"sliding_window_counter", "{name: n, algorithm: sliding_window_counter, requests_per_unit: 4, unit: minute}", 4, 60, 0, []hstep{
			{0, 0, ok, 3, 120, 0},
			{0, 2, ok, 1, 120, 0},
			{0, 0, ok, 0, 120, 0},
			{0, 0, over, 0, 75, 75},             // 15 s into the next minute, this one weighs 3
			{90 * time.Second, 0, ok, 1, 90, 0}, // the previous minute weighs 4 × 1/2
			{0, 0, ok, 0, 90, 0},
			{0, 0, over, 0, 15, 15}, // 45 s in, the previous minute weighs 1

			{0, 5, over, 0, 90, 0},
		}},
		{"token_bucket", "{name: n, algorithm: token_bucket, requests_per_unit: 1, unit: second, burst: 3}", 1, 1, 3, []hstep{
			{0, 0, ok, 2, 1, 0},
			{0, 0, ok, 1, 2, 0},
			{0, 0, ok, 0, 3, 0},
			{0, 0, over, 0, 1, 1},
			{250 * time.Millisecond, 0, over, 0, 1, 1}, // 0.75 s, rounded up
			{750 * time.Millisecond, 0, ok, 0, 3, 0},
			{0, 4, over, 0, 3, 0},
		}},
		{"leaky_bucket", "{name: n, algorithm: leaky_bucket, requests_per_unit: 1, unit: second, burst: 3}", 1, 1, 3, []hstep{
			{0, 0, ok, 2, 1, 0},
			{0, 0, ok, 1, 2, 0},
			{0, 0, ok, 0, 3, 0},
			{0, 0, over, 0, 1, 1},
			{250 * time.Millisecond, 0, over, 0, 1, 1},
			{750 * time.Millisecond, 0, ok, 0, 3, 0},
			{0, 4, over, 0, 3, 0},
		}},
		{"gcra", "{name: n, algorithm: gcra, requests_per_unit: 1, unit: second, burst: 3}", 1, 1, 3, []hstep{
			{0, 0, ok, 2, 1, 0},
			{0, 0, ok, 1, 2, 0},
			{0, 0, ok, 0, 3, 0},
			{0, 0, over, 0, 1, 1},
			{250 * time.Millisecond, 0, over, 0, 1, 1},
			{750 * time.Millisecond, 0, ok, 0, 3, 0},
			{0, 4, over, 0, 3, 0},
		}},
		{"burst_fill", "{name: n, algorithm: burst_fill, requests_per_unit: 2, unit: minute}", 2, 60, 0, []hstep{
			{10 * time.Second, 0, ok, 1, 60, 0}, // the window starts at the first hit
			{0, 0, ok, 0, 60, 0},
			{55 * time.Second, 0, over, 0, 5, 5},
			{0, 3, over, 0, 5, 0},
			{5 * time.Second, 0, ok, 1, 60, 0},
		}},
	}
	for _, c := range cases {
		for _, h := range styles {
			t.Run(c.algorithm+"/"+h.String(), func(t *testing.T) {
				f := newHeaderFixture(t, fmt.Sprintf("domain: d\ndescriptors:\n  - {key: k, rate_limit: %s}\n", c.limit), h)
				if a := f.svc.Rules().Domain("d").Rules()[0].Algorithm.String(); a != c.algorithm {
					t.Fatalf("rule algorithm %v", a)
				}
				for i, s := range c.steps {
					f.clock.Advance(s.advance)
					d := desc("k", "v")
					if s.hits != 0 {
						d.HitsAddend = wrapperspb.UInt64(s.hits)
					}
					resp := f.call(t, request("d", d))
					want := wantHeaders(h, "n", figures{q: c.q, w: c.w, burst: c.burst, r: s.r, t: s.t, retry: s.retry})
					if got := headerLines(resp.ResponseHeadersToAdd); resp.OverallCode != s.code || got != want {
						t.Fatalf("step %d (+%v, %d hits): %v\n%s\nwant %v\n%s", i, s.advance, s.hits, resp.OverallCode, got, s.code, want)
					}
				}
			})
		}
	}
}

// headerRules have several kinds of rule to pick the most restrictive
// among.
const headerRules = `
domain: h
descriptors:
  - key: a
    rate_limit: {name: a_per_minute, unit: minute, requests_per_unit: 10}
  - key: b
    rate_limit: {name: b_per_hour, unit: hour, requests_per_unit: 3}
  - key: s
    shadow_mode: true
    rate_limit: {name: s_per_hour, unit: hour, requests_per_unit: 1}
  - key: u
    rate_limit: {unlimited: true}
  - key: m
    rate_limits:
      - {name: m_per_second, unit: second, requests_per_unit: 5}
      - {unit: hour, requests_per_unit: 100, algorithm: token_bucket, burst: 20}
  - key: q
    rate_limit: {name: "say \"hi\" \\ ünïcode", unit: minute, requests_per_unit: 1}
`

// call asks for the descriptors of domain h and returns the overall code
// and the headers.
func (f *fixture) headers(t *testing.T, ds ...*rlv3.RateLimitDescriptor) (rlsv3.RateLimitResponse_Code, string) {
	t.Helper()
	resp := f.call(t, request("h", ds...))
	return resp.OverallCode, headerLines(resp.ResponseHeadersToAdd)
}

// TestResponseHeadersPickTheMostRestrictive checks which descriptor of a
// request the headers describe, in every style.
func TestResponseHeadersPickTheMostRestrictive(t *testing.T) {
	// At 22:14:00, the minute ends in 60 s and the hour in 46 minutes.
	want := map[HeaderStyle][]string{
		// a has 9 left of 10 and b 2 of 3: b is the closer to its limit.
		HeadersRateLimit: {
			"RateLimit-Limit: 3\nRateLimit-Remaining: 2\nRateLimit-Reset: 2760\n",
			// b is refused until the hour ends; a, also refused, sooner.
			"RateLimit-Limit: 3\nRateLimit-Remaining: 0\nRateLimit-Reset: 2760\nRetry-After: 2760\n",
		},
		HeadersXRateLimit: {
			"X-RateLimit-Limit: 3\nX-RateLimit-Remaining: 2\n",
			"X-RateLimit-Limit: 3\nX-RateLimit-Remaining: 0\nX-RateLimit-Retry-After: 2760\nRetry-After: 2760\n",
		},
		HeadersStructured: {
			"RateLimit-Policy: \"a_per_minute\";q=10;w=60, \"b_per_hour\";q=3;w=3600\nRateLimit: \"b_per_hour\";r=2;t=2760\n",
			"RateLimit-Policy: \"a_per_minute\";q=10;w=60, \"b_per_hour\";q=3;w=3600\nRateLimit: \"b_per_hour\";r=0;t=2760\nRetry-After: 2760\n",
		},
	}
	for _, h := range styles {
		t.Run(h.String(), func(t *testing.T) {
			f := newHeaderFixture(t, headerRules, h)
			if code, got := f.headers(t, desc("a", "1"), desc("b", "1")); code != ok || got != want[h][0] {
				t.Fatalf("admitted: %v\n%s\nwant\n%s", code, got, want[h][0])
			}
			for range 2 {
				f.headers(t, desc("b", "1"))
			}
			for range 10 {
				f.headers(t, desc("a", "1"))
			}
			if code, got := f.headers(t, desc("a", "1"), desc("b", "1")); code != over || got != want[h][1] {
				t.Fatalf("refused: %v\n%s\nwant\n%s", code, got, want[h][1])
			}
		})
	}
}

func TestResponseHeadersRules(t *testing.T) {
	f := newHeaderFixture(t, headerRules, HeadersStructured)
	for _, c := range []struct {
		name string
		ds   []*rlv3.RateLimitDescriptor
		code rlsv3.RateLimitResponse_Code
		want string
	}{
		// Equally restrictive descriptors: the first one. One rule is
		// one policy, however many descriptors match it.
		{"a tie", []*rlv3.RateLimitDescriptor{desc("a", "x"), desc("a", "y")}, ok,
			"RateLimit-Policy: \"a_per_minute\";q=10;w=60\nRateLimit: \"a_per_minute\";r=9;t=60\n"},
		// Every limit of a rule is a policy; a limit without a name is
		// named after its rule, and a bucket tells its capacity.
		{"several limits", []*rlv3.RateLimitDescriptor{desc("m", "1")}, ok,
			"RateLimit-Policy: \"m_per_second\";q=5;w=1, \"h.m#2\";q=100;w=3600;ratelimitd-burst=20\nRateLimit: \"m_per_second\";r=4;t=1\n"},
		{"escaped name", []*rlv3.RateLimitDescriptor{desc("q", "1")}, ok,
			"RateLimit-Policy: \"say \\\"hi\\\" \\\\ _n_code\";q=1;w=60\nRateLimit: \"say \\\"hi\\\" \\\\ _n_code\";r=0;t=60\n"},
		// No descriptor counted: no headers.
		{"unmatched", []*rlv3.RateLimitDescriptor{desc("color", "red")}, ok, ""},
		{"unlimited", []*rlv3.RateLimitDescriptor{desc("u", "1"), desc("color", "red")}, ok, ""},
		{"shadow only", []*rlv3.RateLimitDescriptor{desc("s", "1")}, ok, ""},
		// Descriptors that are not counted stay out of the policies.
		{"mixed", []*rlv3.RateLimitDescriptor{desc("u", "1"), desc("s", "2"), desc("color", "red"), desc("a", "z")}, ok,
			"RateLimit-Policy: \"a_per_minute\";q=10;w=60\nRateLimit: \"a_per_minute\";r=9;t=60\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if code, got := f.headers(t, c.ds...); code != c.code || got != c.want {
				t.Fatalf("%v\n%s\nwant %v\n%s", code, got, c.code, c.want)
			}
		})
	}

	// Overrides are policies named after their limit.
	o := desc("color", "red")
	o.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE}
	o2 := desc("color", "blue")
	o2.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_SECOND, UnitMultiplier: wrapperspb.UInt32(30)}
	o3 := desc("color", "green")
	o3.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE}
	want := "RateLimit-Policy: \"override_2_per_minute\";q=2;w=60, \"override_7_per_30_second\";q=7;w=30\nRateLimit: \"override_2_per_minute\";r=1;t=60\n"
	if code, got := f.headers(t, o, o2, o3); code != ok || got != want {
		t.Fatalf("overrides: %v\n%s\nwant\n%s", code, got, want)
	}
}

// TestShadowNeverDrivesRetryAfter refuses a request by one descriptor while
// a shadow descriptor, over its own limit for longer, is admitted anyway.
func TestShadowNeverDrivesRetryAfter(t *testing.T) {
	f := newHeaderFixture(t, headerRules, HeadersRateLimit)
	f.headers(t, desc("s", "1")) // the shadow hour is now full
	for range 10 {
		f.headers(t, desc("a", "1"))
	}
	want := "RateLimit-Limit: 10\nRateLimit-Remaining: 0\nRateLimit-Reset: 60\nRetry-After: 60\n"
	if code, got := f.headers(t, desc("s", "1"), desc("a", "1")); code != over || got != want {
		t.Fatalf("%v\n%s\nwant\n%s", code, got, want)
	}
	// Admitted, the shadow descriptor's 0 remaining does not show either.
	want = "RateLimit-Limit: 3\nRateLimit-Remaining: 2\nRateLimit-Reset: 2760\n"
	if code, got := f.headers(t, desc("s", "1"), desc("b", "1")); code != ok || got != want {
		t.Fatalf("%v\n%s\nwant\n%s", code, got, want)
	}
}

func TestNoHeaders(t *testing.T) {
	f := newHeaderFixture(t, headerRules, HeadersNone)
	for range 4 {
		if resp := f.call(t, request("h", desc("b", "1"), desc("a", "1"))); resp.ResponseHeadersToAdd != nil {
			t.Fatalf("style none: %v", resp)
		}
	}
	f = newHeaderFixture(t, headerRules, HeadersRateLimit)
	if resp := f.call(t, request("unknown", desc("b", "1"))); resp.ResponseHeadersToAdd != nil {
		t.Fatalf("unknown domain: %v", resp)
	}
}

// TestResponseHeadersByFailureMode: decisions by failure mode open or
// closed have no figures to tell; local has.
func TestResponseHeadersByFailureMode(t *testing.T) {
	req := request("messaging", desc("to_number", "1"))
	for _, mode := range []config.FailureMode{config.FailOpen, config.FailClosed} {
		f := newFixtureOpts(t, testRules, failingBackend{}, new(clocktest.Clock), Options{FailureMode: mode, ResponseHeaders: HeadersRateLimit})
		if resp := f.call(t, req); resp.ResponseHeadersToAdd != nil {
			t.Errorf("failure mode %s: %v", mode, resp)
		}
	}
	clk := clocktest.New(start)
	fallback := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
	defer fallback.Close()
	f := newFixtureOpts(t, testRules, failingBackend{}, clk, Options{FailureMode: config.FailLocal, Fallback: fallback, ResponseHeaders: HeadersRateLimit})
	want := "RateLimit-Limit: 100\nRateLimit-Remaining: 99\nRateLimit-Reset: 6360\n"
	if got := headerLines(f.call(t, req).ResponseHeadersToAdd); got != want {
		t.Errorf("failure mode local:\n%s\nwant\n%s", got, want)
	}
}

// TestJSONEndpointHeaders: POST /json sends the headers as HTTP headers,
// and in the body's responseHeadersToAdd.
func TestJSONEndpointHeaders(t *testing.T) {
	f := newHeaderFixture(t, headerRules, HeadersXRateLimit)
	body := `{"domain": "h", "descriptors": [{"entries": [{"key": "b", "value": "1"}]}]}`
	for i, want := range []struct {
		code       int
		remaining  string
		retryAfter string
	}{{200, "2", ""}, {200, "1", ""}, {200, "0", ""}, {429, "0", "2760"}} {
		code, hdr, got := f.http(t, "POST", "/json", body)
		if code != want.code || hdr.Get("X-RateLimit-Limit") != "3" || hdr.Get("X-RateLimit-Remaining") != want.remaining ||
			hdr.Get("X-RateLimit-Retry-After") != want.retryAfter || hdr.Get("Retry-After") != want.retryAfter {
			t.Fatalf("call %d: %d %v %s", i, code, hdr, got)
		}
		var resp struct {
			Headers []struct{ Key, Value string } `json:"responseHeadersToAdd"`
		}
		if err := json.Unmarshal([]byte(got), &resp); err != nil || len(resp.Headers) < 2 || resp.Headers[1].Key != "X-RateLimit-Remaining" || resp.Headers[1].Value != want.remaining {
			t.Fatalf("call %d: body %s (%v)", i, got, err)
		}
	}
	// The seed documents' spelling is what net/http writes.
	_, hdr, _ := f.http(t, "POST", "/json", body)
	if _, ok := hdr[http.CanonicalHeaderKey("X-Ratelimit-Retry-After")]; !ok {
		t.Errorf("headers %v", hdr)
	}
}

func TestAppendSFString(t *testing.T) {
	for in, want := range map[string]string{
		"":               `""`,
		"plain name 1":   `"plain name 1"`,
		`q"b\s`:          `"q\"b\\s"`,
		"tab\there":      `"tab_here"`,
		"ünï€":           `"_n__"`,
		"\xff":           `"_"`,
		"~ !#$%&'()*+,/": `"~ !#$%&'()*+,/"`,
	} {
		if got := string(appendSFString(nil, in)); got != want {
			t.Errorf("appendSFString(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestCeilSeconds(t *testing.T) {
	for d, want := range map[time.Duration]uint64{
		-time.Second: 0, 0: 0, 1: 1, time.Second: 1, time.Second + 1: 2, 59500 * time.Millisecond: 60,
	} {
		if got := ceilSeconds(d); got != want {
			t.Errorf("ceilSeconds(%v) = %d, want %d", d, got, want)
		}
	}
}

// BenchmarkResponseHeaders compares ShouldRateLimit without headers and
// with each style.
func BenchmarkResponseHeaders(b *testing.B) {
	rules, err := config.Parse(config.File{Name: "r.yaml", Data: []byte(benchRules)})
	if err != nil {
		b.Fatal(err)
	}
	req := request("messaging", desc("message_type", "marketing", "to_number", "2061111111"), desc("to_number", "2061111111"))
	for _, h := range []HeaderStyle{HeadersNone, HeadersRateLimit, HeadersXRateLimit, HeadersStructured, HeadersReference} {
		b.Run(h.String(), func(b *testing.B) {
			be := memory.New(memory.Options{})
			defer be.Close()
			svc, err := New(be, rules, Options{ResponseHeaders: h})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := svc.ShouldRateLimit(context.Background(), req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestReferenceHeaderStyle picks the descriptor as envoyproxy/ratelimit
// does (src/service/ratelimit.go, shouldRateLimitWorker): the first with
// the least remaining among those with a current_limit, a shadow one
// included; the last one over its limit that is no quota descriptor
// before all; none of an unlimited or unmatched one. The reset is the
// seconds until the window of the unit (× unit_multiplier) ends, by the
// service's clock; the names are Options.HeaderNames; Retry-After only
// over the limit.
func TestReferenceHeaderStyle(t *testing.T) {
	rules := `domain: h
descriptors:
  - {key: tight, rate_limit: {unit: minute, requests_per_unit: 2}}
  - {key: other, rate_limit: {unit: minute, requests_per_unit: 3}}
  - {key: loose, rate_limit: {unit: hour, requests_per_unit: 100}}
  - {key: ten, rate_limit: {unit: second, unit_multiplier: 10, requests_per_unit: 5}}
  - {key: shadow, shadow_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: quota, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 0}}
  - {key: free, rate_limit: {unlimited: true}}
`
	clk := clocktest.New(start.Add(12*time.Second + 300*time.Millisecond)) // 12.3 s into a minute
	be := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { be.Close() })
	// As in compatibility mode, every hit counts.
	f := newFixtureOpts(t, rules, be, clk, Options{ResponseHeaders: HeadersReference, Now: clk.Now,
		HeaderNames: HeaderNames{Limit: "X-L", Remaining: "X-R"}, OverLimitHits: config.OverLimitCount})
	for i, c := range []struct {
		ds   []*rlv3.RateLimitDescriptor
		code rlsv3.RateLimitResponse_Code
		want string
	}{
		{[]*rlv3.RateLimitDescriptor{desc("loose", "a")}, ok, "X-L: 100\nX-R: 99\nRateLimit-Reset: 2748\n"},
		{[]*rlv3.RateLimitDescriptor{desc("loose", "a"), desc("tight", "a")}, ok, "X-L: 2\nX-R: 1\nRateLimit-Reset: 48\n"},
		{[]*rlv3.RateLimitDescriptor{desc("tight", "a"), desc("other", "a")}, ok, "X-L: 2\nX-R: 0\nRateLimit-Reset: 48\n"},
		// tight over: its headers, with Retry-After.
		{[]*rlv3.RateLimitDescriptor{desc("tight", "a"), desc("other", "a")}, over, "X-L: 2\nX-R: 0\nRateLimit-Reset: 48\nRetry-After: 48\n"},
		// Both over: the last of them.
		{[]*rlv3.RateLimitDescriptor{desc("tight", "a"), desc("other", "a"), desc("other", "a")}, over, "X-L: 3\nX-R: 0\nRateLimit-Reset: 48\nRetry-After: 48\n"},
		{[]*rlv3.RateLimitDescriptor{desc("other", "a"), desc("tight", "a")}, over, "X-L: 2\nX-R: 0\nRateLimit-Reset: 48\nRetry-After: 48\n"},
		// A shadow rule over its limit, the least remaining: its headers.
		{[]*rlv3.RateLimitDescriptor{desc("loose", "b"), desc("shadow", "a"), desc("shadow", "a")}, ok, "X-L: 1\nX-R: 0\nRateLimit-Reset: 48\n"},
		// A quota descriptor over is no refusal: the least remaining, the
		// first with 0.
		{[]*rlv3.RateLimitDescriptor{desc("quota", "a"), desc("loose", "c")}, over, "X-L: 0\nX-R: 0\nRateLimit-Reset: 48\n"},
		// unit_multiplier: the 10-second window ends at 20 s.
		{[]*rlv3.RateLimitDescriptor{desc("ten", "a")}, ok, "X-L: 5\nX-R: 4\nRateLimit-Reset: 8\n"},
		{[]*rlv3.RateLimitDescriptor{desc("free", "a"), desc("nothing", "a")}, ok, ""},
	} {
		resp := f.call(t, request("h", c.ds...))
		if got := headerLines(resp.ResponseHeadersToAdd); resp.OverallCode != c.code || got != c.want {
			t.Errorf("call %d: %v\n%s want %v\n%s", i, resp.OverallCode, got, c.code, c.want)
		}
	}
}
