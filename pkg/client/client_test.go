package client_test

import (
	"context"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimitd/pkg/client"
	"github.com/ratelimitd/ratelimitd/pkg/service"
	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

// newClient returns a client of addr for a test, closed when it ends.
// Its calls have a generous deadline, so that a loaded machine fails no
// test; opts come after it.
func newClient(t testing.TB, addr string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(addr, append([]client.Option{client.WithTimeout(10 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestAllowAdmitsThenRefuses: a limit of 3 admits 3 requests, then refuses
// with the time until a token is back, and admits again after it.
func TestAllowAdmitsThenRefuses(t *testing.T) {
	s := startServer(t, service.Options{})
	c := newClient(t, s.addr)
	ctx := context.Background()
	alice := client.D("user_id", "alice")
	for i := range 3 {
		d, err := c.Allow(ctx, "api", alice)
		if err != nil {
			t.Fatal(err)
		}
		r := d.Results[0]
		if !d.Allowed || d.RetryAfter != 0 || r.Outcome != client.OutcomeOK || r.Remaining != uint64(2-i) {
			t.Fatalf("hit %d: %+v", i+1, d)
		}
	}
	d, err := c.Allow(ctx, "api", alice)
	if err != nil {
		t.Fatal(err)
	}
	want := client.Result{
		Outcome:    client.OutcomeOverLimit,
		Rule:       "api.user_id",
		Limit:      client.Limit{Requests: 3, Window: time.Minute, Algorithm: "token_bucket", Burst: 3},
		ResetAfter: time.Minute,
		RetryAfter: 20 * time.Second,
	}
	if d.Allowed || d.RetryAfter != 20*time.Second || len(d.Results) != 1 || d.Results[0] != want {
		t.Fatalf("the 4th hit: %+v; want refused, retry after 20s, %+v", d, want)
	}
	// Others are not limited by alice's limit.
	if d, err := c.Allow(ctx, "api", client.D("user_id", "bob")); err != nil || !d.Allowed {
		t.Errorf("bob: %+v, %v", d, err)
	}
	s.clock.Advance(20 * time.Second)
	if d, err := c.Allow(ctx, "api", alice); err != nil || !d.Allowed || d.Results[0].Remaining != 0 {
		t.Errorf("after the retry-after: %+v, %v", d, err)
	}
}

// TestDecisionOfSeveralDescriptors: the request is refused by any
// non-shadow descriptor over its limit, RetryAfter is the longest of
// theirs, and every outcome is reported.
func TestDecisionOfSeveralDescriptors(t *testing.T) {
	s := startServer(t, service.Options{})
	c := newClient(t, s.addr)
	ctx := context.Background()
	s.clock.Advance(15 * time.Second) // the path window ends in 45s
	ds := []client.Descriptor{
		client.D("user_id", "carol"),
		client.D("path", "/x").Hits(5),
		client.D("trial", "t"),
		client.D("internal", "yes"),
		client.D("unknown", "z"),
	}
	d, err := c.Allow(ctx, "api", ds...)
	if err != nil {
		t.Fatal(err)
	}
	wantOutcomes := []client.Outcome{client.OutcomeOK, client.OutcomeOK, client.OutcomeOK, client.OutcomeUnlimited, client.OutcomeNoLimit}
	for i, r := range d.Results {
		if r.Outcome != wantOutcomes[i] {
			t.Errorf("result %d: %v, want %v", i, r.Outcome, wantOutcomes[i])
		}
	}
	if !d.Allowed || !d.Results[2].Shadow || d.Results[1].Limit.Name != "per_path" || d.Results[1].Remaining != 0 {
		t.Fatalf("first request: %+v", d)
	}
	// The trial rule is over its limit: a shadow refusal refuses nothing.
	d, err = c.Allow(ctx, "api", client.D("trial", "t"))
	if err != nil || !d.Allowed || d.RetryAfter != 0 || d.Results[0].Outcome != client.OutcomeOverLimit {
		t.Fatalf("shadow over its limit: %+v, %v", d, err)
	}
	// carol's token is back in 20s, the path's window ends in 45s: the
	// request waits for both.
	d, err = c.Allow(ctx, "api", ds[0], ds[0], ds[0], client.D("path", "/x"))
	if err != nil || d.Allowed || d.RetryAfter != 45*time.Second {
		t.Fatalf("two limits over: %+v, %v; want a retry after 45s", d, err)
	}
	// A request for more hits than the bucket holds never passes.
	d, err = c.Allow(ctx, "api", client.D("user_id", "dave").Hits(4), client.D("path", "/y"))
	if err != nil || d.Allowed || d.RetryAfter != client.Never || d.Results[0].RetryAfter != client.Never {
		t.Fatalf("more than the limit holds: %+v, %v; want a retry after Never", d, err)
	}
}

// TestPeekConsumesNothing: peeks answer what Check then answers, and
// count nothing.
func TestPeekConsumesNothing(t *testing.T) {
	s := startServer(t, service.Options{})
	c := newClient(t, s.addr)
	ctx := context.Background()
	ds := []client.Descriptor{client.D("user_id", "erin").Hits(2), client.D("path", "/p")}
	var peeked *ratelimitdv1.PeekResponse
	for range 5 {
		p, err := c.Peek(ctx, "api", ds...)
		if err != nil {
			t.Fatal(err)
		}
		if peeked != nil && !proto.Equal(p, peeked) {
			t.Fatalf("a peek changed the answer:\n%v\n%v", peeked, p)
		}
		peeked = p
	}
	checked, err := c.Check(ctx, "api", ds...)
	if err != nil {
		t.Fatal(err)
	}
	if checked.Allowed != peeked.Allowed || checked.Results[0].Remaining != 1 || checked.Results[1].Remaining != 4 {
		t.Errorf("Check after the peeks: %v; peeked %v", checked, peeked)
	}
	// NewDecision reads a peek as Allow reads a check.
	pr, err := c.Peek(ctx, "api", ds...)
	if err != nil {
		t.Fatal(err)
	}
	if d := client.NewDecision(pr.Allowed, pr.Results); d.Allowed || d.RetryAfter != 20*time.Second {
		t.Errorf("peek of 2 more hits with 1 left: %+v", d)
	}
}

// TestReset: an operator's reset restores the limit, and the server
// refuses it unless enabled.
func TestReset(t *testing.T) {
	s := startServer(t, service.Options{EnableReset: true})
	c := newClient(t, s.addr)
	ctx := context.Background()
	frank := client.D("user_id", "frank")
	if d, err := c.Allow(ctx, "api", frank.Hits(3)); err != nil || !d.Allowed {
		t.Fatalf("%+v, %v", d, err)
	}
	if d, err := c.Allow(ctx, "api", frank); err != nil || d.Allowed {
		t.Fatalf("over the limit: %+v, %v", d, err)
	}
	r, err := c.Reset(ctx, "api", frank)
	if err != nil || r.Rule != "api.user_id" || r.Counters != 1 {
		t.Fatalf("Reset: %v, %v", r, err)
	}
	if d, err := c.Allow(ctx, "api", frank); err != nil || !d.Allowed || d.Results[0].Remaining != 2 {
		t.Errorf("after Reset: %+v, %v", d, err)
	}
	if _, err := c.Reset(ctx, "api", client.D("internal", "x")); status.Code(err) != codes.NotFound {
		t.Errorf("Reset of an unlimited descriptor: %v, want NotFound", err)
	}

	off := startServer(t, service.Options{})
	if _, err := newClient(t, off.addr).Reset(ctx, "api", frank); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Reset on a server without -enable-reset: %v, want PermissionDenied", err)
	}
}

// TestRLS: Envoy's API counts the same counters, and AllowRLS makes the
// same decision of its fewer figures.
func TestRLS(t *testing.T) {
	s := startServer(t, service.Options{})
	c := newClient(t, s.addr)
	ctx := context.Background()
	resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain: "api",
		Descriptors: []*rlv3.RateLimitDescriptor{{
			Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user_id", Value: "grace"}},
		}},
		HitsAddend: 2,
	})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("ShouldRateLimit: %v, %v", resp, err)
	}
	// Allow sees what Envoy's API took.
	if d, err := c.Allow(ctx, "api", client.D("user_id", "grace")); err != nil || !d.Allowed || d.Results[0].Remaining != 0 {
		t.Fatalf("Allow after ShouldRateLimit: %+v, %v", d, err)
	}
	// grace is over her limit: the retry is the time until her bucket is
	// full again, all Envoy's API tells.
	d, err := c.AllowRLS(ctx, "api", client.D("user_id", "grace"), client.D("path", "/r"))
	if err != nil || d.Allowed || d.Results[0].Outcome != client.OutcomeOverLimit || d.Results[1].Outcome != client.OutcomeOK {
		t.Fatalf("AllowRLS over the limit: %+v, %v", d, err)
	}
	if d.RetryAfter != d.Results[0].ResetAfter || d.RetryAfter != time.Minute {
		t.Errorf("AllowRLS retry after %v, reset after %v: want the reset", d.RetryAfter, d.Results[0].ResetAfter)
	}
	s.clock.Advance(30 * time.Second) // the path window ends in 30s
	d, err = c.AllowRLS(ctx, "api", client.D("path", "/r").Hits(4), client.D("internal", "x"), client.D("unknown", "y"))
	if err != nil {
		t.Fatal(err)
	}
	want := []client.Result{
		{Outcome: client.OutcomeOK, Limit: client.Limit{Name: "per_path", Requests: 5, Window: time.Minute}, Remaining: 1, ResetAfter: 30 * time.Second},
		{Outcome: client.OutcomeUnlimited, Remaining: math.MaxUint32},
		{Outcome: client.OutcomeNoLimit},
	}
	if !d.Allowed || len(d.Results) != len(want) {
		t.Fatalf("AllowRLS: %+v", d)
	}
	for i := range want {
		if d.Results[i] != want[i] {
			t.Errorf("result %d: %+v, want %+v", i, d.Results[i], want[i])
		}
	}
	// LimiterFunc(c.AllowRLS) is a Limiter.
	var l client.Limiter = client.LimiterFunc(c.AllowRLS)
	if d, err := l.Allow(ctx, "api", client.D("user_id", "henry")); err != nil || !d.Allowed {
		t.Errorf("a LimiterFunc of AllowRLS: %+v, %v", d, err)
	}
}

// TestUnreachable: a server nobody listens for fails fast with
// Unavailable.
func TestUnreachable(t *testing.T) {
	c := newClient(t, closedAddr(t))
	_, err := c.Allow(context.Background(), "api", client.D("user_id", "ivan"))
	if status.Code(err) != codes.Unavailable {
		t.Errorf("Allow of a closed port: %v, want Unavailable", err)
	}
}

// TestTimeout: a call without a deadline gets the client's; one with a
// deadline keeps it.
func TestTimeout(t *testing.T) {
	// A listener that accepts connections and never answers.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			held = append(held, conn)
		}
	}()
	for _, tc := range []struct {
		name    string
		opts    []client.Option
		ctx     time.Duration // the caller's deadline, 0 for none
		atLeast time.Duration
	}{
		{"default", nil, 0, client.DefaultTimeout},
		{"WithTimeout", []client.Option{client.WithTimeout(250 * time.Millisecond)}, 0, 250 * time.Millisecond},
		{"caller's deadline", []client.Option{client.WithTimeout(time.Millisecond)}, 200 * time.Millisecond, 200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := client.New(lis.Addr().String(), tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			// The clock starts before the caller's deadline is set: on a
			// busy machine the two may lie milliseconds apart, and timed
			// from after it the call seemed to give up early (196 ms of a
			// 200 ms deadline, in a CI run beside two busy loops).
			began := time.Now()
			ctx := context.Background()
			if tc.ctx > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.ctx)
				defer cancel()
			}
			_, err = c.Allow(ctx, "api", client.D("user_id", "judy"))
			took := time.Since(began)
			if status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("%v, want DeadlineExceeded", err)
			}
			if took < tc.atLeast || took > tc.atLeast+5*time.Second {
				t.Errorf("gave up after %v, want %v", took, tc.atLeast)
			}
		})
	}
}

