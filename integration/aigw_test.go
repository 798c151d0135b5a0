package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
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

// aigwScenario is the AI Gateway scenario of issue 31: 40 concurrent
// users, 50,000 tokens a window, streams of a median 700 and at most
// 4,000 tokens, 5% upstream failures (aigwsim.DefaultWorkload), measured
// over full windows. The window is a minute; the tests run it six
// times faster (aigwFast), streams and windows alike, so that as many
// streams are in flight at a window's end, against as large a limit.
type aigwScenario struct {
	window time.Duration
	full   int // full windows measured
}

// aigwFast is the scenario the tests run: windows of 10 s, three of them.
var aigwFast = aigwScenario{window: 10 * time.Second, full: 3}

const (
	aigwLimit = 50000
	aigwUsers = 40
)

// aigwRoute is the route and QuotaPolicy of the scenario.
func aigwRoute() aigwsim.Route {
	return aigwsim.Route{Namespace: "default", Backend: "openai", Model: "gpt-4o"}
}

// rules is the rule AI Gateway's translator.BuildRateLimitConfigs
// (internal/ratelimit/translator/translator.go, ai-gateway c217da8a)
// builds for the route's QuotaPolicy, which reaches the service over xDS:
// domain ai-gateway-quota, backend_name → model_name_override, a fixed
// window in tokens, quota_mode as buildPerModelDescriptorKeyed sets it.
// A window other than a minute, which AI Gateway's units cannot say, is
// written with unit_multiplier, and the rule is read from a file; over is
// a line for the rate_limit (over_limit_hits: count, today's best for
// counting the stream-done costs that land past the limit), or empty.
func (sc aigwScenario) rules(over string) string {
	r := aigwRoute()
	unit := "unit: minute"
	if sc.window != time.Minute {
		unit = fmt.Sprintf("unit: second\n          unit_multiplier: %d", sc.window/time.Second)
	}
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
          %s
%s`, aigwsim.Domain, aigwsim.BackendNameKey, r.Namespace, r.Backend,
		aigwsim.ModelNameKey, r.Model, aigwLimit, unit, over)
}

// scale scales d, a time of the scenario of windows of a minute,
// to the scenario's window.
func (sc aigwScenario) scale(d time.Duration) time.Duration {
	return time.Duration(float64(d) * float64(sc.window) / float64(time.Minute))
}

// workload is aigwsim.DefaultWorkload with its durations scaled.
func (sc aigwScenario) workload() aigwsim.Workload {
	w := aigwsim.DefaultWorkload()
	w.FirstToken, w.PerToken = sc.scale(w.FirstToken), sc.scale(w.PerToken)
	return w
}

// runAIGatewayScenario runs the fast scenario against two real ratelimitd
// replicas, started with serverArgs, on one real Redis, and returns its
// measurement (30 to 40 s).
func runAIGatewayScenario(t *testing.T, serverArgs ...string) aigwsim.Report {
	t.Helper()
	return aigwFast.runRatelimitd(t, serverArgs...)
}

// settledStart returns when the load starts, now or at the next window:
// so that the partial window before the first full one lasts at least half
// a window. A fixed window's streams admitted near its end spend in the
// next (docs/ai-gateway.md, the bound: over two consecutive windows at
// most 2N); in a steady load the next window's own streams that end after
// it make up for them, but a load started just before a boundary puts a
// whole window's admissions at that end, and the first full window is
// charged them on top of its own (1.10 to 1.16 of the limit in runs
// started within about a second of a boundary). That is the start of the load,
// not what the servers hold in a steady one, which the full windows
// measure; half a window of load also lets each replica learn its
// reservation first.
func (sc aigwScenario) settledStart(now time.Time) time.Time {
	left := sc.window - time.Duration(now.UnixNano()%int64(sc.window))
	if left >= sc.window/2 {
		return now
	}
	time.Sleep(left + 10*time.Millisecond)
	return time.Now()
}

// runRatelimitd runs the scenario against two real ratelimitd replicas,
// started with serverArgs, on one real Redis, logs what they learnt of
// their reservations, and returns the measurement.
func (sc aigwScenario) runRatelimitd(t *testing.T, serverArgs ...string) aigwsim.Report {
	t.Helper()
	redis := redistest.Start(t)
	dir := t.TempDir()
	// Counting after the fact needs the rule to say so; reserving, as the
	// rules AI Gateway serves over xDS, it says nothing.
	over := "          over_limit_hits: count\n"
	if slices.Contains(serverArgs, "-reserve") {
		over = ""
	}
	if err := os.WriteFile(filepath.Join(dir, "ai-gateway-quota.yaml"), []byte(sc.rules(over)), 0o644); err != nil {
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
	stop := make(chan struct{})
	timeline := make(chan string, 1)
	go func() { timeline <- learntTimeline(servers, stop) }()
	rep := sc.run(t, fmt.Sprintf("ratelimitd %q", serverArgs), replicas)
	close(stop)
	if tl := <-timeline; tl != "" {
		t.Logf("what each replica had learnt, every second (reservation hits / lifetime):\n%s", tl)
	}
	for i, srv := range servers {
		var learnt []string
		for _, l := range strings.Split(httpGet(t, "http://"+srv.httpAddr+"/metrics"), "\n") {
			if strings.HasPrefix(l, "ratelimitd_reserve_") {
				learnt = append(learnt, l)
			}
		}
		t.Logf("replica %d learnt:\n%s", i, strings.Join(learnt, "\n"))
	}
	return rep
}

// learntTimeline reads, every second until stop closes, the reservation
// and lifetime each replica has learnt (ratelimitd_reserve_hits and
// _ttl_seconds), and returns them as lines of a timeline: what a window's
// utilisation follows, shown beside the measurement. Servers that learn
// nothing (counting after the fact) give an empty timeline.
func learntTimeline(servers []*server, stop <-chan struct{}) string {
	var b strings.Builder
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return b.String()
		case now := <-tick.C:
			var cols []string
			for _, srv := range servers {
				hits, ttl := "?", "?" // unread: the machine too busy to answer in time
				resp, err := http.Get("http://" + srv.httpAddr + "/metrics")
				if err == nil {
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					hits = "-"
					for _, l := range strings.Split(string(body), "\n") {
						f := strings.Fields(l)
						switch {
						case len(f) != 2:
						case strings.HasPrefix(l, "ratelimitd_reserve_hits{"):
							hits = f[1]
						case strings.HasPrefix(l, "ratelimitd_reserve_ttl_seconds{"):
							ttl = f[1]
						}
					}
				}
				if hits == "-" {
					return "" // a server that learns nothing
				}
				cols = append(cols, fmt.Sprintf("%s / %ss", hits, ttl))
			}
			fmt.Fprintf(&b, "  %s  %s\n", now.UTC().Format("15:04:05.0"), strings.Join(cols, "   "))
		}
	}
}

// run runs the scenario's load against the replicas of the server named
// what, from now to the end of its sc.full-th full window (streams still
// going then are reset), and returns its measurement.
func (sc aigwScenario) run(t *testing.T, what string, replicas []rlsv3.RateLimitServiceClient) aigwsim.Report {
	t.Helper()
	// The filter as AI Gateway's controller configures it
	// (cmd/controller/main.go: quotaRateLimitTimeout 5 s), but for
	// failure_mode_deny: a check that fails is a 500, not an admission
	// the servers never decided. The measurement is about what the servers
	// decide; on a machine so busy that Redis misses its deadline, a few
	// checks fail, and admitted they would charge costs no reservation
	// held.
	client := aigwsim.NewClient(aigwsim.Config{Route: aigwRoute(), Timeout: 5 * time.Second, FailureModeDeny: true}, replicas...)
	warm(t, replicas)
	now := sc.settledStart(time.Now())
	load := aigwsim.Load{
		Users:       aigwUsers,
		Workload:    sc.workload(),
		Think:       sc.scale(250 * time.Millisecond),
		For:         now.Truncate(sc.window).Add(time.Duration(sc.full+1) * sc.window).Sub(now),
		MaxRequests: 20_000_000, // refused streams are retried at once: the bound that holds is For
		Seed:        31,
	}
	ctx, cancel := context.WithTimeout(context.Background(), load.For+time.Minute)
	defer cancel()
	run, err := load.Run(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	rep := aigwsim.Measure(run, aigwLimit, sc.window)
	t.Logf("%s, %d users for %v:\n%s", what, aigwUsers, load.For.Round(time.Millisecond), rep)
	if rep.FullWindows < sc.full {
		t.Fatalf("%d full windows; want %d", rep.FullWindows, sc.full)
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
