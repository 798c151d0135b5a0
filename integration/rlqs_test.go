package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/rlqs/rlqssim"
)

// TestRLQSReplicasShareOneLimit runs two ratelimitd processes on one real
// Redis and four simulated Envoys, two on each, reporting every second
// to one bucket of a 100-per-second rule:
//
//   - each offering 50 requests per second (twice its fair share), over
//     30 s of real time the Envoys of both replicas admit at most
//     L·T/U + L (docs/rlqs.md, "Across replicas");
//   - when demand shifts to 90, 10, 90, 10 per second, the shares follow
//     it across the replicas, never summing over the limit;
//   - when one Envoy disconnects, the other three hold its share within
//     two intervals;
//   - bad input on a stream of its own (an unknown domain, an empty
//     bucket id, a report over the bound) is answered cleanly, and the
//     other streams go on;
//   - when one replica stops gracefully, the other's Envoys hold the
//     whole limit within two intervals: nothing stays stranded.
func TestRLQSReplicasShareOneLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 45 s")
	}
	const limit, interval, seconds = 100, time.Second, 30
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
		c, err := rlqssim.New(replicas[i/2].dial(t), "quota", interval, rlqssim.WithNoAssignment(false))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		clients = append(clients, c)
	}
	share := func(c *rlqssim.Client) uint64 {
		return c.Assignment(bucket).GetRequestsPerTimeUnit().GetRequestsPerTimeUnit()
	}
	shares := func() (s [4]uint64, sum uint64) {
		for i, c := range clients {
			s[i] = share(c)
			sum += s[i]
		}
		return s, sum
	}

	// Each client offers rates[i] requests per second, in steps of 10 ms.
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
			owed := 0.0
			for {
				select {
				case <-stop:
					return
				case <-leave:
					return
				case <-tick.C:
				}
				for owed += float64(rates[i].Load()) / 100; owed >= 1; owed-- {
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

	// Two intervals to settle, then count for 30 s.
	time.Sleep(2 * interval)
	counting.Store(true)
	began := time.Now()
	maxSum := uint64(0)
	for time.Since(began) < seconds*time.Second {
		time.Sleep(interval / 10)
		_, sum := shares()
		maxSum = max(maxSum, sum)
	}
	counting.Store(false)
	took := time.Since(began)
	n, bound := admitted.Load(), int64(limit*took.Seconds()+limit)
	s, _ := shares()
	t.Logf("2 replicas, 4 Envoys offering %d in %v: admitted %d (limit %d/s: L·T = %.0f, bound L·T + L = %d); assignments summed at most %d; shares %v",
		offered.Load(), took.Round(time.Millisecond), n, limit, limit*took.Seconds(), bound, maxSum, s)
	if n > bound {
		t.Errorf("admitted %d in %d s across replicas, over the bound %d", n, seconds, bound)
	}
	if maxSum > limit {
		t.Errorf("the assignments in force summed to %d, over the limit %d", maxSum, limit)
	}
	if n < limit*seconds*6/10 {
		t.Errorf("admitted %d in %d s: under 60%% of the limit while demand is twice it", n, seconds)
	}

	// Demand shifts: one Envoy of each replica offers 90 per second, the
	// other 10. The shares follow within a few intervals (demand is
	// smoothed over reports, and each replica sees the other's one report
	// late), about 46, 7, 46, 7, and never sum over the limit.
	for i, r := range []int64{90, 10, 90, 10} {
		rates[i].Store(r)
	}
	shifted := time.Now()
	var followed time.Duration
	for time.Since(shifted) < 8*interval {
		time.Sleep(interval / 10)
		s, sum := shares()
		if sum > limit {
			t.Errorf("%v after demand shifted: shares %v sum to %d, over %d", time.Since(shifted).Round(time.Millisecond), s, sum, limit)
		}
		if followed == 0 && s[0] >= 3*s[1] && s[2] >= 3*s[3] && s[1] > 0 && s[3] > 0 && sum >= limit*9/10 {
			followed = time.Since(shifted)
		}
	}
	s, _ = shares()
	if followed == 0 || s[0] < 3*s[1] || s[2] < 3*s[3] {
		t.Fatalf("8 intervals after demand shifted to 90, 10, 90, 10: shares %v, want the busy Envoys at 3 times the others or more", s)
	}
	t.Logf("demand 90, 10, 90, 10 across the replicas: shares %v, followed within %v", s, followed.Round(time.Millisecond))

	// One Envoy of replica 2 disconnects: within two intervals the other
	// three hold its share (the limit less what rounding leaves).
	close(leave)
	clients[3].Close()
	left := time.Now()
	var sum uint64
	for time.Since(left) < 2*interval+interval/4 {
		sum = share(clients[0]) + share(clients[1]) + share(clients[2])
		if sum >= limit*95/100 {
			t.Logf("%v after one Envoy left, the other three hold %d of %d", time.Since(left).Round(time.Millisecond), sum, limit)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if sum < limit*95/100 {
		t.Fatalf("two intervals after one Envoy left, the other three hold %d of %d", sum, limit)
	}

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
	// The other streams go on: their next report is answered.
	deadline := time.Now().Add(3 * interval)
	for _, c := range clients[:3] {
		for c.Err() == nil && share(c) == 0 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if c.Err() != nil || share(c) == 0 {
			t.Errorf("after the bad input, an Envoy's stream: %v, share %d", c.Err(), share(c))
		}
	}

	// Replica 2 stops gracefully (SIGTERM): it ends its stream and gives
	// its lease back, so within two intervals the Envoys of replica 1
	// hold the whole limit. Budget it stranded would stay counted until
	// its lease ended, 5.5 s or more.
	if code := replicas[1].stop(t); code != 0 {
		t.Fatalf("replica 2 exited %d after SIGTERM, want 0", code)
	}
	stopped := time.Now()
	for sum = 0; time.Since(stopped) < 2*interval+interval/4; time.Sleep(20 * time.Millisecond) {
		if sum = share(clients[0]) + share(clients[1]); sum >= limit*95/100 {
			break
		}
	}
	if sum < limit*95/100 {
		t.Fatalf("two intervals after replica 2 stopped, replica 1's Envoys hold %d of %d: its budget was not given back", sum, limit)
	}
	t.Logf("%v after replica 2 stopped, replica 1's two Envoys hold %d of %d", time.Since(stopped).Round(time.Millisecond), sum, limit)
}
