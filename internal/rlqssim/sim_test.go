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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/rlqssim"
)

// Each test below checks one behaviour of Envoy's rate_limit_quota filter
// that the simulator models, against a scripted server. The behaviours
// and where they are in Envoy's source are listed in the package's doc.

// scripted answers every report with the next action of its script for
// every bucket reported, and records the reports. A nil entry ends the
// stream instead of answering (as a server going away).
type scripted struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	mu      sync.Mutex
	script  []func() *rlqsv3.RateLimitQuotaResponse_BucketAction
	extra   []*rlqsv3.RateLimitQuotaResponse_BucketAction // appended to the next answer
	reports []*rlqsv3.RateLimitQuotaUsageReports
	streams int
}

func (s *scripted) StreamRateLimitQuotas(st grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) error {
	s.mu.Lock()
	s.streams++
	s.mu.Unlock()
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
		extra := s.extra
		s.extra = nil
		s.mu.Unlock()
		if next == nil {
			return status.Error(codes.Unavailable, "scripted: going away")
		}
		resp := &rlqsv3.RateLimitQuotaResponse{}
		for _, u := range rep.BucketQuotaUsages {
			a := next()
			a.BucketId = u.BucketId
			resp.BucketAction = append(resp.BucketAction, a)
		}
		resp.BucketAction = append(resp.BucketAction, extra...)
		if err := st.Send(resp); err != nil {
			return err
		}
	}
}

func (s *scripted) report(i int) *rlqsv3.RateLimitQuotaUsageReports {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reports[i]
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

func tokenBucket(most, fill uint32, every time.Duration) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens: most, TokensPerFill: wrapperspb.UInt32(fill), FillInterval: durationpb.New(every),
	}}}
}

func rptu(n uint64, u typev3.RateLimitUnit) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_RequestsPerTimeUnit_{
		RequestsPerTimeUnit: &typev3.RateLimitStrategy_RequestsPerTimeUnit{RequestsPerTimeUnit: n, TimeUnit: u},
	}}
}

func blanket(r typev3.RateLimitStrategy_BlanketRule) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

// serve serves srv on an in-memory listener and returns a connection to it
// and a function stopping the server.
func serve(t *testing.T, srv *scripted) (*grpc.ClientConn, func()) {
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
	return conn, gs.Stop
}

