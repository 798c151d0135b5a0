package main

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/lease"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
)

// TestLeaseEvictionsExported serves the leased rule of examples/search.yaml
// on Redis with -lease-max-keys 1 (one key in each of the engine's 64
// shards): 200 tenants, one request each, evict at least 136 keys, and
// /metrics shows them as ratelimitd_lease_evictions_total, with the keys
// tracked within the cap. It fails if the flag does not reach the engine
// (the default cap evicts nothing here) or the counter is not exported.
func TestLeaseEvictionsExported(t *testing.T) {
	r := redistest.Start(t)
	p := startServe(t, true, "-config", "../../examples", "-backend", "redis", "-redis-url", r.URL, "-lease-max-keys", "1")
	rls := p.rls(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const tenants, shards = 200, 64
	for i := range tenants {
		req := &rlsv3.RateLimitRequest{Domain: "search", Descriptors: []*rlv3.RateLimitDescriptor{
			{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "t" + strconv.Itoa(i)}}}}}
		resp, err := rls.ShouldRateLimit(ctx, req)
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("tenant %d: %v, %v", i, resp, err)
		}
	}
	m := p.get(t, "/metrics")
	evicted, keys := metricValue(t, m, "ratelimitd_lease_evictions_total"), metricValue(t, m, "ratelimitd_lease_keys")
	if evicted < tenants-shards || keys > shards {
		t.Errorf("after %d one-off keys with -lease-max-keys 1: ratelimitd_lease_evictions_total %v, ratelimitd_lease_keys %v; want at least %d evicted and at most %d tracked",
			tenants, evicted, keys, tenants-shards, shards)
	}
	if !strings.Contains(m, "# TYPE ratelimitd_lease_evictions_total counter") {
		t.Error("ratelimitd_lease_evictions_total is not a counter")
	}
}

// metricValue returns the value of the series name (without labels) in
// the Prometheus text m.
func metricValue(t *testing.T, m, name string) float64 {
	t.Helper()
	for _, line := range strings.Split(m, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("/metrics has no series %s", name)
	return 0
}

// TestWatchLeaseEvictionsWarns: once the lease engine has evicted keys,
// the watcher logs one warning naming -lease-max-keys and how many were
// evicted.
func TestWatchLeaseEvictionsWarns(t *testing.T) {
	store := memory.New(memory.Options{SweepInterval: -1})
	defer store.Close()
	e, err := lease.New(store, lease.Options{MaxKeys: 1, Manual: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reqs := []algo.Request{{Limit: algo.Limit{Requests: 10, Window: time.Hour}, Hits: 1, Leased: true}}
	out := make([]algo.Decision, 1)
	for i := range 200 { // one key per shard: at least 136 evicted
		reqs[0].Key = []byte("k" + strconv.Itoa(i))
		if err := e.Decide(ctx, reqs, out); err != nil {
			t.Fatal(err)
		}
	}
	n := e.Stats().Evicted
	if n < 136 {
		t.Fatalf("%d keys evicted, want at least 136", n)
	}

	logs := lineWriter{lines: make(chan string, 10)}
	done := make(chan struct{})
	go func() {
		watchEvictions(ctx, func() uint64 { return e.Stats().Evicted }, leaseEvictionsWarning, slog.New(slog.NewTextHandler(logs, nil)), time.Millisecond)
		close(done)
	}()
	select {
	case line := <-logs.lines:
		if !strings.Contains(line, "level=WARN") || !strings.Contains(line, "raise -lease-max-keys") || !strings.Contains(line, fmt.Sprintf("evicted=%d ", n)) {
			t.Fatalf("log line %q, want a warning naming -lease-max-keys and evicted=%d", line, n)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no warning within 30s of evictions")
	}
	select {
	case line := <-logs.lines:
		t.Errorf("a second warning with no eviction since: %q", line)
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	<-done
}
