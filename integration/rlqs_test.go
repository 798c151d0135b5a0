package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/rlqssim"
)

// TestRLQSReplicasShareOneLimit runs two ratelimitd processes on one real
// Redis and four simulated Envoys, two on each, that behave as Envoy's
// rate_limit_quota filter does (internal/rlqssim: token buckets, reports
// every 5 s whatever the config says, whole-second TTLs), on one bucket of
// a 100-per-second rule:
//
//   - each offering 50 requests per second (twice its fair share), over
//     60 s the Envoys of both replicas admit at most the bound of
//     docs/rlqs.md: the limit's rate over the time (and a network delay),
//     plus what their token buckets held at the start or started with
//     when assigned anew, plus what they admitted with no assignment;
//   - when demand shifts to 90, 10, 90, 10 per second, the shares follow
//     it across the replicas within 3 report periods, never summing over
//     the limit;
//   - when one Envoy disconnects, the other three hold its share within 3
//     report periods;
//   - bad input on a stream of its own is answered cleanly, and the other
//     streams go on: each Envoy's next report is answered after it;
//   - no Envoy that keeps reporting sees its assignment expire;
//   - when one replica stops gracefully, the other's Envoys hold the whole
//     limit within 3 report periods: nothing stays stranded.
func TestRLQSReplicasShareOneLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 2 minutes")
	}
	const limit, seconds = 100, 60
	period := rlqssim.EnvoyReportingInterval
	dir := t.TempDir()
	rules := "domain: quota\ndescriptors:\n  - key: tenant\n    rate_limit: {requests_per_unit: 100, unit: second}\n"
	if err := os.WriteFile(filepath.Join(dir, "quota.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	rs := redistest.Start(t)
	args := redisArgs(t, rs.URL, "standalone", "-config", dir)
	replicas := []*server{startServer(t, args...), startServer(t, args...)}

	bucket := map[string]string{"tenant": "acme"}
	var clients []*rlqssim.Client
	for i := range 4 {
		c, err := rlqssim.New(replicas[i/2].dial(t), "quota", rlqssim.WithNoAssignment(false))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		clients = append(clients, c)
	}
	// share is the rate of the token bucket a client applies, as Envoy
	// computes it: tokens_per_fill over fill_interval's whole seconds.
	share := func(c *rlqssim.Client) float64 {
		tb := c.Assignment(bucket).GetTokenBucket()
		if tb == nil {
			return 0
		}
		return float64(tb.GetTokensPerFill().GetValue()) / float64(tb.GetFillInterval().GetSeconds())
	}
	shares := func(cs ...*rlqssim.Client) (s []float64, sum float64) {
		for _, c := range cs {
			s = append(s, share(c))
			sum += s[len(s)-1]
		}
		return s, sum
	}
	const eps = 1e-9 // shares are tenths of a request per second

	// Each client offers rates[i] requests per second, in steps of about
	// 10 ms. What it owes follows the time passed, not the ticks: a
	// ticker drops the ticks of a busy machine, which made the demand
	// each client reported wobble by more than the hysteresis keeps
	// shares through, and every wobble a new token bucket.
	var rates [4]atomic.Int64
	var admitted, offered atomic.Int64
	var counting atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// drive has client i offer its rate until stop, or leave closes (nil:
	// never).
	drive := func(i int, leave <-chan struct{}) {
		wg.Go(func() {
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			owed, last := 0.0, time.Now()
			for {
				var now time.Time
				select {
				case <-stop:
					return
				case <-leave:
					return
				case now = <-tick.C:
				}
				owed += float64(rates[i].Load()) * now.Sub(last).Seconds()
				last = now
				for ; owed >= 1; owed-- {
					ok := clients[i].Allow(bucket)
					if counting.Load() {
						offered.Add(1)
						if ok {
							admitted.Add(1)
						}
					}
				}
			}
		})
	}
	for i := range rates {
		rates[i].Store(50)
	}
	for i := range 3 {
		drive(i, nil)
	}
	// The fourth is driven apart, so that it can leave on its own.
	leave := make(chan struct{})
	drive(3, leave)
	defer func() { close(stop); wg.Wait() }()

	// Two report periods to settle, then count for 60 s. What a client
	// may admit beyond the rates is what its token bucket holds when
	// counting starts (at most its max_tokens), what the buckets made
	// since started with, and what it admitted with no assignment.
	time.Sleep(2 * period)
	before := make([]rlqssim.Stats, len(clients))
	var held float64
	for i, c := range clients {
		before[i] = c.Stats()
		held += float64(c.Assignment(bucket).GetTokenBucket().GetMaxTokens())
	}
	counting.Store(true)
	began := time.Now()
	maxSum := 0.0
	for time.Since(began) < seconds*time.Second {
		time.Sleep(100 * time.Millisecond)
		_, sum := shares(clients...)
		maxSum = max(maxSum, sum)
	}
	counting.Store(false)
	took := time.Since(began)
	var starts, unassigned float64
	for i, c := range clients {
		st := c.Stats()
		starts += st.StartTokens - before[i].StartTokens
		unassigned += float64(st.Unassigned - before[i].Unassigned)
	}
	// A share lowered reaches its Envoy a network delay after the server
	// counts it lowered: 100 ms of the limit covers that on loopback.
	const delay = 100 * time.Millisecond
	n := admitted.Load()
	bound := limit*(took+delay).Seconds() + held + starts + unassigned
	s, _ := shares(clients...)
	t.Logf("2 replicas, 4 Envoys offering %d in %v: admitted %d; bound %.0f = %d/s × (%v + %v) + %.0f tokens held at the start + %.0f the %d new buckets started with + %.0f unassigned; assignments summed at most %.1f/s; shares %v",
		offered.Load(), took.Round(time.Millisecond), n, bound, limit, took.Round(time.Millisecond), delay, held, starts, newBuckets(clients, before), unassigned, maxSum, s)
	if float64(n) > bound {
		t.Errorf("admitted %d in %v across replicas, over the bound %.0f", n, took, bound)
	}
	if maxSum > limit+eps {
		t.Errorf("the assignments in force summed to %.1f/s, over the limit %d", maxSum, limit)
	}
	if n < limit*seconds*8/10 {
		t.Errorf("admitted %d in %d s: under 80%% of the limit while demand is twice it", n, seconds)
	}
	if extra := held + starts; extra > limit*seconds/10 {
		t.Errorf("the token buckets held or started with %.0f tokens in %d s: over a tenth of the limit's %d (shares that hold are sent unchanged)", extra, seconds, limit*seconds)
	}

	// Demand shifts: one Envoy of each replica offers 90 per second, the
	// other 10. Within 3 report periods the shares follow, about 43, 7,
	// 43, 7, and they never sum over the limit.
	for i, r := range []int64{90, 10, 90, 10} {
		rates[i].Store(r)
	}
	shifted := time.Now()
	var followed time.Duration
	for time.Since(shifted) < 3*period+period/2 {
		time.Sleep(100 * time.Millisecond)
		s, sum := shares(clients...)
		if sum > limit+eps {
			t.Errorf("%v after demand shifted: shares %v sum to %.1f, over %d", time.Since(shifted).Round(time.Millisecond), s, sum, limit)
		}
		// About 43, 7, 43, 7 (a tenth of the limit split evenly, the rest
		// by demand): each busy Envoy within a fifth of 43, each quiet one
		// at most 12, and the limit nearly all assigned.
		if s[0] >= 35 && s[2] >= 35 && s[1] > 0 && s[1] <= 12 && s[3] > 0 && s[3] <= 12 && sum >= limit*9/10 {
			followed = time.Since(shifted)
			break
		}
	}
	if followed == 0 || followed > 3*period+period/2 {
		s, _ := shares(clients...)
		t.Fatalf("3 report periods after demand shifted to 90, 10, 90, 10: shares %v, want about 43, 7, 43, 7\n%s", s, explainRLQS(t, replicas, bucket))
	}
	s, _ = shares(clients...)
	t.Logf("demand 90, 10, 90, 10 across the replicas: shares %v, followed within %v (%.1f report periods)", s, followed.Round(time.Millisecond), followed.Seconds()/period.Seconds())

	// One Envoy of replica 2 disconnects: within 3 report periods the
	// other three hold its share (the limit less what rounding leaves).
	close(leave)
	clients[3].Close()
	left := time.Now()
	var sum float64
	for time.Since(left) < 3*period+period/2 {
		if _, sum = shares(clients[:3]...); sum >= limit*95/100 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if sum < limit*95/100 {
		t.Fatalf("3 report periods after one Envoy left, the other three hold %.1f of %d (shares %v)\n%s", sum, limit, s2(shares(clients[:3]...)), explainRLQS(t, replicas, bucket))
	}
	t.Logf("%v after one Envoy left, the other three hold %.1f of %d", time.Since(left).Round(time.Millisecond), sum, limit)

	// Bad input, each on a stream of its own to replica 1.
	conn := replicas[0].dial(t)
	report := func(r *rlqsv3.RateLimitQuotaUsageReports) (*rlqsv3.RateLimitQuotaResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
		if err != nil {
			return nil, err
		}
		if err := st.Send(r); err != nil {
			return nil, err
		}
		return st.Recv()
	}
	usage := func(id map[string]string) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
		return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: id}, NumRequestsAllowed: 1}
	}
	answered := make([]uint64, 3)
	for i, c := range clients[:3] {
		answered[i] = c.Stats().Responses
	}
	resp, err := report(&rlqsv3.RateLimitQuotaUsageReports{Domain: "no-such-domain", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(bucket)}})
	if err != nil || resp.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule().String() != "ALLOW_ALL" {
		t.Errorf("an unknown domain: %v, %v; want the default assignment, ALLOW_ALL", resp, err)
	}
	huge := &rlqsv3.RateLimitQuotaUsageReports{Domain: "quota"}
	for i := range 1001 {
		huge.BucketQuotaUsages = append(huge.BucketQuotaUsages, usage(map[string]string{"tenant": fmt.Sprint(i)}))
	}
	for _, c := range []struct {
		name   string
		report *rlqsv3.RateLimitQuotaUsageReports
	}{
		{"an empty bucket id", &rlqsv3.RateLimitQuotaUsageReports{Domain: "quota", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(nil)}}},
		{"a report of 1,001 buckets", huge},
		{"no domain", &rlqsv3.RateLimitQuotaUsageReports{BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(bucket)}}},
	} {
		if _, err := report(c.report); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", c.name, err)
		} else {
			t.Logf("%s: %v", c.name, status.Convert(err).Message())
		}
	}
	// The other streams go on: each Envoy's next report, sent after the
	// bad input, is answered on the stream it had (an assignment still in
	// force would not show a stream that broke).
	deadline := time.Now().Add(period + period/2)
	for i, c := range clients[:3] {
		for c.Stats().Responses == answered[i] && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if st := c.Stats(); st.Responses == answered[i] || st.Streams != 1 || c.Err() != nil {
			t.Errorf("after the bad input, Envoy %d: %d responses (%d before), %d streams opened, error %v; want its next report answered on its stream", i, st.Responses, answered[i], st.Streams, c.Err())
		}
	}

	// No Envoy that kept reporting saw its assignment expire: each answer
	// came within the TTL of the one before.
	for i, c := range clients {
		if st := c.Stats(); st.Expired != 0 {
			t.Errorf("Envoy %d, reporting every %v: %d assignments expired; want none", i, period, st.Expired)
		}
	}

	// Replica 2 stops gracefully (SIGTERM): it ends its stream and gives
	// its lease back, so within 3 report periods the Envoys of replica 1
	// hold the whole limit. Budget it stranded would stay counted until
	// its lease ended.
	if code := replicas[1].stop(t); code != 0 {
		t.Fatalf("replica 2 exited %d after SIGTERM, want 0", code)
	}
	stopped := time.Now()
	for sum = 0; time.Since(stopped) < 3*period+period/2; time.Sleep(50 * time.Millisecond) {
		if _, sum = shares(clients[:2]...); sum >= limit*95/100 {
			break
		}
	}
	if sum < limit*95/100 {
		t.Fatalf("3 report periods after replica 2 stopped, replica 1's Envoys hold %.1f of %d: its budget was not given back (shares %v)\n%s", sum, limit, s2(shares(clients[:2]...)), explainRLQS(t, replicas[:1], bucket))
	}
	t.Logf("%v after replica 2 stopped, replica 1's two Envoys hold %.1f of %d", time.Since(stopped).Round(time.Millisecond), sum, limit)
}

// s2 is the shares of shares(), for a message.
func s2(s []float64, _ float64) []float64 { return s }

// explainRLQS is what POST /explain/rlqs of each replica says of bucket,
// for a failure's message.
func explainRLQS(t *testing.T, replicas []*server, bucket map[string]string) string {
	var b strings.Builder
	body, _ := json.Marshal(map[string]any{"domain": "quota", "bucketId": bucket})
	for i, r := range replicas {
		resp, err := http.Post("http://"+r.httpAddr+"/explain/rlqs", "application/json", bytes.NewReader(body))
		if err != nil {
			fmt.Fprintf(&b, "replica %d: %v\n", i+1, err)
			continue
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Fprintf(&b, "replica %d explains: %s\n", i+1, out)
	}
	return b.String()
}

// newBuckets counts the token buckets the clients made since before.
func newBuckets(clients []*rlqssim.Client, before []rlqssim.Stats) (n uint64) {
	for i, c := range clients {
		n += c.Stats().TokenBuckets - before[i].TokenBuckets
	}
	return n
}