// start returns a client of srv on clk that reports only when told.
func start(t *testing.T, srv *scripted, clk *clocktest.Clock, opts ...rlqssim.Option) *rlqssim.Client {
	t.Helper()
	conn, _ := serve(t, srv)
	c, err := rlqssim.New(conn, "d", append([]rlqssim.Option{rlqssim.WithClock(clk.Now), rlqssim.WithManualReports()}, opts...)...)
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

// first creates the bucket (its first request, decided by
// no_assignment_behavior) and waits for the answer to its immediate report.
func first(t *testing.T, c *rlqssim.Client) bool {
	t.Helper()
	ok := c.Allow(bucket)
	settle(t, c)
	return ok
}

func settle(t *testing.T, c *rlqssim.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
}

func count(c *rlqssim.Client, n int) (allowed int) {
	for range n {
		if c.Allow(bucket) {
			allowed++
		}
	}
	return allowed
}

// TestRequestsPerTimeUnitIgnored: Envoy skips a requests_per_time_unit
// assignment (onQuotaResponseImpl: "not yet supported"), so the bucket
// keeps its no_assignment_behavior. A server that sends it limits nothing:
// here 10 per second admits 200 requests in one second, twenty times what
// a server expecting it to be enforced would count on.
func TestRequestsPerTimeUnitIgnored(t *testing.T) {
	srv := &scripted{script: []func() *rlqsv3.RateLimitQuotaResponse_BucketAction{assign(rptu(10, typev3.RateLimitUnit_SECOND), 10*time.Second)}}
	clk := clocktest.New(time.Unix(1000, 0))
	c := start(t, srv, clk)
	first(t, c)
	admitted := count(c, 100)
	clk.Advance(999 * time.Millisecond)
	admitted += count(c, 100)
	if admitted <= 10+10 {
		t.Fatalf("requests_per_time_unit 10/s admitted %d of 200 in a second: the simulator enforced it, Envoy does not", admitted)
	}
	if admitted != 200 || c.Assignment(bucket) != nil || c.Stats().Ignored == 0 {
		t.Fatalf("admitted %d of 200, assignment %v, stats %+v: want all admitted by no_assignment_behavior", admitted, c.Assignment(bucket), c.Stats())
	}
	// With no_assignment_behavior DENY_ALL the same server refuses
	// everything after the first report: the assignment never applies.
	srv2 := &scripted{script: []func() *rlqsv3.RateLimitQuotaResponse_BucketAction{assign(rptu(10, typev3.RateLimitUnit_SECOND), 10*time.Second)}}
	c2 := start(t, srv2, clk, rlqssim.WithNoAssignment(false))
	if first(t, c2) || count(c2, 20) != 0 {
		t.Fatal("no_assignment_behavior DENY_ALL admitted a request of a bucket assigned requests_per_time_unit")
	}
}

// TestTokenBucketRate: Envoy's rate is tokens_per_fill over fill_interval
// truncated to whole seconds, max_tokens is the burst, and a new bucket
// starts full (createTokenBucketFromAction, AtomicTokenBucketImpl).
func TestTokenBucketRate(t *testing.T) {
	cases := []struct {
		name  string
		st    *typev3.RateLimitStrategy
		start int // admitted at once, of 50
		after int // admitted 2 s later, of 50
	}{
		{"2 per second, 4 at once", tokenBucket(4, 2, time.Second), 4, 4},
		{"6 per 3 seconds is 2 per second", tokenBucket(10, 6, 3*time.Second), 10, 4},
		{"1.9 s counts as 1 s", tokenBucket(10, 2, 1900*time.Millisecond), 10, 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := &scripted{script: []func() *rlqsv3.RateLimitQuotaResponse_BucketAction{assign(tc.st, time.Minute)}}
			clk := clocktest.New(time.Unix(1000, 0))
			c := start(t, srv, clk)
			first(t, c)
			clk.Advance(time.Millisecond)
			if got := count(c, 50); got != tc.start {
				t.Fatalf("at once: admitted %d of 50, want %d", got, tc.start)
			}
			clk.Advance(2 * time.Second)
			if got := count(c, 50); got != tc.after {
				t.Fatalf("2 s later: admitted %d of 50, want %d", got, tc.after)
			}
		})
	}
	// Under a second, the whole seconds are 0 and the rate infinite: one
	// token per instant, so every request a microsecond apart passes.
	t.Run("a sub-second interval admits everything", func(t *testing.T) {
		srv := &scripted{script: []func() *rlqsv3.RateLimitQuotaResponse_BucketAction{assign(tokenBucket(1, 1, 500*time.Millisecond), time.Minute)}}
		clk := clocktest.New(time.Unix(1000, 0))
		c := start(t, srv, clk)
		first(t, c)
		admitted := 0
		for range 1000 {
			clk.Advance(time.Microsecond)
			if c.Allow(bucket) {
				admitted++
			}
		}
		if admitted != 1000 {
			t.Fatalf("1 per 500ms admitted %d of 1,000 requests in a millisecond, want all", admitted)
		}
	})
}