// TestWithConn: a client on the caller's connection leaves it open.
func TestWithConn(t *testing.T) {
	s := startServer(t, service.Options{})
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c, err := client.New("", client.WithConn(conn))
	if err != nil {
		t.Fatal(err)
	}
	if c.Conn() != conn {
		t.Error("Conn is not the given connection")
	}
	if d, err := c.Allow(context.Background(), "api", client.D("user_id", "ken")); err != nil || !d.Allowed {
		t.Fatalf("%+v, %v", d, err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c2, err := client.New("", client.WithConn(conn))
	if err != nil {
		t.Fatal(err)
	}
	if d, err := c2.Allow(context.Background(), "api", client.D("user_id", "ken")); err != nil || d.Results[0].Remaining != 1 {
		t.Errorf("after the first client's Close: %+v, %v", d, err)
	}
	if _, err := client.New("", client.WithConn(conn), client.WithInsecure()); err == nil {
		t.Error("WithConn and WithInsecure: no error")
	}
	if _, err := client.New(""); err == nil {
		t.Error("an empty target: no error")
	}
}

func TestDescriptor(t *testing.T) {
	d := client.D("user_id", "alice", "path", "/x")
	h := d.Hits(3)
	if d.HitsAddend != 0 || h.HitsAddend != 3 || len(h.Entries) != 2 || h.Entries[1] != (client.Entry{Key: "path", Value: "/x"}) {
		t.Errorf("D and Hits: %+v, %+v", d, h)
	}
	if got := h.String(); got != "user_id=alice,path=/x hits=3" {
		t.Errorf("String: %q", got)
	}
	defer func() {
		if recover() == nil {
			t.Error("D of an odd number of strings does not panic")
		}
	}()
	client.D(strings.Fields("user_id")...) // hidden from staticcheck's SA5012
}

func TestOutcomeString(t *testing.T) {
	for o, want := range map[client.Outcome]string{
		client.OutcomeOK: "ok", client.OutcomeOverLimit: "over_limit", client.OutcomeNoLimit: "no_limit",
		client.OutcomeUnlimited: "unlimited", client.OutcomeUnknown: "unknown", 9: "Outcome(9)",
	} {
		if got := o.String(); got != want {
			t.Errorf("%d: %q, want %q", o, got, want)
		}
	}
}

// TestDecisionOfALeasedLimit reads a leased limit and the lease the
// answering replica holds.
func TestDecisionOfALeasedLimit(t *testing.T) {
	d := client.NewDecision(true, []*ratelimitdv1.DescriptorResult{{
		Outcome: ratelimitdv1.Outcome_OUTCOME_OK,
		Limit: &ratelimitdv1.Limit{Requests: 5000, Window: durationpb.New(time.Second),
			Algorithm: ratelimitdv1.Algorithm_ALGORITHM_FIXED_WINDOW, Consistency: ratelimitdv1.Consistency_CONSISTENCY_LEASED},
		Remaining: 4000,
		Lease:     &ratelimitdv1.LeaseState{Held: 120, Ends: durationpb.New(800 * time.Millisecond), Rate: 600},
	}, {
		Outcome: ratelimitdv1.Outcome_OUTCOME_OK,
		Limit:   &ratelimitdv1.Limit{Requests: 10, Window: durationpb.New(time.Minute), Consistency: ratelimitdv1.Consistency_CONSISTENCY_EXACT},
	}})
	r := d.Results[0]
	if !r.Limit.Leased || r.Lease == nil || *r.Lease != (client.Lease{Held: 120, Ends: 800 * time.Millisecond, Rate: 600}) {
		t.Errorf("leased result %+v, lease %+v", r, r.Lease)
	}
	if r := d.Results[1]; r.Limit.Leased || r.Lease != nil {
		t.Errorf("exact result %+v", r)
	}
}
