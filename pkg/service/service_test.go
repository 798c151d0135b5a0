package service

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/wire"
)

// start is a whole minute, 2023-11-14T22:14:00Z, so windows of a minute or
// less start there.
var start = time.Unix(1_700_000_040, 0)

const testRules = `
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {name: marketing, unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: sender
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: internal
    rate_limit: {unlimited: true}
  - key: burst
    rate_limit: {unit: second, unit_multiplier: 10, requests_per_unit: 3}
  - key: files
    value: /shared/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: files
    value: /own/*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        rate_limit: {name: specific_limit, unit: second, requests_per_unit: 5}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        rate_limit:
          replaces: [{name: specific_limit}]
          unit: second
          requests_per_unit: 10
  - key: model
    quota_mode: true
    metadata: {backend: small}
    rate_limit: {unit: minute, requests_per_unit: 7}
  - key: user
    rate_limits:
      - {name: user_per_second, requests_per_unit: 10, unit: second}
      - {name: user_per_hour, requests_per_unit: 1000, unit: hour, algorithm: sliding_window_counter, consistency: leased}
      - {requests_per_unit: 50, unit: minute, unit_multiplier: 2, algorithm: gcra, burst: 5}
`

type fixture struct {
	svc    *Service
	client rlsv3.RateLimitServiceClient
	conn   *grpc.ClientConn
	clock  *clocktest.Clock
}

// newFixture serves a Service over an in-memory gRPC connection, on the
// memory backend with a test clock.
func newFixture(t testing.TB, rules string) *fixture {
	t.Helper()
	clk := clocktest.New(start)
	be := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { be.Close() })
	return newFixtureWith(t, rules, be, clk)
}

func newFixtureWith(t testing.TB, rules string, be algo.Backend, clk *clocktest.Clock) *fixture {
	t.Helper()
	return newFixtureOpts(t, rules, be, clk, Options{})
}

// newFixtureOpts is newFixtureWith with the service's options.
func newFixtureOpts(t testing.TB, rules string, be algo.Backend, clk *clocktest.Clock, opts Options) *fixture {
	t.Helper()
	rs, err := config.Parse(config.File{Name: "rules.yaml", Data: []byte(rules)})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(be, rs, opts)
	if err != nil {
		t.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	// As serve makes its server: requests decoded by wire.DecodeOptions
	// with this service's Tolerance, handler panics answered, not fatal.
	serverOpts := append(wire.DecodeOptions(Tolerance()), grpc.ChainUnaryInterceptor(svc.UnaryInterceptor()), grpc.ChainStreamInterceptor(svc.StreamInterceptor()))
	gs := grpc.NewServer(serverOpts...)
	svc.RegisterGRPC(gs)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &fixture{svc: svc, client: rlsv3.NewRateLimitServiceClient(conn), conn: conn, clock: clk}
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func request(domain string, ds ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
}

func (f *fixture) call(t *testing.T, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := f.client.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(resp.Statuses) != len(req.Descriptors) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
	}
	return resp
}

// remaining returns the limit_remaining of a peek (hits 0) at d.
func (f *fixture) remaining(t *testing.T, d *rlv3.RateLimitDescriptor) uint32 {
	t.Helper()
	peek := &rlv3.RateLimitDescriptor{Entries: d.Entries, Limit: d.Limit, HitsAddend: wrapperspb.UInt64(0)}
	return f.call(t, request("messaging", peek)).Statuses[0].LimitRemaining
}

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

func TestCountsUntilOverLimit(t *testing.T) {
	f := newFixture(t, testRules)
	d := desc("message_type", "marketing", "to_number", "2061111111")
	untilMidnight := time.Hour + 46*time.Minute // from 22:14 UTC
	for i := range 5 {
		resp := f.call(t, request("messaging", d))
		st := resp.Statuses[0]
		if resp.OverallCode != ok || st.Code != ok || st.LimitRemaining != uint32(4-i) {
			t.Fatalf("call %d: %v", i, resp)
		}
		cl := st.CurrentLimit
		if cl.GetName() != "marketing" || cl.GetRequestsPerUnit() != 5 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_DAY || cl.GetUnitMultiplier() != nil {
			t.Fatalf("current_limit %v", cl)
		}
		if got := st.DurationUntilReset.AsDuration(); got != untilMidnight {
			t.Fatalf("duration_until_reset %v, want %v", got, untilMidnight)
		}
	}
	resp := f.call(t, request("messaging", d))
	if resp.OverallCode != over || resp.Statuses[0].Code != over || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("6th call: %v", resp)
	}
	// Another number has its own counter; the next day starts afresh.
	if st := f.call(t, request("messaging", desc("message_type", "marketing", "to_number", "2062222222"))).Statuses[0]; st.Code != ok || st.LimitRemaining != 4 {
		t.Fatalf("other number: %v", st)
	}
	f.clock.Advance(untilMidnight)
	if st := f.call(t, request("messaging", d)).Statuses[0]; st.Code != ok || st.LimitRemaining != 4 {
		t.Fatalf("next day: %v", st)
	}
}