// TestTokenBucketReplacement: an assignment replaces the bucket in force
// only when max_tokens, tokens_per_fill or fill_interval's nanos differ
// (shouldReplaceTokenBucket, protoTokenBucketsEq); the new one starts full
// in Envoy 0b559611 and as full as the old one in c33e7f82.
func TestTokenBucketReplacement(t *testing.T) {
	cases := []struct {
		name string
		next *typev3.RateLimitStrategy
		mode rlqssim.Replacement
		// admitted at once after the new assignment, of 50; then 2 s later
		now, later int
	}{
		{"the same assignment keeps the tokens", tokenBucket(10, 1, time.Second), rlqssim.ReplaceFull, 0, 2},
		{"only the interval's seconds changed: the old bucket and its rate stay", tokenBucket(10, 1, 10*time.Second), rlqssim.ReplaceFull, 0, 2},
		{"another fill starts a full bucket", tokenBucket(10, 2, time.Second), rlqssim.ReplaceFull, 10, 4},
		{"another size starts a full bucket", tokenBucket(9, 1, time.Second), rlqssim.ReplaceFull, 9, 2},
		{"the nanos changed: a new bucket", tokenBucket(10, 1, time.Second+time.Millisecond), rlqssim.ReplaceFull, 10, 2},
		{"c33e7f82: as full as the old one (empty)", tokenBucket(10, 2, time.Second), rlqssim.ReplaceFraction, 0, 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := &scripted{script: []func() *rlqsv3.RateLimitQuotaResponse_BucketAction{assign(tokenBucket(10, 1, time.Second), time.Minute), assign(tc.next, time.Minute)}}
			clk := clocktest.New(time.Unix(1000, 0))
			c := start(t, srv, clk, rlqssim.WithReplacement(tc.mode))
			first(t, c)
			clk.Advance(time.Millisecond)
			if got := count(c, 50); got != 10 {
				t.Fatalf("first bucket: admitted %d of 50, want 10", got)
			}
			report(t, c) // the bucket is empty
			if got := count(c, 50); got != tc.now {
				t.Fatalf("after the new assignment: admitted %d of 50, want %d", got, tc.now)
			}
			clk.Advance(2 * time.Second)
			if got := count(c, 50); got != tc.later {
				t.Fatalf("2 s later: admitted %d of 50, want %d", got, tc.later)
			}
		})
	}
}

// TestTTLWholeSecondsAndFallbacks: only the seconds of
// assignment_time_to_live count (startActionExpirationTimer), 0 expiring
// at once; an expired assignment gives way to expired_assignment_behavior
// for its timeout (onActionExpirationTimer), then to
// no_assignment_behavior (onFallbackExpirationTimer).
func TestTTLWholeSecondsAndFallbacks(t *testing.T) {
	deny := blanket(typev3.RateLimitStrategy_DENY_ALL)
	t.Run("1.9 s is 1 s", func(t *testing.T) {
		srv := &scripted{script: []func() *rlqsv3.RateLimitQuotaResponse_BucketAction{assign(deny, 1900*time.Millisecond)}}
		clk := clocktest.New(time.Unix(1000, 0))
		c := start(t, srv, clk)
		first(t, c)
		clk.Advance(999 * time.Millisecond)
		if count(c, 1) != 0 {
			t.Fatal("DENY_ALL admitted before its TTL")
		}
		clk.Advance(time.Millisecond)
		if count(c, 1) != 1 || c.Assignment(bucket) != nil {
			t.Fatal("the assignment outlived the whole seconds of its TTL")
		}
	})
	t.Run("0 expires at once", func(t *testing.T) {
		srv := &scripted{script: []func() *rlqsv3.RateLimitQuotaResponse_BucketAction{assign(deny, 900*time.Millisecond)}}
		clk := clocktest.New(time.Unix(1000, 0))
		c := start(t, srv, clk)
		first(t, c)
		if count(c, 1) != 1 || c.Stats().Expired != 1 {
			t.Fatalf("a TTL under a second did not expire at once: %+v", c.Stats())
		}
	})
	t.Run("expired_assignment_behavior, then no_assignment_behavior", func(t *testing.T) {
		srv := &scripted{script: []func() *rlqsv3.RateLimitQuotaResponse_BucketAction{assign(tokenBucket(100, 100, time.Second), 2*time.Second)}}
		clk := clocktest.New(time.Unix(1000, 0))
		c := start(t, srv, clk, rlqssim.WithNoAssignment(false), rlqssim.WithExpiredAssignment(tokenBucket(3, 1, time.Second), 5*time.Second))
		if first(t, c) {
			t.Fatal("no_assignment_behavior DENY_ALL admitted the first request")
		}
		clk.Advance(time.Millisecond)
		if got := count(c, 200); got != 100 {
			t.Fatalf("assigned 100 at once: admitted %d", got)
		}
		clk.Advance(2 * time.Second) // expired: the fallback's bucket, new and full
		if got := count(c, 50); got != 3 || c.Assignment(bucket) != nil {
			t.Fatalf("fallback of 3: admitted %d, assignment %v", got, c.Assignment(bucket))
		}
		clk.Advance(5 * time.Second) // the fallback ended: DENY_ALL
		if got := count(c, 50); got != 0 {
			t.Fatalf("after the fallback's timeout: admitted %d, want 0", got)
		}
	})
}

