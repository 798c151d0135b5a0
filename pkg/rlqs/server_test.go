package rlqs_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"runtime"
	"slices"
	"strings"
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

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/rlqssim"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/rlqs"
)

// rulesYAML is the rule file of the tests. Bucket ids are matched with their
// entries sorted by key, so {route: ..., name: acme} is [(name, acme),
// (route, ...)].
const rulesYAML = `domain: quota
descriptors:
  - key: name
    value: acme
    descriptors:
      - key: route
        rate_limit: {requests_per_unit: 100, unit: second}
  - key: name
    value: "big*"
    rate_limit: {requests_per_unit: 60, unit: minute}
  - key: unlimited
    rate_limit: {unlimited: true}
  - key: closed
    rate_limit: {requests_per_unit: 0, unit: second}
  - key: shadow
    rate_limit: {requests_per_unit: 5, unit: second}
    shadow_mode: true
`

// wholeShare is the Headroom of the tests about which rule decides a
// bucket, and what: every stream is assigned its whole share, whatever
// the demand it reported.
var wholeShare = math.Inf(1)

type fixture struct {
	srv   *rlqs.Server
	conn  *grpc.ClientConn
	clock *clocktest.Clock
}

func start(t *testing.T, opts rlqs.Options) *fixture {
	t.Helper()
	return startOn(t, opts, clocktest.New(time.Unix(1_700_000_000, 0)))
}

// startOn starts a server on clock clk, which several fixtures may share.
func startOn(t *testing.T, opts rlqs.Options, clk *clocktest.Clock) *fixture {
	t.Helper()
	return startWith(t, opts, clk)
}

// startWith is startOn with options for the gRPC server.
func startWith(t *testing.T, opts rlqs.Options, clk *clocktest.Clock, serverOpts ...grpc.ServerOption) *fixture {
	t.Helper()
	if opts.Rules == nil {
		rules, err := config.Parse(config.File{Name: "quota.yaml", Data: []byte(rulesYAML)})
		if err != nil {
			t.Fatal(err)
		}
		opts.Rules = func() *config.Rules { return rules }
	}
	opts.Now = clk.Now
	var srv *rlqs.Server
	if opts.AfterFunc == nil {
		// What a timer starts (a starved pool's push, which calls the
		// store) is done before the clock moves on: the timers of two
		// replicas sharing the clock run one after the other, as they
		// are due, rather than racing each other to the store.
		opts.AfterFunc = func(d time.Duration, f func()) {
			clk.AfterFunc(d, func() { f(); idle(srv) })
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	srv, err := rlqs.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(serverOpts...)
	srv.Register(gs)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &fixture{srv: srv, conn: conn, clock: clk}
}

// idle waits, 10 s at most, until srv has no work on hand: no report
// being decided, no push on its way (Server.work). A wait that ends in
// vain is left to the next quiet to report, with what still works.
func idle(srv *rlqs.Server) {
	deadline := time.Now().Add(10 * time.Second)
	for pause := time.Microsecond; time.Now().Before(deadline); pause = min(2*pause, time.Millisecond) {
		if _, _, work, _ := srv.Quiescence(); work == 0 {
			return
		}
		time.Sleep(pause)
	}
}

// stacks returns the stacks of every goroutine, for a test that waited
// in vain to tell what waited on what.
func stacks() []byte {
	buf := make([]byte, 1<<20)
	return buf[:runtime.Stack(buf, true)]
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// rawStream opens a stream the test writes reports on itself.
func (f *fixture) rawStream(t *testing.T) grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse] {
	t.Helper()
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(f.conn).StreamRateLimitQuotas(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func usage(allowed, denied uint64, kv ...string) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		BucketId: &rlqsv3.BucketId{Bucket: m}, TimeElapsed: durationpb.New(time.Second),
		NumRequestsAllowed: allowed, NumRequestsDenied: denied,
	}
}

// exchange sends one report and returns the response, or the stream's error.
func exchange(t *testing.T, st grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse], domain string, us ...*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) (*rlqsv3.RateLimitQuotaResponse, error) {
	t.Helper()
	if err := st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: us}); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	return st.Recv()
}