func TestNoMatchingRule(t *testing.T) {
	f := newFixture(t, testRules)
	for name, req := range map[string]*rlsv3.RateLimitRequest{
		"unknown domain":        request("nope", desc("to_number", "1")),
		"unknown key":           request("messaging", desc("color", "red")),
		"placeholder level":     request("messaging", desc("message_type", "marketing")),
		"deeper than the rules": request("messaging", desc("to_number", "1", "x", "y")),
		"override, unknown domain": request("nope", &rlv3.RateLimitDescriptor{Entries: desc("a", "b").Entries,
			Limit: &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_SECOND}}),
	} {
		resp := f.call(t, req)
		st := resp.Statuses[0]
		if resp.OverallCode != ok || st.Code != ok || st.CurrentLimit != nil || st.DurationUntilReset != nil {
			t.Errorf("%s: %v, want OK without a current limit", name, resp)
		}
	}
}

func TestSeveralDescriptorsAreAllOrNothing(t *testing.T) {
	f := newFixture(t, testRules)
	marketing := desc("message_type", "marketing", "to_number", "1")
	total := desc("to_number", "1")
	for range 5 {
		f.call(t, request("messaging", marketing, total))
	}
	resp := f.call(t, request("messaging", marketing, total))
	if resp.OverallCode != over || resp.Statuses[0].Code != over || resp.Statuses[1].Code != ok {
		t.Fatalf("6th: %v", resp)
	}
	if got := resp.Statuses[1].LimitRemaining; got != 95 {
		t.Errorf("within-limit descriptor of a refused request reports %d remaining, want 95 (nothing taken)", got)
	}
	if got := f.remaining(t, total); got != 95 {
		t.Fatalf("refused request consumed from its other descriptor: remaining %d, want 95", got)
	}
	// The same descriptor twice counts twice.
	resp = f.call(t, request("messaging", total, total))
	if resp.Statuses[0].LimitRemaining != 94 || resp.Statuses[1].LimitRemaining != 93 {
		t.Fatalf("same descriptor twice: %v", resp)
	}
}

func TestHitsAddend(t *testing.T) {
	f := newFixture(t, testRules)
	d := desc("to_number", "7")
	req := request("messaging", d)
	req.HitsAddend = 30
	if st := f.call(t, req).Statuses[0]; st.LimitRemaining != 70 {
		t.Fatalf("request hits_addend 30: %v", st)
	}
	// A descriptor's hits_addend wins over the request's.
	d.HitsAddend = wrapperspb.UInt64(60)
	if st := f.call(t, req).Statuses[0]; st.LimitRemaining != 10 {
		t.Fatalf("descriptor hits_addend 60: %v", st)
	}
	// More than remains is refused whole and consumes nothing.
	d.HitsAddend = wrapperspb.UInt64(11)
	if st := f.call(t, req).Statuses[0]; st.Code != over || st.LimitRemaining != 10 {
		t.Fatalf("11 of 10: %v, want OVER_LIMIT with the 10 remaining untouched", st)
	}
	// Zero hits peek.
	d.HitsAddend = wrapperspb.UInt64(0)
	if st := f.call(t, req).Statuses[0]; st.Code != ok || st.LimitRemaining != 10 {
		t.Fatalf("peek: %v", st)
	}
}

func TestShadowMode(t *testing.T) {
	f := newFixture(t, testRules)
	shadow, total := desc("sender", "s1"), desc("to_number", "9")
	for range 2 {
		f.call(t, request("messaging", shadow))
	}
	resp := f.call(t, request("messaging", shadow, total))
	if resp.OverallCode != ok || resp.Statuses[0].Code != ok || resp.Statuses[0].LimitRemaining != 0 || resp.Statuses[0].CurrentLimit == nil {
		t.Fatalf("shadow over its limit: %v, want OK with 0 remaining", resp)
	}
	if got := f.remaining(t, total); got != 99 {
		t.Fatalf("a shadow refusal refused the request: remaining %d, want 99", got)
	}
}

func TestUnlimited(t *testing.T) {
	f := newFixture(t, testRules)
	for range 3 {
		st := f.call(t, request("messaging", desc("internal", "x"))).Statuses[0]
		if st.Code != ok || st.LimitRemaining != math.MaxUint32 || st.CurrentLimit != nil {
			t.Fatalf("unlimited: %v", st)
		}
	}
}