// TestReports: the domain is on every report (buildReports); a new bucket
// is reported at once, alone, with time_elapsed 0 and its first request
// counted (createBucketImpl); a periodic report has every bucket, with
// time_elapsed in whole seconds, truncated (getUsageFromBucket).
func TestReports(t *testing.T) {
	allow := blanket(typev3.RateLimitStrategy_ALLOW_ALL)
	srv := &scripted{script: []func() *rlqsv3.RateLimitQuotaResponse_BucketAction{assign(allow, time.Minute)}}
	clk := clocktest.New(time.Unix(1000, 0))
	c := start(t, srv, clk)
	first(t, c)
	clk.Advance(1500 * time.Millisecond)
	other := map[string]string{"k": "w"}
	c.Allow(other)
	settle(t, c) // the immediate report of other, answered
	clk.Advance(3900 * time.Millisecond)
	count(c, 3)
	report(t, c)

	r0, r1, r2 := srv.report(0), srv.report(1), srv.report(2)
	for i, r := range []*rlqsv3.RateLimitQuotaUsageReports{r0, r1, r2} {
		if r.Domain != "d" {
			t.Errorf("report %d has domain %q: Envoy sets it on every report", i, r.Domain)
		}
	}
	if len(r1.BucketQuotaUsages) != 1 || r1.BucketQuotaUsages[0].BucketId.Bucket["k"] != "w" {
		t.Fatalf("a new bucket's immediate report: %v", r1)
	}
	u := r1.BucketQuotaUsages[0]
	if u.TimeElapsed.AsDuration() != 0 || u.NumRequestsAllowed != 1 {
		t.Errorf("immediate report %v: want time_elapsed 0 and its first request", u)
	}
	if len(r2.BucketQuotaUsages) != 2 {
		t.Fatalf("periodic report of %d buckets, want 2", len(r2.BucketQuotaUsages))
	}
	for _, u := range r2.BucketQuotaUsages {
		want, allowed := 5*time.Second, uint64(3) // 5.4 s, truncated
		if u.BucketId.Bucket["k"] == "w" {
			want, allowed = 3*time.Second, 0 // 3.9 s
		}
		if u.TimeElapsed.AsDuration() != want || u.NumRequestsAllowed != allowed {
			t.Errorf("periodic usage %v: want time_elapsed %v, %d allowed", u, want, allowed)
		}
	}
}

