package service

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

const ownRules = testRules + `
  - key: queue
    rate_limit: {name: jobs, unit: second, requests_per_unit: 2, algorithm: leaky_bucket, burst: 4}
`

func ownDesc(kv ...string) *ratelimitdv1.Descriptor {
	d := &ratelimitdv1.Descriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitdv1.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func newOwnFixture(t *testing.T, opts Options) (*fixture, ratelimitdv1.RateLimiterClient) {
	clk := clocktest.New(start)
	be := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { be.Close() })
	f := newFixtureOpts(t, ownRules, be, clk, opts)
	return f, ratelimitdv1.NewRateLimiterClient(f.conn)
}

// TestCheckSharesTheEngine: Check and ShouldRateLimit count the same
// counters, and Check reports every figure.
func TestCheckSharesTheEngine(t *testing.T) {
	f, c := newOwnFixture(t, Options{})
	ctx := context.Background()
	// messaging.to_number: 100 per day. Envoy takes 40.
	f.call(t, request("messaging", desc("to_number", "1")))
	resp, err := c.Check(ctx, &ratelimitdv1.CheckRequest{Domain: "messaging", Descriptors: []*ratelimitdv1.Descriptor{ownDesc("to_number", "1")}, Hits: 39})
	if err != nil {
		t.Fatal(err)
	}
	r := resp.Results[0]
	if !resp.Allowed || r.Outcome != ratelimitdv1.Outcome_OUTCOME_OK || r.Remaining != 60 || r.Rule != "messaging.to_number" {
		t.Fatalf("Check after one RLS hit: %v", resp)
	}
	if l := r.Limit; l.Requests != 100 || l.Window.AsDuration() != 24*time.Hour || l.Algorithm != ratelimitdv1.Algorithm_ALGORITHM_FIXED_WINDOW {
		t.Errorf("limit %v", l)
	}
	// Envoy now sees what Check consumed.
	if st := f.call(t, request("messaging", desc("to_number", "1"))).Statuses[0]; st.LimitRemaining != 59 {
		t.Errorf("RLS after Check: %d remaining, want 59", st.LimitRemaining)
	}
	resp, err = c.Check(ctx, &ratelimitdv1.CheckRequest{Domain: "messaging", Descriptors: []*ratelimitdv1.Descriptor{ownDesc("to_number", "1")}, Hits: 60})
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Results[0]; resp.Allowed || r.Outcome != ratelimitdv1.Outcome_OUTCOME_OVER_LIMIT || r.Remaining != 59 || r.RetryAfter == nil {
		t.Fatalf("Check over the limit: %v", resp)
	}
}

// TestPeekConsumesNothing: Peek answers what Check then answers, and
// repeated peeks change nothing.
func TestPeekConsumesNothing(t *testing.T) {
	_, c := newOwnFixture(t, Options{})
	ctx := context.Background()
	descs := []*ratelimitdv1.Descriptor{ownDesc("queue", "q1"), ownDesc("sender", "s"), ownDesc("color", "red"), ownDesc("internal", "x")}
	var peeked *ratelimitdv1.PeekResponse
	for range 5 {
		p, err := c.Peek(ctx, &ratelimitdv1.PeekRequest{Domain: "messaging", Descriptors: descs, Hits: 2})
		if err != nil {
			t.Fatal(err)
		}
		if peeked != nil && !proto.Equal(p, peeked) {
			t.Fatalf("a peek changed the answer:\n%v\n%v", peeked, p)
		}
		peeked = p
	}
	checked, err := c.Check(ctx, &ratelimitdv1.CheckRequest{Domain: "messaging", Descriptors: descs, Hits: 2})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(checked.Results[0], peeked.Results[0]) || checked.Allowed != peeked.Allowed {
		t.Errorf("Peek %v, then Check %v: want the same answer", peeked, checked)
	}
	q := checked.Results[0]
	// Leaky bucket of 2 per second, 4 deep: 2 hits into the empty queue
	// wait for nothing; one more waits the second those 2 take to drain.
	if q.Outcome != ratelimitdv1.Outcome_OUTCOME_OK || q.Limit.Burst != 4 || q.Limit.Name != "jobs" || q.Wait.AsDuration() != 0 {
		t.Errorf("leaky bucket result %v", q)
	}
	next, err := c.Check(ctx, &ratelimitdv1.CheckRequest{Domain: "messaging", Descriptors: descs[:1], Hits: 1})
	if err != nil || next.Results[0].Wait.AsDuration() != time.Second {
		t.Errorf("the third hit of a leaky bucket: %v, %v; want a wait of 1s", next, err)
	}
	for i, want := range []ratelimitdv1.Outcome{ratelimitdv1.Outcome_OUTCOME_OK, ratelimitdv1.Outcome_OUTCOME_OK, ratelimitdv1.Outcome_OUTCOME_NO_LIMIT, ratelimitdv1.Outcome_OUTCOME_UNLIMITED} {
		if checked.Results[i].Outcome != want {
			t.Errorf("result %d: %v, want %v", i, checked.Results[i].Outcome, want)
		}
	}
	if !checked.Results[1].Shadow {
		t.Error("the sender rule is shadow")
	}
	// The shadow sender rule (2 per minute) is now full: a shadow refusal
	// does not refuse the request.
	again, err := c.Check(ctx, &ratelimitdv1.CheckRequest{Domain: "messaging", Descriptors: descs[1:2], Hits: 1})
	if err != nil || !again.Allowed || again.Results[0].Outcome != ratelimitdv1.Outcome_OUTCOME_OVER_LIMIT {
		t.Errorf("shadow over its limit: %v, %v", again, err)
	}
}