func TestUnitMultiplier(t *testing.T) {
	f := newFixture(t, testRules)
	f.clock.Advance(4 * time.Second) // 4 s into a 10 s window aligned to the epoch
	st := f.call(t, request("messaging", desc("burst", "b"))).Statuses[0]
	cl := st.CurrentLimit
	if cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND || cl.GetUnitMultiplier().GetValue() != 10 {
		t.Fatalf("current_limit %v", cl)
	}
	if got := st.DurationUntilReset.AsDuration(); got != 6*time.Second {
		t.Fatalf("duration_until_reset %v, want 6s", got)
	}
}

func TestReplaces(t *testing.T) {
	f := newFixture(t, testRules)
	specific := desc("key_1", "value_1", "user", "bkthomps")
	replacing := desc("key_2", "value_2", "user", "bkthomps")
	// Together, only the replacing rule applies: 10 per second.
	for i := range 10 {
		resp := f.call(t, request("messaging", specific, replacing))
		if resp.OverallCode != ok {
			t.Fatalf("call %d: %v", i, resp)
		}
		if st := resp.Statuses[0]; st.CurrentLimit != nil {
			t.Fatalf("replaced descriptor reports a limit: %v", st)
		}
	}
	if resp := f.call(t, request("messaging", specific, replacing)); resp.OverallCode != over {
		t.Fatalf("11th: %v", resp)
	}
	// The replaced rule's own counter was not touched.
	if got := f.call(t, request("messaging", specific)).Statuses[0].LimitRemaining; got != 4 {
		t.Fatalf("replaced rule alone: remaining %d, want 4", got)
	}
}

func TestUnlimitedRuleReplaces(t *testing.T) {
	f := newFixture(t, `
domain: d
descriptors:
  - {key: user, rate_limit: {name: per_user, unit: minute, requests_per_unit: 1}}
  - {key: admin, rate_limit: {unlimited: true, replaces: [{name: per_user}]}}
`)
	for i := range 3 {
		resp := f.call(t, request("d", desc("user", "u1"), desc("admin", "yes")))
		if resp.OverallCode != ok || resp.Statuses[0].CurrentLimit != nil || resp.Statuses[1].LimitRemaining != math.MaxUint32 {
			t.Fatalf("call %d: %v; an unlimited rule replaces like any other", i, resp)
		}
	}
	if st := f.call(t, request("d", desc("user", "u1"))).Statuses[0]; st.Code != ok || st.LimitRemaining != 0 {
		t.Fatalf("per_user alone: %v, want its first hit", st)
	}
}

func TestShadowOverLimitHitsAreNotCounted(t *testing.T) {
	f := newFixture(t, testRules)
	shadow := desc("sender", "s2")
	for range 5 { // 2 within the limit of 2, then 3 over it
		f.call(t, request("messaging", shadow))
	}
	// The key does not depend on N: raising the limit shows the count.
	raised, err := config.Parse(config.File{Name: "raised.yaml", Data: []byte(`
domain: messaging
descriptors:
  - {key: sender, shadow_mode: true, rate_limit: {unit: minute, requests_per_unit: 10}}
`)})
	if err != nil {
		t.Fatal(err)
	}
	f.svc.SetRules(raised)
	if got := f.remaining(t, shadow); got != 8 {
		t.Fatalf("remaining %d, want 8: only the 2 admitted hits count", got)
	}
}

// quotaRules has two quota-mode rules, a plain rule and a shadow one, of
// one hit a minute each (the plain one 5).
const quotaRules = `domain: q
descriptors:
  - {key: a, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: b, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: c, rate_limit: {unit: minute, requests_per_unit: 5}}
`