// TestRepliesMatchedByBucketID: an action for a bucket the client does not
// hold is ignored; abandon_action erases the bucket, which a new request
// creates again (reported at once).
func TestRepliesMatchedByBucketID(t *testing.T) {
	deny := blanket(typev3.RateLimitStrategy_DENY_ALL)
	srv := &scripted{script: []func() *rlqsv3.RateLimitQuotaResponse_BucketAction{assign(deny, time.Minute), abandon, assign(blanket(typev3.RateLimitStrategy_ALLOW_ALL), time.Minute)}}
	srv.extra = []*rlqsv3.RateLimitQuotaResponse_BucketAction{{
		BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"k": "v", "x": "y"}},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			RateLimitStrategy: blanket(typev3.RateLimitStrategy_ALLOW_ALL), AssignmentTimeToLive: durationpb.New(time.Minute)}},
	}}
	clk := clocktest.New(time.Unix(1000, 0))
	c := start(t, srv, clk)
	first(t, c)
	if count(c, 3) != 0 || c.Stats().Unknown != 1 {
		t.Fatalf("DENY_ALL with an action for another id: stats %+v", c.Stats())
	}
	report(t, c) // abandoned
	if c.Assignment(bucket) != nil || c.Stats().Abandoned != 1 {
		t.Fatal("abandon_action did not erase the bucket")
	}
	srv.mu.Lock()
	reports := len(srv.reports)
	srv.mu.Unlock()
	if !c.Allow(bucket) {
		t.Fatal("a bucket created again after abandon: no_assignment_behavior should admit")
	}
	settle(t, c)
	if r := srv.report(reports); len(r.BucketQuotaUsages) != 1 || r.BucketQuotaUsages[0].TimeElapsed.AsDuration() != 0 {
		t.Fatalf("the bucket created again was not reported at once: %v", r)
	}
	if c.Assignment(bucket).GetBlanketRule() != typev3.RateLimitStrategy_ALLOW_ALL || c.Assignment(bucket).GetTokenBucket() != nil {
		t.Fatalf("the answer to the new bucket's report: %v", c.Assignment(bucket))
	}
}

// TestStreamDownDropsReports: reports made while the stream is down are
// dropped (onSendReportsTimer builds them, resetting the counts, then
// fails to start the stream), and the next periodic report reopens it.
func TestStreamDownDropsReports(t *testing.T) {
	allow := blanket(typev3.RateLimitStrategy_ALLOW_ALL)
	srv := &scripted{script: []func() *rlqsv3.RateLimitQuotaResponse_BucketAction{assign(allow, time.Minute), nil, assign(allow, time.Minute)}}
	clk := clocktest.New(time.Unix(1000, 0))
	conn, stop := serve(t, srv)
	c, err := rlqssim.New(conn, "d", rlqssim.WithClock(clk.Now), rlqssim.WithManualReports())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	first(t, c)
	count(c, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Report(ctx); status.Code(err) != codes.Unavailable {
		t.Fatalf("a report the server ends the stream on: %v", err)
	}
	count(c, 2)
	clk.Advance(5 * time.Second)
	report(t, c) // reopens
	srv.mu.Lock()
	streams := srv.streams
	srv.mu.Unlock()
	if streams != 2 || c.Stats().Streams != 2 {
		t.Fatalf("streams %d (client %d): the next report should reopen it", streams, c.Stats().Streams)
	}
	// The report on the new stream counts only what came after the one
	// lost with the old stream.
	if r := srv.report(2); r.BucketQuotaUsages[0].NumRequestsAllowed != 2 || r.Domain != "d" {
		t.Fatalf("report on the reopened stream: %v", r)
	}
	// With the server gone, the stream cannot be reopened: the report is
	// dropped, with its counts.
	stop()
	waitFor(t, func() bool { return c.Err() != nil })
	count(c, 3)
	if err := c.Report(ctx); err == nil || c.Stats().Dropped != 1 {
		t.Fatalf("a report with the server gone: %v, stats %+v", err, c.Stats())
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
	}
}

// TestReportsOnItsOwn: without WithManualReports the first bucket starts
// the stream and the timer; the bucket is reported at once and then every
// interval, on the real clock.
func TestReportsOnItsOwn(t *testing.T) {
	srv := &scripted{script: []func() *rlqsv3.RateLimitQuotaResponse_BucketAction{assign(blanket(typev3.RateLimitStrategy_ALLOW_ALL), time.Minute)}}
	conn, _ := serve(t, srv)
	c, err := rlqssim.New(conn, "d", rlqssim.WithReportingInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(60 * time.Millisecond)
	srv.mu.Lock()
	streams := srv.streams
	srv.mu.Unlock()
	if streams != 0 {
		t.Fatal("the stream opened before any bucket")
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