// describe renders a strategy compactly: "ALLOW_ALL", "DENY_ALL", or a
// token bucket as "1000/10s max 100" (tokens_per_fill/fill_interval and
// max_tokens).
func describe(s *typev3.RateLimitStrategy) string {
	switch v := s.GetStrategy().(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
		return v.BlanketRule.String()
	case *typev3.RateLimitStrategy_TokenBucket:
		tb := v.TokenBucket
		return itoa(uint64(tb.GetTokensPerFill().GetValue())) + "/" + tb.GetFillInterval().AsDuration().String() + " max " + itoa(uint64(tb.GetMaxTokens()))
	case nil:
		return "none"
	}
	return s.String()
}

// rate is the requests per second a token bucket strategy refills at, as
// Envoy computes it (tokens_per_fill over fill_interval's whole seconds);
// 0 for anything else.
func rate(s *typev3.RateLimitStrategy) float64 {
	tb := s.GetTokenBucket()
	if tb == nil {
		return 0
	}
	return float64(tb.GetTokensPerFill().GetValue()) / float64(tb.GetFillInterval().GetSeconds())
}

func itoa(n uint64) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

func TestBucketMatching(t *testing.T) {
	cases := []struct {
		name   string
		domain string
		bucket []string
		want   string
	}{
		{"entries sorted by key", "quota", []string{"route", "/pay", "name", "acme"}, "1000/10s max 100"},
		{"wildcard", "quota", []string{"name", "bigcorp"}, "1020/17m0s max 1"},
		{"too few entries for the rule", "quota", []string{"name", "acme"}, "DEFAULT"},
		{"no rule", "quota", []string{"other", "x"}, "DEFAULT"},
		{"unknown domain", "nowhere", []string{"name", "bigcorp"}, "DEFAULT"},
		{"unlimited", "quota", []string{"unlimited", "x"}, "ALLOW_ALL"},
		{"limit 0", "quota", []string{"closed", "x"}, "DENY_ALL"},
		{"shadow mode never refuses", "quota", []string{"shadow", "x"}, "ALLOW_ALL"},
	}
	for _, def := range []*typev3.RateLimitStrategy{nil, {Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}} {
		f := start(t, rlqs.Options{Default: def, Headroom: wholeShare})
		wantDefault := "ALLOW_ALL"
		if def != nil {
			wantDefault = "DENY_ALL"
		}
		for _, c := range cases {
			t.Run(wantDefault+"/"+c.name, func(t *testing.T) {
				st := f.rawStream(t)
				resp, err := exchange(t, st, c.domain, usage(1, 0, c.bucket...))
				if err != nil {
					t.Fatal(err)
				}
				if len(resp.BucketAction) != 1 {
					t.Fatalf("%d actions, want 1: %v", len(resp.BucketAction), resp)
				}
				a := resp.BucketAction[0]
				want := c.want
				if want == "DEFAULT" {
					want = wantDefault
				}
				if got := describe(a.GetQuotaAssignmentAction().GetRateLimitStrategy()); got != want {
					t.Errorf("strategy %s, want %s", got, want)
				}
				if ttl := a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration(); ttl != 2*rlqs.DefaultReportingInterval {
					t.Errorf("ttl %v, want %v (twice Envoy's 5 s until the reports tell)", ttl, 2*rlqs.DefaultReportingInterval)
				}
				if len(a.GetBucketId().GetBucket()) != len(c.bucket)/2 {
					t.Errorf("bucket id %v not echoed", a.GetBucketId())
				}
				st.CloseSend()
			})
		}
	}
}