// TestQuotaMode: as envoyproxy/ratelimit's quota_mode, a quota rule over
// its limit reports OVER_LIMIT for its descriptor, and refuses the request
// only when every quota descriptor of the request is over; a plain rule
// over its limit refuses as always. With the service's QuotaMode every
// rule is a quota rule.
func TestQuotaMode(t *testing.T) {
	f := newFixture(t, quotaRules)
	codes := func(resp *rlsv3.RateLimitResponse) []rlsv3.RateLimitResponse_Code {
		out := []rlsv3.RateLimitResponse_Code{resp.OverallCode}
		for _, st := range resp.Statuses {
			out = append(out, st.Code)
		}
		return out
	}
	for i, c := range []struct {
		ds   []*rlv3.RateLimitDescriptor
		want []rlsv3.RateLimitResponse_Code // overall, then each descriptor
	}{
		// a and b each have their one hit.
		{[]*rlv3.RateLimitDescriptor{desc("a", "1"), desc("b", "1")}, []rlsv3.RateLimitResponse_Code{ok, ok, ok}},
		// Both quotas over: refused.
		{[]*rlv3.RateLimitDescriptor{desc("a", "1"), desc("b", "1")}, []rlsv3.RateLimitResponse_Code{over, over, over}},
		// One quota over, one fresh: admitted, the over one told.
		{[]*rlv3.RateLimitDescriptor{desc("a", "1"), desc("b", "2")}, []rlsv3.RateLimitResponse_Code{ok, over, ok}},
		// A quota over beside a plain rule within its limit: the only quota
		// is over, so refused.
		{[]*rlv3.RateLimitDescriptor{desc("a", "1"), desc("c", "1")}, []rlsv3.RateLimitResponse_Code{over, over, ok}},
	} {
		if got := codes(f.call(t, request("q", c.ds...))); !slices.Equal(got, c.want) {
			t.Errorf("call %d: codes %v, want %v", i+1, got, c.want)
		}
	}

	// Everything in quota mode: a plain rule's refusal alone no longer
	// refuses when another quota descriptor is within its limit.
	be := memory.New(memory.Options{Now: f.clock.Now, SweepInterval: -1})
	t.Cleanup(func() { be.Close() })
	g := newFixtureOpts(t, quotaRules, be, f.clock, Options{QuotaMode: true})
	for range 5 {
		g.call(t, request("q", desc("c", "1")))
	}
	if got := codes(g.call(t, request("q", desc("c", "1"), desc("a", "9")))); !slices.Equal(got, []rlsv3.RateLimitResponse_Code{ok, over, ok}) {
		t.Errorf("QuotaMode: codes %v, want OK overall, c over, a ok", got)
	}
}

// TestGlobalQuotaModeDescriptors: with the service's QuotaMode (the
// reference's QUOTA_MODE) every descriptor but an unlimited one is a
// quota descriptor: one that matched no rule, or a shadow one over its
// limit, passes, so a rule at 0 beside it does not refuse the request; an
// unlimited descriptor is none, and a limit override is one.
func TestGlobalQuotaModeDescriptors(t *testing.T) {
	rules := `domain: q
descriptors:
  - {key: zero, rate_limit: {unit: minute, requests_per_unit: 0}}
  - {key: shadowzero, shadow_mode: true, rate_limit: {unit: minute, requests_per_unit: 0}}
  - {key: free, rate_limit: {unlimited: true}}
`
	clk := clocktest.New(start)
	be := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { be.Close() })
	f := newFixtureOpts(t, rules, be, clk, Options{QuotaMode: true})
	zeroOverride := desc("x", "1")
	zeroOverride.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_MINUTE}
	for _, c := range []struct {
		name string
		ds   []*rlv3.RateLimitDescriptor
		want rlsv3.RateLimitResponse_Code
	}{
		{"a rule at 0 alone", []*rlv3.RateLimitDescriptor{desc("zero", "a")}, over},
		{"beside an unmatched descriptor", []*rlv3.RateLimitDescriptor{desc("zero", "a"), desc("nothing", "x")}, ok},
		{"beside a shadow rule over its limit", []*rlv3.RateLimitDescriptor{desc("zero", "a"), desc("shadowzero", "s")}, ok},
		{"beside an unlimited rule", []*rlv3.RateLimitDescriptor{desc("zero", "a"), desc("free", "f")}, over},
		{"an unlimited rule alone", []*rlv3.RateLimitDescriptor{desc("free", "f")}, ok},
		{"a limit override at 0 alone", []*rlv3.RateLimitDescriptor{zeroOverride}, over},
		{"a limit override at 0 beside an unmatched descriptor", []*rlv3.RateLimitDescriptor{zeroOverride, desc("nothing", "x")}, ok},
	} {
		resp := f.call(t, request("q", c.ds...))
		if resp.OverallCode != c.want {
			t.Errorf("%s: %v %v, want %v overall", c.name, resp.OverallCode, resp.Statuses, c.want)
		}
		// The descriptor at 0 is told it is over, whatever the request.
		if k := c.ds[0].Entries[0].Key; (k == "zero" || k == "x") && resp.Statuses[0].Code != over {
			t.Errorf("%s: the descriptor at 0 answered %v", c.name, resp.Statuses[0].Code)
		}
	}
}

// TestGlobalShadowMode: the service's ShadowMode answers OK overall while
// each descriptor is decided, counted and reported as usual.
func TestGlobalShadowMode(t *testing.T) {
	clk := clocktest.New(start)
	be := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { be.Close() })
	f := newFixtureOpts(t, quotaRules, be, clk, Options{ShadowMode: true})
	for i := range 7 {
		resp := f.call(t, request("q", desc("c", "1")))
		wantDesc := ok
		if i >= 5 {
			wantDesc = over
		}
		if resp.OverallCode != ok || resp.Statuses[0].Code != wantDesc {
			t.Fatalf("call %d: overall %v, descriptor %v; want OK, %v", i+1, resp.OverallCode, resp.Statuses[0].Code, wantDesc)
		}
	}
}