// TestReset is refused unless enabled, then clears every limit of the
// matched rule.
func TestOwnReset(t *testing.T) {
	ctx := context.Background()
	_, off := newOwnFixture(t, Options{})
	if _, err := off.Reset(ctx, &ratelimitdv1.ResetRequest{Domain: "messaging", Descriptor_: ownDesc("to_number", "1")}); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "-enable-reset") {
		t.Fatalf("Reset while off: %v", err)
	}
	_, c := newOwnFixture(t, Options{EnableReset: true})
	check := func() uint64 {
		resp, err := c.Check(ctx, &ratelimitdv1.CheckRequest{Domain: "messaging", Descriptors: []*ratelimitdv1.Descriptor{ownDesc("user", "u")}, Hits: 1})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Results[0].Remaining
	}
	first := check()
	check()
	resp, err := c.Reset(ctx, &ratelimitdv1.ResetRequest{Domain: "messaging", Descriptor_: ownDesc("user", "u")})
	if err != nil || resp.Rule != "messaging.user" || resp.Counters < 2 {
		t.Fatalf("Reset: %v, %v; want the rule's counters cleared", resp, err)
	}
	if got := check(); got != first {
		t.Errorf("after Reset: %d remaining, want %d as on the first call", got, first)
	}
	if _, err := c.Reset(ctx, &ratelimitdv1.ResetRequest{Domain: "messaging", Descriptor_: ownDesc("color", "red")}); status.Code(err) != codes.NotFound {
		t.Errorf("Reset of a descriptor no rule limits: %v, want NotFound", err)
	}
	if _, err := c.Reset(ctx, &ratelimitdv1.ResetRequest{Domain: "messaging"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Reset without a descriptor: %v, want InvalidArgument", err)
	}
}

// TestOwnAPIBadInput: the same bounds as ShouldRateLimit.
func TestOwnAPIBadInput(t *testing.T) {
	_, c := newOwnFixture(t, Options{})
	_, err := c.Check(context.Background(), &ratelimitdv1.CheckRequest{Descriptors: []*ratelimitdv1.Descriptor{ownDesc("k", "v")}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "domain") {
		t.Fatalf("Check without a domain: %v", err)
	}
	resp, err := c.Check(context.Background(), &ratelimitdv1.CheckRequest{Domain: "nowhere", Descriptors: []*ratelimitdv1.Descriptor{ownDesc("k", "v")}})
	if err != nil || !resp.Allowed || resp.Results[0].Outcome != ratelimitdv1.Outcome_OUTCOME_NO_LIMIT {
		t.Fatalf("unknown domain: %v, %v", resp, err)
	}
}

// TestAlgorithmEnum pins the proto enum to algo's order, which ownLimit
// relies on.
func TestAlgorithmEnum(t *testing.T) {
	for _, a := range algo.Algorithms() {
		got := ratelimitdv1.Algorithm(a + 1).String()
		if want := "ALGORITHM_" + strings.ToUpper(a.String()); got != want {
			t.Errorf("%v maps to %s, want %s", a, got, want)
		}
	}
}