func TestBadInput(t *testing.T) {
	f := start(t, rlqs.Options{MaxBuckets: 2})
	many := make([]string, 0, 34)
	for i := range 17 {
		many = append(many, "k"+itoa(uint64(i)), "v")
	}
	cases := []struct {
		name    string
		reports [][]*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
		domains []string
		code    codes.Code
		msg     string
	}{
		{"no domain", [][]*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{usage(1, 0, "name", "acme")}}, []string{""}, codes.InvalidArgument, "must name its domain"},
		{"empty bucket id", [][]*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{usage(1, 0)}}, []string{"quota"}, codes.InvalidArgument, "bucket_id is empty"},
		{"nil bucket id", [][]*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{{NumRequestsAllowed: 1}}}, []string{"quota"}, codes.InvalidArgument, "bucket_id is empty"},
		{"too many entries", [][]*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{usage(1, 0, many...)}}, []string{"quota"}, codes.InvalidArgument, "at most 16"},
		{"too many buckets", [][]*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{usage(1, 0, "a", "1"), usage(1, 0, "a", "2"), usage(1, 0, "a", "3")}}, []string{"quota"}, codes.InvalidArgument, "report of 3 buckets: at most 2"},
		{"bucket repeated", [][]*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{usage(1, 0, "a", "1", "b", "2"), usage(1, 0, "b", "2", "a", "1")}}, []string{"quota"}, codes.InvalidArgument, "repeats bucket_quota_usages[0]"},
		{"domain changed", [][]*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{usage(1, 0, "a", "1")}, {usage(1, 0, "a", "1")}}, []string{"quota", "other"}, codes.InvalidArgument, "keeps the domain of its first report"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := f.rawStream(t)
			var err error
			for i, r := range c.reports {
				if _, err = exchange(t, st, c.domains[i], r...); err != nil {
					break
				}
			}
			if status.Code(err) != c.code || !strings.Contains(status.Convert(err).Message(), c.msg) {
				t.Fatalf("error %v, want %v containing %q", err, c.code, c.msg)
			}
		})
	}
	// The same domain repeated, or left out after the first report, is fine.
	st := f.rawStream(t)
	for _, d := range []string{"quota", "quota", ""} {
		if _, err := exchange(t, st, d, usage(1, 0, "a", "1")); err != nil {
			t.Fatalf("domain %q: %v", d, err)
		}
	}
}

func TestStreamBucketBound(t *testing.T) {
	f := start(t, rlqs.Options{MaxBuckets: 2, MaxStreamBuckets: 3})
	st := f.rawStream(t)
	if _, err := exchange(t, st, "quota", usage(1, 0, "a", "1"), usage(1, 0, "a", "2")); err != nil {
		t.Fatal(err)
	}
	_, err := exchange(t, st, "", usage(1, 0, "a", "3"), usage(1, 0, "a", "4"))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("error %v, want ResourceExhausted", err)
	}
}

func TestAbandonAfterMissedReports(t *testing.T) {
	f := start(t, rlqs.Options{})
	st := f.rawStream(t)
	acme := []string{"name", "acme", "route", "/"}
	resp, err := exchange(t, st, "quota", usage(1, 0, acme...), usage(1, 0, "name", "bigcorp"))
	if err != nil || len(resp.BucketAction) != 2 {
		t.Fatal(resp, err)
	}
	// bigcorp is no longer reported: after 3 intervals it is abandoned, once.
	for i := 1; i <= 5; i++ {
		f.clock.Advance(time.Second)
		resp, err := exchange(t, st, "", usage(1, 0, acme...))
		if err != nil {
			t.Fatal(err)
		}
		var abandoned []string
		for _, a := range resp.BucketAction {
			if a.GetAbandonAction() != nil {
				abandoned = append(abandoned, a.GetBucketId().GetBucket()["name"])
			}
		}
		want := 0
		if i == 4 {
			want = 1
		}
		if len(abandoned) != want || (want == 1 && abandoned[0] != "bigcorp") {
			t.Errorf("after %ds: abandoned %v, want %d (bigcorp at 4s)", i, abandoned, want)
		}
	}
}