func TestLimitOverride(t *testing.T) {
	f := newFixture(t, testRules)
	override := func(n uint32, unit typev3.RateLimitUnit, kv ...string) *rlv3.RateLimitDescriptor {
		d := desc(kv...)
		d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: unit}
		return d
	}
	// No rule matches (color), but the domain is known: the override applies.
	d := override(2, typev3.RateLimitUnit_MINUTE, "color", "red")
	for i := range 2 {
		st := f.call(t, request("messaging", d)).Statuses[0]
		if st.Code != ok || st.CurrentLimit.GetRequestsPerUnit() != 2 || st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || st.CurrentLimit.GetName() != "" {
			t.Fatalf("call %d: %v", i, st)
		}
	}
	if st := f.call(t, request("messaging", d)).Statuses[0]; st.Code != over {
		t.Fatalf("3rd: %v", st)
	}
	// An override of another unit counts apart from the rule's counter.
	f.call(t, request("messaging", override(1, typev3.RateLimitUnit_HOUR, "to_number", "5")))
	if got := f.remaining(t, desc("to_number", "5")); got != 100 {
		t.Fatalf("override consumed the day rule's counter: remaining %d", got)
	}
	d = override(3, typev3.RateLimitUnit_SECOND, "color", "blue")
	d.Limit.UnitMultiplier = wrapperspb.UInt32(30)
	if st := f.call(t, request("messaging", d)).Statuses[0]; st.CurrentLimit.GetUnitMultiplier().GetValue() != 30 || st.DurationUntilReset.AsDuration() != 30*time.Second {
		t.Fatalf("multiplied override: %v", st)
	}
}

func TestShareThreshold(t *testing.T) {
	f := newFixture(t, testRules)
	f.call(t, request("messaging", desc("files", "/shared/a")))
	if st := f.call(t, request("messaging", desc("files", "/shared/b"))).Statuses[0]; st.LimitRemaining != 0 {
		t.Fatalf("share_threshold: /shared/b remaining %d, want 0 (one counter for the wildcard)", st.LimitRemaining)
	}
	f.call(t, request("messaging", desc("files", "/own/a")))
	if st := f.call(t, request("messaging", desc("files", "/own/b"))).Statuses[0]; st.LimitRemaining != 1 {
		t.Fatalf("plain wildcard: /own/b remaining %d, want 1 (a counter per value)", st.LimitRemaining)
	}
}

func TestInvalidArgument(t *testing.T) {
	f := newFixture(t, testRules)
	long := strings.Repeat("x", 1025)
	many := func(n int) []*rlv3.RateLimitDescriptor {
		ds := make([]*rlv3.RateLimitDescriptor, n)
		for i := range ds {
			ds[i] = desc("k", "v")
		}
		return ds
	}
	manyEntries := desc()
	for range 17 {
		manyEntries.Entries = append(manyEntries.Entries, &rlv3.RateLimitDescriptor_Entry{Key: "k", Value: "v"})
	}
	withOverride := func(o *rlv3.RateLimitDescriptor_RateLimitOverride) *rlv3.RateLimitDescriptor {
		d := desc("k", "v")
		d.Limit = o
		return d
	}
	withHits := desc("k", "v")
	withHits.HitsAddend = wrapperspb.UInt64(1_000_000_001)
	refund := desc("k", "v")
	refund.IsNegativeHits = true

	cases := []struct {
		name, field, msg string
		req              *rlsv3.RateLimitRequest
	}{
		{"empty domain", "domain", "must not be empty", request("", desc("k", "v"))},
		{"long domain", "domain", "is 256 bytes long; at most 255", request(strings.Repeat("d", 256), desc("k", "v"))},
		{"no descriptors", "descriptors", "none given; a request carries 1 to 64", request("messaging")},
		{"too many descriptors", "descriptors", "65 given; at most 64", &rlsv3.RateLimitRequest{Domain: "messaging", Descriptors: many(65)}},
		{"no entries", "descriptors[0].entries", "none given; a descriptor carries 1 to 16", request("messaging", desc())},
		{"too many entries", "descriptors[1].entries", "17 given; at most 16", request("messaging", desc("k", "v"), manyEntries)},
		{"empty key", "descriptors[0].entries[0].key", "must not be empty", request("messaging", desc("", "v"))},
		{"long key", "descriptors[0].entries[0].key", "is 1025 bytes long; at most 1024", request("messaging", desc(long, "v"))},
		{"long value", "descriptors[0].entries[1].value", "is 1025 bytes long; at most 1024", request("messaging", desc("a", "b", "k", long))},
		{"request hits", "hits_addend", "is 1000000001; at most 1000000000", &rlsv3.RateLimitRequest{Domain: "messaging", Descriptors: many(1), HitsAddend: 1_000_000_001}},
		{"descriptor hits", "descriptors[0].hits_addend", "is 1000000001; at most 1000000000", request("messaging", withHits)},
		{"refund", "descriptors[0].is_negative_hits", "refunds are not supported", request("messaging", refund)},
		{"override without unit", "descriptors[0].limit.unit", "is UNKNOWN; accepted: SECOND, MINUTE, HOUR, DAY, MONTH, YEAR",
			request("messaging", withOverride(&rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5}))},
		{"override multiplier 0", "descriptors[0].limit.unit_multiplier", "is 0; it must be at least 1",
			request("messaging", withOverride(&rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_SECOND, UnitMultiplier: wrapperspb.UInt32(0)}))},
		{"override window too long", "descriptors[0].limit.unit_multiplier", "101 years is longer than the longest window",
			request("messaging", withOverride(&rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_YEAR, UnitMultiplier: wrapperspb.UInt32(101)}))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := f.client.ShouldRateLimit(context.Background(), c.req)
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), c.field+": "+c.msg) {
				t.Fatalf("got %v %q, want InvalidArgument %q", st.Code(), st.Message(), c.field+": "+c.msg)
			}
			var br *errdetails.BadRequest
			for _, d := range st.Details() {
				if b, isBR := d.(*errdetails.BadRequest); isBR {
					br = b
				}
			}
			if br == nil || len(br.FieldViolations) != 1 || br.FieldViolations[0].Field != c.field {
				t.Fatalf("BadRequest detail %v, want the field %s", br, c.field)
			}
		})
	}
}

