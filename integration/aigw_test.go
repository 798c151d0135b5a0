package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/aigwsim"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
)

// The AI Gateway scenario of issue 31, run six times faster so that
// several full windows fit in a test: 40 concurrent users, 50,000 tokens
// a window of 10 s (the minute), streams of a median 700 and at
// most 4,000 tokens lasting up to 1.7 s (the 10.3 s), 5% upstream
// failures. Streams and windows alike are scaled (aigwScale): as many are
// in flight at a window's end as in the scenario.
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
func aigwRules(over string) string {
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
%s`, aigwsim.Domain, aigwsim.BackendNameKey, r.Namespace, r.Backend,
		aigwsim.ModelNameKey, r.Model, aigwLimit, aigwWindow/time.Second, over)
}

// runAIGatewayScenario runs the scenario against two real ratelimitd
// replicas, started with serverArgs, on one real Redis, and returns its
// measurement. The load runs from now to the end of the aigwFullWindows-th
// full window after now (30 to 40 s); streams still going then are reset.
func runAIGatewayScenario(t *testing.T, serverArgs ...string) aigwsim.Report {
	t.Helper()
	redis := redistest.Start(t)
	dir := t.TempDir()
	// Counting after the fact needs the rule to say so; reserving, as the
	// rules AI Gateway serves over xDS, it says nothing.
	over := "          over_limit_hits: count\n"
	if slices.Contains(serverArgs, "-reserve") {
		over = ""
	}
	if err := os.WriteFile(filepath.Join(dir, "ai-gateway-quota.yaml"), []byte(aigwRules(over)), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append(redisArgs(t, redis.URL, "standalone", "-config", dir), serverArgs...)
	var servers []*server
	var replicas []rlsv3.RateLimitServiceClient
	for range 2 {
		srv := startServer(t, args...)
		servers = append(servers, srv)
		replicas = append(replicas, rlsv3.NewRateLimitServiceClient(srv.dial(t)))
	}

	// The filter as AI Gateway's controller configures it
	// (cmd/controller/main.go: quotaRateLimitTimeout 5 s), but for
	// failure_mode_deny: a check that fails is a 500, not an admission
	// the servers never decided. The measurement is about what the servers
	// decide; on a machine so busy that Redis misses its deadline, a few
	// checks fail, and admitted they would charge costs no reservation
	// held.
	client := aigwsim.NewClient(aigwsim.Config{Route: aigwRoute(), Timeout: 5 * time.Second, FailureModeDeny: true}, replicas...)
	warm(t, replicas)
	now := time.Now()
	load := aigwsim.Load{
		Users:       aigwUsers,
		Workload:    aigwWorkload(),
		Think:       aigwScale(250 * time.Millisecond),
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
	for i, srv := range servers {
		var learnt []string
		for _, l := range strings.Split(httpGet(t, "http://"+srv.httpAddr+"/metrics"), "\n") {
			if strings.HasPrefix(l, "ratelimitd_reserve_") {
				learnt = append(learnt, l)
			}
		}
		t.Logf("replica %d learnt:\n%s", i, strings.Join(learnt, "\n"))
	}
	if rep.FullWindows < aigwFullWindows {
		t.Fatalf("%d full windows; want %d", rep.FullWindows, aigwFullWindows)
	}
	// A few failed checks (denied) measure the machine, not the servers;
	// more would leave too few decisions to measure.
	if failed := rep.FailedOpen + rep.Count(aigwsim.Denied); failed*100 > rep.Requests {
		t.Fatalf("%d of %d request-time calls failed: the machine is too busy to measure", failed, rep.Requests)
	}
	if rep.DemandWindows < rep.FullWindows {
		t.Fatalf("demand exceeded the limit in %d of %d full windows; want all, or the scenario shows nothing", rep.DemandWindows, rep.FullWindows)
	}
	return rep
}

// aigwScale scales d, a time of issue 31's scenario of windows of a
// minute, to the test's windows of aigwWindow: the whole scenario runs
// faster, streams and windows alike, so that as many streams are in
// flight at a window's end, against as large a limit, as in the issue's.
func aigwScale(d time.Duration) time.Duration {
	return d * aigwWindow / time.Minute
}

// aigwWorkload is aigwsim.DefaultWorkload with its durations scaled by
// aigwScale.
func aigwWorkload() aigwsim.Workload {
	w := aigwsim.DefaultWorkload()
	w.FirstToken, w.PerToken = aigwScale(w.FirstToken), aigwScale(w.PerToken)
	return w
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

// TestAIGatewayReservationsHold runs the scenario of
// TestAIGatewayCountingAfterTheFactOvershoots against two replicas with
// -reserve auto, as the rules reach them over xDS: no full window is
// charged more than 1.05 times the limit (the costs the stream-done calls
// sent in it report, as in the scenario counting after the fact), and
// every full window whose demand exceeded the limit is charged at least
// 80% of it. What each window admitted (the costs of the streams whose
// request-time call it answered), which the bound of docs/algorithms.md
// is about, is logged beside it.
func TestAIGatewayReservationsHold(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIPPED: issue 31's AI Gateway scenario runs 30-40 s of load against two ratelimitd replicas on Redis; run without -short")
	}
	rep := runAIGatewayScenario(t, "-reserve", "auto")
	t.Logf("reserving: charged max %.3f, min utilisation %.3f; admitted max %.3f, min %.3f",
		rep.MaxRatio, rep.MinUtilisation, rep.MaxAdmittedRatio, rep.MinAdmittedUtilisation)
	if rep.MaxRatio > 1.05 {
		t.Errorf("a full window was charged %.3f times the limit; want at most 1.05", rep.MaxRatio)
	}
	if rep.MinUtilisation < 0.8 {
		t.Errorf("a full window whose demand exceeded the limit was charged %.3f of it; want at least 0.8", rep.MinUtilisation)
	}
}
