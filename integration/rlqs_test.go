package integration

import (
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/rlqs/rlqssim"
)

// TestRLQSReplicasShareOneLimit runs two ratelimitd -rlqs processes on one
// real Redis and four simulated Envoys, two on each, reporting every
// second and each offering 50 requests per second to one bucket of a
// 100-per-second rule (twice its fair share). Over 12 s of real time the
// Envoys of both replicas admit at most L·T/U + L (docs/rlqs.md, "Across
// replicas"); then one Envoy disconnects and the other three hold its
// share within two intervals.
func TestRLQSReplicasShareOneLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 15 s")
	}
	const limit, interval, seconds, rate = 100, time.Second, 12, 50
	dir := t.TempDir()
	rules := "domain: quota\ndescriptors:\n  - key: tenant\n    rate_limit: {requests_per_unit: 100, unit: second}\n"
	if err := os.WriteFile(filepath.Join(dir, "quota.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	rs := redistest.Start(t)
	args := redisArgs(t, rs.URL, "standalone", "-config", dir, "-rlqs")
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

	// Each client offers rate requests per second, one every 1/rate s.
	var admitted, offered atomic.Int64
	var counting atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// drive has c offer its rate until stop, or leave closes (nil: never).
	drive := func(c *rlqssim.Client, leave <-chan struct{}) {
		wg.Go(func() {
			tick := time.NewTicker(time.Second / rate)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-leave:
					return
				case <-tick.C:
					ok := c.Allow(bucket)
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
	for _, c := range clients[:3] {
		drive(c, nil)
	}
	// The fourth is driven apart, so that it can leave on its own.
	leave := make(chan struct{})
	drive(clients[3], leave)
	defer func() { close(stop); wg.Wait() }()

	// Two intervals to settle, then count over whole seconds.
	time.Sleep(2 * interval)
	counting.Store(true)
	maxSum := uint64(0)
	for range seconds * 10 {
		time.Sleep(interval / 10)
		var sum uint64
		for _, c := range clients {
			sum += share(c)
		}
		maxSum = max(maxSum, sum)
	}
	counting.Store(false)
	n, bound := admitted.Load(), int64(limit*seconds+limit)
	t.Logf("2 replicas, 4 Envoys offering %d in %d s: admitted %d (limit %d/s: L·T = %d, bound L·T + L = %d); assignments summed at most %d; shares %d %d %d %d",
		offered.Load(), seconds, n, limit, limit*seconds, bound, maxSum, share(clients[0]), share(clients[1]), share(clients[2]), share(clients[3]))
	if n > bound {
		t.Errorf("admitted %d in %d s across replicas, over the bound %d", n, seconds, bound)
	}
	if maxSum > limit {
		t.Errorf("the assignments in force summed to %d, over the limit %d", maxSum, limit)
	}
	if n < limit*seconds*6/10 {
		t.Errorf("admitted %d in %d s: under 60%% of the limit while demand is twice it", n, seconds)
	}

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
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("two intervals after one Envoy left, the other three hold %d of %d", sum, limit)
}