// failingBackend fails every decision, as an unreachable store would.
type failingBackend struct{}

func (failingBackend) Decide(context.Context, []algo.Request, []algo.Decision) error {
	return errors.New("connection refused")
}

func TestBackendFailureIsUnavailable(t *testing.T) {
	f := newFixtureOpts(t, testRules, failingBackend{}, new(clocktest.Clock), Options{FailureMode: config.FailError})
	_, err := f.client.ShouldRateLimit(context.Background(), request("messaging", desc("to_number", "1")))
	if st := status.Convert(err); st.Code() != codes.Unavailable || st.Message() != errBackendUnavailable {
		t.Fatalf("got %v, want Unavailable with the generic message (the cause, which may name Redis, is logged)", err)
	}
	// Requests that need no counter do not touch the backend.
	if resp := f.call(t, request("messaging", desc("internal", "x"), desc("color", "red"))); resp.OverallCode != ok {
		t.Fatalf("unlimited and unmatched descriptors: %v", resp)
	}
	if n := f.svc.DegradedDecisions(config.FailError); n != 1 {
		t.Errorf("DegradedDecisions(error) = %d, want 1", n)
	}
}

// TestFailureModes decides with a backend that always fails, under each
// failure mode, set for the server or by the domain's rule file.
func TestFailureModes(t *testing.T) {
	req := request("messaging", desc("to_number", "1"), desc("sender", "s"), desc("color", "red"))
	for _, tc := range []struct {
		name     string
		server   config.FailureMode
		domain   string // failure_mode line of the rule file
		want     rlsv3.RateLimitResponse_Code
		statuses []rlsv3.RateLimitResponse_Code
		counted  config.FailureMode
	}{
		{"default is open", "", "", ok, []rlsv3.RateLimitResponse_Code{ok, ok, ok}, config.FailOpen},
		{"open", config.FailOpen, "", ok, []rlsv3.RateLimitResponse_Code{ok, ok, ok}, config.FailOpen},
		// The shadow descriptor (sender) never refuses; the unmatched one
		// (color) has no limit to refuse by.
		{"closed", config.FailClosed, "", over, []rlsv3.RateLimitResponse_Code{over, ok, ok}, config.FailClosed},
		{"domain closed, server open", config.FailOpen, "failure_mode: closed\n", over, []rlsv3.RateLimitResponse_Code{over, ok, ok}, config.FailClosed},
		{"domain open, server closed", config.FailClosed, "failure_mode: open\n", ok, []rlsv3.RateLimitResponse_Code{ok, ok, ok}, config.FailOpen},
		{"local without a fallback is open", config.FailLocal, "", ok, []rlsv3.RateLimitResponse_Code{ok, ok, ok}, config.FailOpen},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixtureOpts(t, tc.domain+testRules, failingBackend{}, new(clocktest.Clock), Options{FailureMode: tc.server})
			resp := f.call(t, req)
			if resp.OverallCode != tc.want {
				t.Fatalf("overall %v, want %v: %v", resp.OverallCode, tc.want, resp)
			}
			for i, st := range resp.Statuses {
				if st.Code != tc.statuses[i] || st.LimitRemaining != 0 {
					t.Errorf("status %d: %v, want %v with 0 remaining (unknown)", i, st, tc.statuses[i])
				}
			}
			if resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 100 {
				t.Errorf("the matched rule's limit is missing: %v", resp.Statuses[0])
			}
			if n := f.svc.DegradedDecisions(tc.counted); n != 1 {
				t.Errorf("DegradedDecisions(%s) = %d, want 1", tc.counted, n)
			}
		})
	}
}