// sim opens a simulated Envoy driven by the fixture's clock, with
// no_assignment_behavior DENY_ALL.
func (f *fixture) sim(t *testing.T) *rlqssim.Client {
	t.Helper()
	return f.simWith(t, rlqssim.WithNoAssignment(false))
}

// simWith opens a simulated Envoy driven by the fixture's clock, reporting
// when the test says, with more options; quiet knows its server.
func (f *fixture) simWith(t *testing.T, opts ...rlqssim.Option) *rlqssim.Client {
	t.Helper()
	c, err := rlqssim.New(f.conn, "quota", append([]rlqssim.Option{rlqssim.WithClock(f.clock.Now), rlqssim.WithManualReports()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	serverOf.Store(c, f.srv)
	t.Cleanup(func() {
		c.Close()
		serverOf.Delete(c)
	})
	return c
}

// serverOf maps each simulated Envoy that simWith opened to its server.
var serverOf sync.Map // *rlqssim.Client → *rlqs.Server

var acmeBucket = map[string]string{"name": "acme", "route": "/pay"} // 100 per second

// share is the rate, in requests per second, of the token bucket client c
// applies to acme: 0 when it has none, or DENY_ALL.
func share(c *rlqssim.Client) float64 { return rate(c.Assignment(acmeBucket)) }

// bound is the most the clients may admit over seconds of a limit of
// limit requests per second (docs/rlqs.md, the bound): the limit's rate
// over the time, plus what their token buckets started with (each new or
// replaced bucket starts full, or as full as the one it replaced), plus
// what they admitted with no assignment in force
// (no_assignment_behavior, expired_assignment_behavior).
func bound(limit, seconds float64, clients ...*rlqssim.Client) float64 {
	b := limit * seconds
	for _, c := range clients {
		st := c.Stats()
		b += st.StartTokens + float64(st.Unassigned)
	}
	return b
}

// overLimit reports whether shares summing to sum exceed limit requests
// per second (shares are tenths: 100/s is 1,000 units per 10 s).
func overLimit(sum, limit float64) bool { return sum > limit+1e-9 }

// settled returns what the clients are assigned once the pushes the
// servers sent them have arrived (quiet): a push follows the answer of
// the report whose store call moved the shares, a moment after the
// answer. (Until a push arrives, a client may apply a larger share the
// server replaced already: the delivery delay of docs/rlqs.md's bound.)
func settled(t *testing.T, clients ...*rlqssim.Client) (shares []float64, sum float64) {
	t.Helper()
	quiet(t, clients...)
	shares = make([]float64, len(clients))
	for i, c := range clients {
		shares[i] = share(c)
		sum += shares[i]
	}
	return shares, sum
}

// drive runs one reporting interval of one second of simulated time in
// 10 ms steps, each client offering rates[i] requests per second, then has
// every client report. It returns the requests admitted per client.
func drive(t *testing.T, f *fixture, clients []*rlqssim.Client, rates []float64) []int {
	t.Helper()
	return driveFor(t, f, time.Second, clients, rates)
}

// driveFor is drive over an interval of d, a multiple of 10 ms. After
// the request that makes a bucket it waits for the answer to the report
// the new bucket sent, and what it caused (a real Envoy would go on
// deciding meanwhile, by no_assignment_behavior, for as long as the
// answer takes: waiting makes the tests repeatable).
func driveFor(t *testing.T, f *fixture, d time.Duration, clients []*rlqssim.Client, rates []float64) []int {
	t.Helper()
	admitted := make([]int, len(clients))
	owed := make([]float64, len(clients))
	for range d / (10 * time.Millisecond) {
		f.clock.Advance(10 * time.Millisecond)
		// What a timer pushed arrives before the next request, not at
		// whatever step the machine's scheduling delivers it.
		quiet(t, clients...)
		for i, c := range clients {
			owed[i] += rates[i] / 100
			for ; owed[i] >= 1; owed[i]-- {
				reports := c.Stats().Reports
				if c.Allow(acmeBucket) {
					admitted[i]++
				}
				if c.Stats().Reports != reports {
					quiet(t, clients...) // a new bucket's report: its answer before the next request
				}
			}
		}
	}
	for _, c := range clients {
		quiet(t, clients...)
		if err := c.Report(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	quiet(t, clients...)
	return admitted
}

// quiet waits until the servers of the clients have taken every report
// the clients sent, have finished with them and with the pushes they
// caused, and the clients have received every response the servers sent
// them: answers and pushes have all arrived. A client cannot tell an
// answer from a push (both carry assignments), so a report sent while a
// push is on its way could take the push for its answer and let the test
// advance the clock before the server has the report; then the server
// measures the interval too long. The clients must hold every stream
// open on their servers (simWith's; closeSim closes one), and nothing
// else may report, move the clock or end a stream meanwhile. It waits on
// the servers' counts (Server.Quiescence), not on a spell of silence,
// which a busy machine can fake; 10 s at most, then the test fails.
func quiet(t *testing.T, clients ...*rlqssim.Client) {
	t.Helper()
	var servers []*rlqs.Server
	for _, c := range clients {
		s, ok := serverOf.Load(c)
		if !ok {
			t.Fatal("quiet: a client not opened by fixture.simWith")
		}
		if !slices.Contains(servers, s.(*rlqs.Server)) {
			servers = append(servers, s.(*rlqs.Server))
		}
	}
	// A client holds one stream, from its first bucket on (rlqssim), and
	// each open stream of the servers is one of theirs: the sums below
	// then match stream by stream, since a server takes no more reports
	// than its client sent, and a client receives no more responses than
	// its server sent.
	var opened int
	var reports, responses uint64
	count := func() {
		opened, reports, responses = 0, 0, 0
		for _, c := range clients {
			st := c.Stats()
			if err := c.Err(); err != nil || st.Streams > 1 {
				t.Fatalf("quiet: a client's stream ended (%d opened): %v", st.Streams, err)
			}
			opened += int(st.Streams)
			reports += st.Reports
			responses += st.Responses
		}
	}
	var streams int
	var received, sent uint64
	var work int64
	read := func() {
		streams, received, work, sent = 0, 0, 0, 0
		for _, s := range servers {
			n, r, w, x := s.Quiescence()
			streams, received, work, sent = streams+n, received+r, work+w, sent+x
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	wait := func(done func() bool, what string) {
		t.Helper()
		for pause := time.Microsecond; !done(); pause = min(2*pause, time.Millisecond) {
			if time.Now().After(deadline) {
				var ops []string
				for _, s := range servers {
					st := s.Stats()
					ops = append(ops, fmt.Sprintf("%d rebalance pushes, store %+v", st.Rebalances, st.Budget))
				}
				t.Fatalf("quiet: after 10 s, %s: the clients opened %d streams, sent %d reports and received %d responses; their servers have %d streams open, took %d reports, sent %d responses and have %d pieces of work on hand (%v)\n%s",
					what, opened, reports, responses, streams, received, sent, work, ops, stacks())
			}
			time.Sleep(pause)
		}
	}
	count()
	// Every stream open and every report taken, then nothing on hand: no
	// response is on its way but those sent (Server.work).
	wait(func() bool { read(); return streams == opened && received == reports && work == 0 }, "the servers still work")
	wait(func() bool { count(); return responses >= sent }, "responses are on their way")
	if responses != sent {
		t.Fatalf("quiet: the clients received %d responses, their servers sent %d: a stream of these servers is not among the clients", responses, sent)
	}
}

// closeSim closes simulated Envoy c and waits, 10 s at most, until its
// server has let its stream go (Server.Streams), so that quiet counts the
// streams of the clients left.
func closeSim(t *testing.T, c *rlqssim.Client) {
	t.Helper()
	s, ok := serverOf.Load(c)
	if !ok {
		t.Fatal("closeSim: a client not opened by fixture.simWith")
	}
	srv := s.(*rlqs.Server)
	open := c.Stats().Streams > 0 && c.Err() == nil
	before := srv.Streams()
	c.Close()
	for deadline := time.Now().Add(10 * time.Second); open && srv.Streams() >= before; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("closeSim: the server still has %d streams 10 s after a client closed its own", srv.Streams())
		}
	}
}

func TestSharesFollowDemand(t *testing.T) {
	f := start(t, rlqs.Options{})
	a, b := f.sim(t), f.sim(t)
	clients := []*rlqssim.Client{a, b}
	check := func(round int) {
		if sa, sb := share(a), share(b); overLimit(sa+sb, 100) {
			t.Fatalf("round %d: shares %v + %v exceed the limit 100", round, sa, sb)
		}
	}
	for round := range 6 {
		drive(t, f, clients, []float64{160, 40})
		check(round)
	}
	if sa, sb := share(a), share(b); sa < 3*sb || sa+sb < 95 {
		t.Fatalf("demand 160:40 got shares %v:%v, want about 4:1 summing to about 100", sa, sb)
	}
	for round := range 6 {
		drive(t, f, clients, []float64{40, 160})
		check(round)
	}
	if sa, sb := share(a), share(b); sb < 3*sa || sa+sb < 95 {
		t.Fatalf("demand 40:160 got shares %v:%v, want about 1:4 summing to about 100", sa, sb)
	}
	// Idle: the floor keeps a share for the idle stream, the rest goes to
	// the busy one.
	for range 6 {
		drive(t, f, clients, []float64{0, 160})
	}
	if sa, sb := share(a), share(b); sa != 5 || sb < 94 {
		t.Fatalf("demand 0:160 got shares %v:%v, want 5:94 or 5:95 (the floor, 10%% split evenly; the rest to demand)", sa, sb)
	}
}

func TestDisconnectReassignedWithinTwoIntervals(t *testing.T) {
	f := start(t, rlqs.Options{})
	a, b := f.sim(t), f.sim(t)
	for range 3 {
		drive(t, f, []*rlqssim.Client{a, b}, []float64{100, 100})
	}
	if sa := share(a); sa < 45 || sa > 55 {
		t.Fatalf("equal demand: share %v, want about 50", sa)
	}
	b.Close()
	deadline := time.Now().Add(5 * time.Second)
	for f.srv.Streams() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the server did not see the stream end")
		}
		time.Sleep(time.Millisecond)
	}
	for i := 1; i <= 2; i++ {
		drive(t, f, []*rlqssim.Client{a}, []float64{100})
		if share(a) == 100 {
			return
		}
	}
	t.Fatalf("two intervals after the other stream ended: share %v, want 100", share(a))
}

// TestAdmittedWithinLimit runs three simulated Envoys reporting every 5 s,
// as Envoy does, for 60 simulated seconds with demand that shifts, and
// sums what they admit: at most the bound (the limit's rate over the time,
// plus what their token buckets started with), whichever way Envoy fills
// a replacing bucket, and most of the limit. Buckets are made when demand
// moves, not at every report: shares that hold are not sent anew, and
// shares that wobble with demand are kept (the hysteresis).
//
// Broken build it was shown failing against: keeps() in share.go
// returning false (no hysteresis): the 1% wobble of demand then moves the
// shares of Envoys 0 and 1 at most of their reports, and the Envoys make
// 29 buckets (over the cap of 24) starting with 1,041 tokens (over 800).
// Without the wobble that build made 18 buckets and passed.
func TestAdmittedWithinLimit(t *testing.T) {
	// quoted is what docs/rlqs.md (the bound, "Measured") quotes of each
	// run: admitted, the bound, the tokens the buckets made started with,
	// the buckets, and the requests admitted unassigned. The run is
	// deterministic (one fake clock, no budget store, so no push races
	// a report), so the numbers are checked exactly: a change that moves
	// them updates the doc with them. Shown failing against a build whose
	// targetOf gives a new bucket the floor, not an even share (c6930c1
	// undone), which passes every other check here: 5,598 and 5,122
	// admitted, 17 buckets.
	type quoted struct {
		admitted, bound, tokens int
		buckets, unassigned     uint64
	}
	for _, mode := range []struct {
		name string
		r    rlqssim.Replacement
		doc  quoted
	}{
		{"replaced buckets start full (Envoy 0b559611)", rlqssim.ReplaceFull, quoted{6108, 6634, 631, 16, 3}},
		{"replaced buckets keep their fraction (Envoy c33e7f82)", rlqssim.ReplaceFraction, quoted{5631, 6153, 150, 16, 3}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			f := start(t, rlqs.Options{})
			clients := make([]*rlqssim.Client, 3)
			for i := range clients {
				clients[i] = f.simWith(t, rlqssim.WithReplacement(mode.r))
			}
			const seconds, limit = 60, 100
			total := 0
			for s := 0; s < seconds; s += 5 {
				rates := []float64{150, 50, 0}
				if (s/15)%2 == 1 {
					rates[2] = 200
				}
				// Demand is never flat: each Envoy's moves by 1% from
				// one report to the next (-1%, 0, +1%, in turn).
				for i := range rates {
					rates[i] *= 1 + 0.01*float64((s/5+i)%3-1)
				}
				for _, n := range driveFor(t, f, 5*time.Second, clients, rates) {
					total += n
				}
				var sum float64
				for _, c := range clients {
					sum += share(c)
				}
				if overLimit(sum, limit) {
					t.Fatalf("second %d: assignments sum to %v, over the limit %d", s, sum, limit)
				}
			}
			b := bound(limit, seconds, clients...)
			if float64(total) > b {
				t.Fatalf("admitted %d in %ds, over the bound %.0f", total, seconds, b)
			}
			if total < limit*seconds*8/10 {
				t.Fatalf("admitted %d in %ds: less than 80%% of the limit while demand exceeds it", total, seconds)
			}
			var burst float64
			var buckets, unassigned uint64
			for _, c := range clients {
				burst += c.Stats().StartTokens
				buckets += c.Stats().TokenBuckets
				unassigned += c.Stats().Unassigned
			}
			// Each bucket made starts with at most 1 s (-rlqs-burst) of its
			// rate: the buckets of one moment hold at most 1 s of the
			// limit. The start and each of the 3 shifts of demand may make
			// every Envoy a bucket, twice (reports come one after another,
			// the first on the others' old demand): 24 buckets, 800
			// tokens. The wobble is no shift: the hysteresis keeps the
			// shares it moves by well under a thirty-second (the real
			// build makes 16 buckets, with 631 tokens). Without it, Envoys
			// 0 and 1, whose shares follow their part of the demand, make
			// a bucket at most of their 12 reports, and Envoy 2 at most of
			// its 9 (it has demand from second 15): 29 buckets. A bucket
			// made at every report, the immediate ones included, would be
			// 36.
			if most := 2 * (1 + 3) * limit; burst > float64(most) || buckets > 2*(1+3)*uint64(len(clients)) {
				t.Errorf("the token buckets started with %.0f tokens in all (%d buckets): over %d (24 buckets): shares are sent anew more often than demand moves", burst, buckets, most)
			}
			// The bound counts what Envoy admits unassigned: a server that
			// assigned nothing would meet it. Only each bucket's requests
			// before its first answer go unassigned, and at the end every
			// Envoy has demand, and a share.
			if unassigned > limit {
				t.Errorf("%d requests admitted unassigned: over a second of the limit, %d; the buckets were not assigned", unassigned, limit)
			}
			for i, c := range clients {
				if share(c) == 0 {
					t.Errorf("Envoy %d, with demand, holds no share at the end", i)
				}
			}
			t.Logf("admitted %d in %d s (limit %d/s, bound %.0f: %d·%d + %.0f tokens the %d buckets started with + %d unassigned)",
				total, seconds, limit, b, limit, seconds, burst, buckets, unassigned)
			if got := (quoted{total, int(math.Round(b)), int(math.Round(burst)), buckets, unassigned}); got != mode.doc {
				t.Errorf("admitted, bound, tokens, buckets, unassigned: %v, docs/rlqs.md quotes %v: update the doc (the bound, Measured) and this test together", got, mode.doc)
			}
		})
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	if _, err := rlqs.New(rlqs.Options{}); err == nil {
		t.Error("no Rules: no error")
	}
	rules := func() *config.Rules { return nil }
	if _, err := rlqs.New(rlqs.Options{Rules: rules, FloorFraction: 2}); err == nil {
		t.Error("FloorFraction 2: no error")
	}
	if _, err := rlqs.New(rlqs.Options{Rules: rules, Smoothing: -1}); err == nil {
		t.Error("Smoothing -1: no error")
	}
}

func TestCloseEndsStreams(t *testing.T) {
	f := start(t, rlqs.Options{})
	c := f.sim(t)
	drive(t, f, []*rlqssim.Client{c}, []float64{10})
	if f.srv.Streams() != 1 {
		t.Fatalf("%d streams open, want 1", f.srv.Streams())
	}
	f.srv.Close()
	deadline := time.Now().Add(5 * time.Second)
	for c.Err() == nil {
		if time.Now().After(deadline) {
			t.Fatal("the stream did not end after Close")
		}
		time.Sleep(time.Millisecond)
	}
	if status.Code(c.Err()) != codes.Unavailable {
		t.Fatalf("stream ended with %v, want Unavailable", c.Err())
	}
	// The simulated Envoy keeps its assignment until the TTL.
	if c.Assignment(acmeBucket) == nil {
		t.Fatal("assignment dropped when the stream ended, before its TTL")
	}
	st := f.rawStream(t)
	if _, err := exchange(t, st, "quota", usage(1, 0, "a", "1")); status.Code(err) != codes.Unavailable {
		t.Fatalf("new stream after Close: %v, want Unavailable", err)
	}
	if f.srv.Pools() != 0 || f.srv.Streams() != 0 {
		t.Fatalf("after Close: %d pools, %d streams", f.srv.Pools(), f.srv.Streams())
	}
}

// TestNewBucketGetsEvenShare: a bucket's first report, which Envoy sends as
// it creates the bucket (time_elapsed 0, one request), tells no rate: the
// stream is assigned an even share (alone: the whole limit), not the floor
// that a measured demand of one request would give. Its next report's rate
// then decides, the headroom cap included.
func TestNewBucketGetsEvenShare(t *testing.T) {
	f := start(t, rlqs.Options{})
	st := f.rawStream(t)
	first := usage(1, 0, "name", "acme", "route", "/pay")
	first.TimeElapsed = durationpb.New(0)
	resp, err := exchange(t, st, "quota", first)
	if err != nil {
		t.Fatal(err)
	}
	if got := describe(resp.BucketAction[0].GetQuotaAssignmentAction().GetRateLimitStrategy()); got != "1000/10s max 100" {
		t.Fatalf("a new bucket's first report: assigned %s, want the whole limit, 1000/10s max 100 (not the floor, 100/10s)", got)
	}
	f.clock.Advance(time.Second)
	resp, err = exchange(t, st, "", usage(5, 0, "name", "acme", "route", "/pay"))
	if err != nil {
		t.Fatal(err)
	}
	if got := describe(resp.BucketAction[0].GetQuotaAssignmentAction().GetRateLimitStrategy()); got != "100/10s max 10" {
		t.Fatalf("5 requests a second reported: assigned %s, want twice the demand, the floor (100/10s max 10)", got)
	}
}
