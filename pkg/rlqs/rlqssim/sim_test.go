package rlqssim_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/pkg/rlqs/rlqssim"
)

// scripted answers every report with the next action of its script for
// every bucket reported, and records the reports.
type scripted struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	mu      sync.Mutex
	script  []func() *rlqsv3.RateLimitQuotaResponse_BucketAction
	reports []*rlqsv3.RateLimitQuotaUsageReports
}

func (s *scripted) StreamRateLimitQuotas(st grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) error {
	for {
		rep, err := st.Recv()
		if err != nil {
			return nil
		}
		s.mu.Lock()
		s.reports = append(s.reports, rep)
		next := s.script[0]
		if len(s.script) > 1 {
			s.script = s.script[1:]
		}
		s.mu.Unlock()
		resp := &rlqsv3.RateLimitQuotaResponse{}
		for _, u := range rep.BucketQuotaUsages {
			a := next()
			a.BucketId = u.BucketId
			resp.BucketAction = append(resp.BucketAction, a)
		}
		if err := st.Send(resp); err != nil {
			return err
		}
	}
}

func assign(s *typev3.RateLimitStrategy, ttl time.Duration) func() *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return func() *rlqsv3.RateLimitQuotaResponse_BucketAction {
		return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{AssignmentTimeToLive: durationpb.New(ttl), RateLimitStrategy: s},
		}}
	}
}

func abandon() *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{
		AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{},
	}}
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func start(t *testing.T, srv *scripted, clk *clock, noAssignment bool) *rlqssim.Client {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	rlqsv3.RegisterRateLimitQuotaServiceServer(gs, srv)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c, err := rlqssim.New(conn, "d", time.Second, rlqssim.WithClock(clk.Now), rlqssim.WithManualReports(), rlqssim.WithNoAssignment(noAssignment))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func report(t *testing.T, c *rlqssim.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Report(ctx); err != nil {
		t.Fatal(err)
	}
}

var bucket = map[string]string{"k": "v"}

func count(c *rlqssim.Client, n int) (allowed int) {
	for range n {
		if c.Allow(bucket) {
			allowed++
		}
	}
	return allowed
}

func TestRequestsPerTimeUnitTTLAndNoAssignment(t *testing.T) {
	rptu := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_RequestsPerTimeUnit_{
		RequestsPerTimeUnit: &typev3.RateLimitStrategy_RequestsPerTimeUnit{RequestsPerTimeUnit: 10, TimeUnit: typev3.RateLimitUnit_SECOND},
	}}
	srv := &scripted{script: []func() *rlqsv3.RateLimitQuotaResponse_BucketAction{assign(rptu, 2*time.Second)}}
	clk := &clock{t: time.Unix(1000, 0)}
	c := start(t, srv, clk, false)

	if got := count(c, 5); got != 0 {
		t.Fatalf("no assignment, deny: admitted %d", got)
	}
	report(t, c)
	if got := count(c, 20); got != 10 {
		t.Fatalf("10 per second, starting full: admitted %d of 20", got)
	}
	clk.Advance(500 * time.Millisecond)
	if got := count(c, 20); got != 5 {
		t.Fatalf("half a second later: admitted %d, want 5", got)
	}
	// Past the TTL without a new assignment: back to no assignment (deny).
	clk.Advance(2 * time.Second)
	if got := count(c, 5); got != 0 || c.Assignment(bucket) != nil {
		t.Fatalf("expired: admitted %d, assignment %v", got, c.Assignment(bucket))
	}
	// The first report named the domain and counted 5 denied; the next one
	// leaves the domain out and counts 15 allowed, 30 denied.
	report(t, c)
	srv.mu.Lock()
	defer srv.mu.Unlock()
	r0, r1 := srv.reports[0], srv.reports[1]
	if r0.Domain != "d" || r1.Domain != "" {
		t.Errorf("domains %q, %q: want d, then none", r0.Domain, r1.Domain)
	}
	u0, u1 := r0.BucketQuotaUsages[0], r1.BucketQuotaUsages[0]
	if u0.NumRequestsDenied != 5 || u0.NumRequestsAllowed != 0 || u1.NumRequestsAllowed != 15 || u1.NumRequestsDenied != 30 {
		t.Errorf("usages %v, %v", u0, u1)
	}
	if el := u1.TimeElapsed.AsDuration(); el != 2500*time.Millisecond {
		t.Errorf("time_elapsed %v, want 2.5s", el)
	}
}

func TestTokenBucketBlanketAndAbandon(t *testing.T) {
	tb := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens: 4, TokensPerFill: wrapperspb.UInt32(2), FillInterval: durationpb.New(time.Second),
	}}}
	deny := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
	srv := &scripted{script: []func() *rlqsv3.RateLimitQuotaResponse_BucketAction{assign(tb, time.Minute), assign(deny, time.Minute), abandon}}
	clk := &clock{t: time.Unix(1000, 0)}
	c := start(t, srv, clk, true)

	if got := count(c, 3); got != 3 {
		t.Fatalf("no assignment, allow: admitted %d of 3", got)
	}
	report(t, c)
	if got := count(c, 10); got != 4 {
		t.Fatalf("token bucket of 4: admitted %d", got)
	}
	clk.Advance(time.Second)
	if got := count(c, 10); got != 2 {
		t.Fatalf("2 tokens a second: admitted %d", got)
	}
	report(t, c)
	if got := count(c, 3); got != 0 {
		t.Fatalf("DENY_ALL: admitted %d", got)
	}
	report(t, c)
	if c.Assignment(bucket) != nil {
		t.Fatal("abandoned bucket still has an assignment")
	}
	if got := count(c, 2); got != 2 {
		t.Fatalf("abandoned, then seen again: no assignment, allow: admitted %d", got)
	}
}

// TestReportsOnItsOwn: without WithManualReports a new bucket is reported
// at once and then every interval, on the real clock.
func TestReportsOnItsOwn(t *testing.T) {
	allow := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}}
	srv := &scripted{script: []func() *rlqsv3.RateLimitQuotaResponse_BucketAction{assign(allow, time.Minute)}}
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	rlqsv3.RegisterRateLimitQuotaServiceServer(gs, srv)
	go gs.Serve(lis)
	defer gs.Stop()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c, err := rlqssim.New(conn, "d", 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	c.Allow(bucket)
	deadline := time.Now().Add(10 * time.Second)
	for {
		srv.mu.Lock()
		n := len(srv.reports)
		srv.mu.Unlock()
		if n >= 3 && c.Assignment(bucket) != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d reports and assignment %v after 10s", n, c.Assignment(bucket))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}