// TestFailureModeLocal decides with the fallback while the backend fails,
// each limit cut to the replica's share.
func TestFailureModeLocal(t *testing.T) {
	clk := clocktest.New(start)
	fallback := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
	f := newFixtureOpts(t, testRules, failingBackend{}, clk, Options{FailureMode: config.FailLocal, Fallback: fallback, LocalShare: 0.25})
	req := request("messaging", desc("to_number", "1"))
	admitted := 0
	for range 40 {
		if f.call(t, req).OverallCode == ok {
			admitted++
		}
	}
	if admitted != 25 {
		t.Errorf("local fallback with a share of 0.25 admitted %d of 100 per day, want 25", admitted)
	}
	if n := f.svc.DegradedDecisions(config.FailLocal); n != 40 {
		t.Errorf("DegradedDecisions(local) = %d, want 40", n)
	}
}

// TestFailureLogIsBounded: a failing backend is logged once per interval,
// with the count of lines held back, never once per request.
func TestFailureLogIsBounded(t *testing.T) {
	var buf bytes.Buffer
	clk := clocktest.New(start)
	rs, err := config.Parse(config.File{Name: "rules.yaml", Data: []byte(testRules)})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(failingBackend{}, rs, Options{Logger: slog.New(slog.NewTextHandler(&buf, nil)), Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	req := request("messaging", desc("to_number", "1"))
	for range 50 {
		if _, err := svc.ShouldRateLimit(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(failureLogInterval)
	if _, err := svc.ShouldRateLimit(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "suppressed=0") || !strings.Contains(lines[1], "suppressed=49") ||
		!strings.Contains(lines[0], "failure_mode=open") || !strings.Contains(lines[0], "connection refused") {
		t.Fatalf("want 2 lines, the second counting 49 held back:\n%s", buf.String())
	}
}

// TestCallerDeadlineIsNotAFailure: a caller that gave up gets its own
// error, not a decision by the failure mode.
func TestCallerDeadlineIsNotAFailure(t *testing.T) {
	f := newFixtureOpts(t, testRules, failingBackend{}, new(clocktest.Clock), Options{FailureMode: config.FailClosed})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := f.svc.ShouldRateLimit(ctx, request("messaging", desc("to_number", "1")))
	if status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled call: %v, want Canceled", err)
	}
	if n := f.svc.DegradedDecisions(config.FailClosed); n != 0 {
		t.Errorf("a cancelled call was decided by the failure mode")
	}
}

func TestHealthAndReflection(t *testing.T) {
	f := newFixture(t, testRules)
	hc := healthpb.NewHealthClient(f.conn)
	for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
		resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %q: %v, %v", svc, resp, err)
		}
	}

	stream, err := reflectionpb.NewServerReflectionClient(f.conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	for _, want := range []string{"envoy.service.ratelimit.v3.RateLimitService", "grpc.health.v1.Health"} {
		if !strings.Contains(strings.Join(names, " "), want) {
			t.Errorf("reflection lists %v, missing %s", names, want)
		}
	}

	f.svc.Drain()
	resp2, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
	if err != nil || resp2.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health while draining: %v, %v", resp2, err)
	}
	if r := f.call(t, request("messaging", desc("to_number", "1"))); r.OverallCode != ok {
		t.Fatalf("a draining service must still decide: %v", r)
	}
}

func TestSetRules(t *testing.T) {
	f := newFixture(t, testRules)
	newRules, err := config.Parse(config.File{Name: "new.yaml", Data: []byte(`
domain: messaging
descriptors:
  - {key: to_number, rate_limit: {unit: day, requests_per_unit: 1}}
`)})
	if err != nil {
		t.Fatal(err)
	}
	f.svc.SetRules(newRules)
	if f.svc.Rules() != newRules {
		t.Fatal("Rules() does not return the rules just set")
	}
	if st := f.call(t, request("messaging", desc("to_number", "1"))).Statuses[0]; st.CurrentLimit.GetRequestsPerUnit() != 1 {
		t.Fatalf("after SetRules: %v", st)
	}
}

// TestConcurrentCallsAreExact sends far more calls than the limit from many
// goroutines and checks that exactly the limit is admitted.
func TestConcurrentCallsAreExact(t *testing.T) {
	f := newFixture(t, testRules)
	const workers, perWorker = 16, 20 // 320 calls for a limit of 100
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range perWorker {
				resp, err := f.client.ShouldRateLimit(context.Background(), request("messaging", desc("to_number", "hot")))
				if err != nil {
					t.Error(err)
					return
				}
				if resp.OverallCode == ok {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if admitted.Load() != 100 {
		t.Fatalf("admitted %d of %d calls, want exactly 100", admitted.Load(), workers*perWorker)
	}
}

func TestResponseUnitsMatchOverrideUnits(t *testing.T) {
	// currentLimit relies on the two Envoy unit enums agreeing for the
	// units an override can carry.
	for u := typev3.RateLimitUnit_SECOND; u <= typev3.RateLimitUnit_YEAR; u++ {
		if got := responseUnit(overrideUnit(u)); got.String() != u.String() {
			t.Errorf("override unit %v answers as %v", u, got)
		}
	}
}

// TestEveryRuleAlgorithmIsImplemented checks that every algorithm a rule
// file may name reaches its implementation: a rule naming it decides
// under that algorithm, which admits a first hit and refuses one past the
// limit.
func TestEveryRuleAlgorithmIsImplemented(t *testing.T) {
	for _, a := range algo.Algorithms() {
		src := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1, unit: minute, algorithm: " + a.String() + "}\n"
		rules, err := config.Parse(config.File{Name: "r.yaml", Data: []byte(src)})
		if err != nil {
			t.Fatalf("%v: %v", a, err)
		}
		l := ruleLimit(&rules.Domain("d").Rules()[0].Limits[0])
		if l.Algorithm != a {
			t.Errorf("a rule naming %v decides under %v", a, l.Algorithm)
		}
		var s algo.State
		now := time.Unix(1_700_000_000, 0)
		if d := algo.Step(&s, now, l, 1); !d.Allowed {
			t.Errorf("%v refuses the first hit of a fresh limit: %+v", a, d)
		}
		if d := algo.Step(&s, now, l, 1); d.Allowed {
			t.Errorf("%v admits a second hit of a limit of 1: %+v", a, d)
		}
	}
}

func TestNewRejectsMissingParts(t *testing.T) {
	rules, _ := config.Parse(config.File{Name: "r.yaml", Data: []byte("domain: d\n")})
	if _, err := New(nil, rules, Options{}); err == nil {
		t.Error("New accepted a nil backend")
	}
	if _, err := New(failingBackend{}, nil, Options{}); err == nil {
		t.Error("New accepted nil rules")
	}
}

// benchRules have limits no benchmark reaches, so every call is admitted
// and stores its count.
const benchRules = `
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: second, requests_per_unit: 4294967295}
  - key: to_number
    rate_limit: {unit: second, requests_per_unit: 4294967295}
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 4294967295}
      - {unit: hour, requests_per_unit: 4294967295}
`

func BenchmarkShouldRateLimit(b *testing.B) {
	rules, err := config.Parse(config.File{Name: "r.yaml", Data: []byte(benchRules)})
	if err != nil {
		b.Fatal(err)
	}
	be := memory.New(memory.Options{})
	defer be.Close()
	svc, _ := New(be, rules, Options{})
	for name, req := range map[string]*rlsv3.RateLimitRequest{
		"one_descriptor":  request("messaging", desc("to_number", "2061111111")),
		"two_descriptors": request("messaging", desc("message_type", "marketing", "to_number", "2061111111"), desc("to_number", "2061111111")),
		"no_match":        request("messaging", desc("color", "red")),
		"two_limits":      request("messaging", desc("user", "2061111111")),
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := svc.ShouldRateLimit(context.Background(), req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// TestNilMessagesInProcess calls the service directly, as an in-process
// caller might, with nil descriptors and entries: refused, never a panic.
func TestNilMessagesInProcess(t *testing.T) {
	f := newFixture(t, testRules)
	for name, req := range map[string]*rlsv3.RateLimitRequest{
		"nil descriptor": {Domain: "messaging", Descriptors: []*rlv3.RateLimitDescriptor{nil}},
		"nil entry":      {Domain: "messaging", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{nil}}}},
	} {
		if _, err := f.svc.ShouldRateLimit(context.Background(), req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
}

// BenchmarkShouldRateLimitOverGRPC decides over a gRPC connection (in
// memory, bufconn), so that what the server does to a request before the
// handler (its codec, its interceptors) is measured too.
func BenchmarkShouldRateLimitOverGRPC(b *testing.B) {
	f := newFixture(b, benchRules)
	for name, req := range map[string]*rlsv3.RateLimitRequest{
		"one_descriptor":  request("messaging", desc("to_number", "2061111111")),
		"two_descriptors": request("messaging", desc("message_type", "marketing", "to_number", "2061111111"), desc("to_number", "2061111111")),
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := f.client.ShouldRateLimit(context.Background(), req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
