package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/rlqssim"
	"github.com/ratelimitd/ratelimitd/pkg/rlqs"
)

// reportAlice opens a simulated Envoy's stream to p in domain posts, has
// it count 20 requests of bucket {user_id: alice} and report them once.
func reportAlice(t *testing.T, p *inProcess) (*rlqssim.Client, map[string]string) {
	t.Helper()
	conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c, err := rlqssim.New(conn, "posts", rlqssim.WithManualReports())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	bucket := map[string]string{"user_id": "alice"}
	// Demand well over any limit of the tests, so that Alice is assigned
	// the whole limit, not twice her demand (rlqs.Options.Headroom).
	for range 20 {
		c.Allow(bucket)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	if err := c.Report(ctx); err != nil {
		t.Fatal(err)
	}
	return c, bucket
}

// TestServeRLQS: by default, a simulated Envoy gets its share of the rule
// its bucket matches on the gRPC port, and shutdown ends its stream rather
// than waiting out -shutdown-timeout for it.
func TestServeRLQS(t *testing.T) {
	p := startServe(t, true, "-config", "../../examples", "-shutdown-timeout", "20s")
	c, bucket := reportAlice(t, p)
	if got := perSecond(c.Assignment(bucket)); got != 2 {
		t.Fatalf("assignment %v, want a token bucket of 2 per second (posts_per_user, the only stream)", c.Assignment(bucket))
	}
	// Two reports: the bucket's, sent as soon as it was created (as
	// Envoy's), and the periodic one; each answered with a token bucket
	// of the limit's 1,000 units per 500 s.
	m := p.get(t, "/metrics")
	for _, want := range []string{
		"ratelimitd_rlqs_streams 1\n", "ratelimitd_rlqs_buckets 1\n", "ratelimitd_rlqs_reports_total 2\n",
		`ratelimitd_rlqs_assignments_total{kind="token_bucket"} 2` + "\n", `ratelimitd_rlqs_assignments_total{kind="abandon"} 0` + "\n",
		`ratelimitd_rlqs_rule_usage{domain="posts",rule="posts.user_id"} `,
		`ratelimitd_rlqs_budget_held{domain="posts",rule="posts.user_id"} 1000` + "\n",
		`ratelimitd_rlqs_assigned{domain="posts",rule="posts.user_id"} 1000` + "\n",
		`ratelimitd_rlqs_budget_operations_total{op="take"} `,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q:\n%s", want, grepLines(m, "ratelimitd_rlqs_"))
		}
	}
	// POST /explain/rlqs says which rule decides Alice's bucket and what
	// this replica holds for it.
	resp, err := http.Post("http://"+p.httpAddr+"/explain/rlqs", "application/json", strings.NewReader(`{"domain": "posts", "bucketId": {"user_id": "alice"}}`))
	if err != nil {
		t.Fatal(err)
	}
	var e rlqs.Explanation
	err = json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || e.Rule == nil || e.Rule.Name != "posts_per_user" || e.Replica == nil || e.Replica.Streams != 1 || e.Budget == nil || e.Budget.Held != 1000 {
		t.Errorf("explain alice: %d %+v (%v): want rule posts_per_user, one stream, 1,000 units held", resp.StatusCode, e, err)
	}
	start := time.Now()
	if code := p.stop(t); code != exitOK {
		t.Fatalf("exit %d after shutdown, want 0", code)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("shutdown took %v with an RLQS stream open: it waited for the stream", d)
	}
	// The client reads the stream's end a moment after serve returns.
	for deadline := time.Now().Add(5 * time.Second); c.Err() == nil && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if status.Code(c.Err()) != codes.Unavailable {
		t.Fatalf("stream ended with %v, want Unavailable", c.Err())
	}
}

// TestServeWithoutRLQS: -rlqs=false turns RLQS off.
func TestServeWithoutRLQS(t *testing.T) {
	p := startServe(t, true, "-config", "../../examples", "-rlqs=false")
	conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "posts"})
	if _, err := st.Recv(); status.Code(err) != codes.Unimplemented {
		t.Fatalf("with -rlqs=false: %v, want Unimplemented", err)
	}
}

// TestServeRLQSReloadPushes: with -rlqs, a rule file edit reaches an open
// stream's assignment without the simulated Envoy reporting again.
func TestServeRLQSReloadPushes(t *testing.T) {
	dir := t.TempDir()
	rules := func(n int) {
		t.Helper()
		yaml := fmt.Sprintf("domain: posts\ndescriptors:\n  - key: user_id\n    rate_limit: {name: posts_per_user, requests_per_unit: %d, unit: second}\n", n)
		if err := os.WriteFile(filepath.Join(dir, "posts.yaml"), []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rules(2)
	p := startServe(t, true, "-config", dir, "-rlqs", "-watch-config")
	c, bucket := reportAlice(t, p)
	if got := perSecond(c.Assignment(bucket)); got != 2 {
		t.Fatalf("assignment %v, want 2 per second", c.Assignment(bucket))
	}
	rules(7)
	deadline := time.Now().Add(20 * time.Second)
	for perSecond(c.Assignment(bucket)) != 7 {
		if time.Now().After(deadline) {
			t.Fatalf("20s after the rule file changed to 7/s: assignment %v, never pushed", c.Assignment(bucket))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// perSecond is the rate of a token bucket assignment as Envoy computes it:
// tokens_per_fill over the whole seconds of fill_interval; 0 for anything
// else.
func perSecond(s *typev3.RateLimitStrategy) float64 {
	tb := s.GetTokenBucket()
	if tb == nil {
		return 0
	}
	return float64(tb.GetTokensPerFill().GetValue()) / float64(tb.GetFillInterval().GetSeconds())
}

// grepLines returns the lines of s holding sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestServeRLQSFlags: the -rlqs-* flags reach the server: a bucket no rule
// names is denied, a stream reporting one request is assigned the whole
// limit (no headroom cap) with a burst of 3 s of it, and assignments live
// for the TTL given.
func TestServeRLQSFlags(t *testing.T) {
	p := startServe(t, true, "-config", "../../examples", "-rlqs-default", "deny", "-rlqs-headroom", "+Inf", "-rlqs-assignment-ttl", "7s", "-rlqs-burst", "3s")
	conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	usage := func(k, v string) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
		return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{k: v}}, NumRequestsAllowed: 1}
	}
	if err := st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "posts", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage("user_id", "alice"), usage("nobody", "x")}}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, a := range resp.GetBucketAction() {
		qa := a.GetQuotaAssignmentAction()
		if ttl := qa.GetAssignmentTimeToLive().AsDuration(); ttl != 7*time.Second {
			t.Errorf("bucket %v: TTL %v, want 7s (-rlqs-assignment-ttl)", a.GetBucketId().GetBucket(), ttl)
		}
		s := qa.GetRateLimitStrategy()
		desc := s.GetBlanketRule().String()
		if tb := s.GetTokenBucket(); tb != nil {
			desc = fmt.Sprintf("%d per %v max %d", tb.GetTokensPerFill().GetValue(), tb.GetFillInterval().AsDuration(), tb.GetMaxTokens())
		}
		got[fmt.Sprint(a.GetBucketId().GetBucket())] = desc
	}
	want := map[string]string{"map[user_id:alice]": "1000 per 8m20s max 6", "map[nobody:x]": "DENY_ALL"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("assignments %v, want %v (the whole limit of 2/s, 1,000 units per 500 s, for one request reported: -rlqs-headroom +Inf; 3 s of it at once: -rlqs-burst; DENY_ALL for no rule: -rlqs-default deny)", got, want)
	}
}
