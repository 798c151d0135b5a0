package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/aigwsim"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
)

// The AI Gateway scenario of issue 31, scaled to windows of 10 s so that
// several full windows fit in a test: 40 concurrent users, 50,000 tokens
// a window (the limit per minute: the overshoot is about the
// costs in flight against the limit, not the window's length), streams of
// a median 700 and at most 4,000 tokens lasting up to 10.3 s, 5% upstream
// failures.
const (
	aigwLimit       = 50000
	aigwWindow      = 10 * time.Second
	aigwUsers       = 40
	aigwFullWindows = 3
)

// aigwRoute is the route and QuotaPolicy of the scenario.
func aigwRoute() aigwsim.Route {
	return aigwsim.Route{Namespace: "default", Backend: "openai", Model: "gpt-4o"}
}

// aigwRules is the rule AI Gateway's translator.BuildRateLimitConfigs
// (internal/ratelimit/translator/translator.go, ai-gateway c217da8a)
// builds for the route's QuotaPolicy, which reaches the service over xDS:
// domain ai-gateway-quota, backend_name → model_name_override, a fixed
// window in tokens, quota_mode as buildPerModelDescriptorKeyed sets it.
// Its window is 10 s, which AI Gateway's units cannot say, and it is read
// from a file; over_limit_hits: count is today's best, counting the
// stream-done costs that land past the limit.
func aigwRules() string {
	r := aigwRoute()
	return fmt.Sprintf(`domain: %s
descriptors:
  - key: %s
    value: %s/%s
    descriptors:
      - key: %s
        value: %s
        quota_mode: true
        rate_limit:
          requests_per_unit: %d
          unit: second
          unit_multiplier: %d
          over_limit_hits: count
`, aigwsim.Domain, aigwsim.BackendNameKey, r.Namespace, r.Backend,
		aigwsim.ModelNameKey, r.Model, aigwLimit, aigwWindow/time.Second)
}

// runAIGatewayScenario runs the scenario against two real ratelimitd
// replicas, started with serverArgs, on one real Redis, and returns its
// measurement. The load runs from now to the end of the aigwFullWindows-th
// full window after now (30 to 40 s); streams still going then are reset.
func runAIGatewayScenario(t *testing.T, serverArgs ...string) aigwsim.Report {
	t.Helper()
	redis := redistest.Start(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ai-gateway-quota.yaml"), []byte(aigwRules()), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append(redisArgs(t, redis.URL, "standalone", "-config", dir), serverArgs...)
	replicas := startReplicas(t, func(int) []string { return args }, 2)

	// The filter as AI Gateway's controller configures it by default
	// (cmd/controller/main.go: quotaRateLimitTimeout 5 s,
	// quotaRateLimitFailureModeDeny false).
	client := aigwsim.NewClient(aigwsim.Config{Route: aigwRoute(), Timeout: 5 * time.Second}, replicas...)
	warm(t, replicas)
	now := time.Now()
	load := aigwsim.Load{
		Users:       aigwUsers,
		Workload:    aigwsim.DefaultWorkload(),
		Think:       250 * time.Millisecond,
		For:         now.Truncate(aigwWindow).Add((aigwFullWindows + 1) * aigwWindow).Sub(now),
		MaxRequests: 100_000,
		Seed:        31,
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run, err := load.Run(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	rep := aigwsim.Measure(run, aigwLimit, aigwWindow)
	t.Logf("ratelimitd %q, %d users for %v:\n%s", serverArgs, aigwUsers, load.For.Round(time.Millisecond), rep)
	if rep.FullWindows < aigwFullWindows {
		t.Fatalf("%d full windows; want %d", rep.FullWindows, aigwFullWindows)
	}
	// The measurement is about what the servers decide, not their
	// failures: a failed check would admit the stream (fail open).
	if rep.FailedOpen > 0 || rep.Count(aigwsim.Denied) > 0 {
		t.Fatalf("%d request-time calls failed", rep.FailedOpen+rep.Count(aigwsim.Denied))
	}
	if rep.DemandWindows < rep.FullWindows {
		t.Fatalf("demand exceeded the limit in %d of %d full windows; want all, or the scenario shows nothing", rep.DemandWindows, rep.FullWindows)
	}
	return rep
}

// warm makes one request-time call through each replica, so that no
// connection is set up during the measurement.
func warm(t *testing.T, replicas []rlsv3.RateLimitServiceClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, r := range replicas {
		req := &rlsv3.RateLimitRequest{Domain: aigwsim.Domain, Descriptors: aigwsim.Route{Namespace: "warm", Backend: "up", Model: "m"}.RequestTimeDescriptors()}
		if _, err := r.ShouldRateLimit(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAIGatewayCountingAfterTheFactOvershoots shows that a server that
// counts tokens only after the fact fails issue 31's target (every full
// window charges at most 1.05× the limit): two ratelimitd replicas with
// over_limit_hits: count, today's best, let the streams admitted before
// the limit was reached land their costs past it, about 1.6× the limit a
// window. It runs the AI Gateway client modelled in internal/aigwsim, for
// 30 to 40 s. The same scenario with reservations (runAIGatewayScenario
// with "-reserve", "auto") must hold the target.
func TestAIGatewayCountingAfterTheFactOvershoots(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIPPED: issue 31's AI Gateway scenario runs 30-40 s of load against two ratelimitd replicas on Redis; run without -short")
	}
	// Not parallel: a measurement under load, on a small machine.
	rep := runAIGatewayScenario(t)
	if rep.Count(aigwsim.Refused) == 0 {
		t.Fatal("no request was refused: the rule did not apply, and the overshoot would show nothing")
	}
	if rep.MaxRatio <= 1.05 {
		t.Fatalf("max full-window ratio %.3f: counting after the fact held the 1.05 target, which it cannot with %d streams in flight", rep.MaxRatio, aigwUsers)
	}
	t.Logf("counting after the fact: max full-window ratio %.3f (target 1.05), utilisation min %.3f mean %.3f", rep.MaxRatio, rep.MinUtilisation, rep.MeanUtilisation)
}
