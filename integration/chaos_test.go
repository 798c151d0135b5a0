package integration

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
)

// Chaos settings: the backend deadline and circuit of the server under
// test, how long Redis stays away, and the bounds the test holds it to.
const (
	chaosTimeout  = 100 * time.Millisecond
	chaosCooldown = 250 * time.Millisecond
	chaosOutage   = 3 * time.Second
	// maxLatency bounds every call: the backend deadline plus a margin
	// for a loaded 2-core machine. Without the deadline a call to a paused
	// Redis would wait for the client's own 5 s.
	maxLatency = time.Second
	// maxResume bounds how long after Redis returns decisions are made by
	// Redis again.
	maxResume = 5 * time.Second
)

// chaosCall is one call of the load.
type chaosCall struct {
	start     time.Time
	latency   time.Duration
	code      codes.Code // of the call: OK, or the error's
	overall   rlsv3.RateLimitResponse_Code
	remaining uint32
}

// load calls ShouldRateLimit from callers goroutines until stop is closed.
type load struct {
	mu    sync.Mutex
	calls []chaosCall
	wg    sync.WaitGroup
	stop  chan struct{}
}

func startLoad(c rlsv3.RateLimitServiceClient, callers int) *load {
	l := &load{stop: make(chan struct{})}
	req := descriptorRequest("chaos", "user", "u1")
	for range callers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				start := time.Now()
				resp, err := c.ShouldRateLimit(ctx, req)
				cc := chaosCall{start: start, latency: time.Since(start), code: status.Code(err)}
				cancel()
				if err == nil {
					cc.overall = resp.OverallCode
					cc.remaining = resp.Statuses[0].LimitRemaining
				}
				l.mu.Lock()
				l.calls = append(l.calls, cc)
				l.mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	return l
}

func (l *load) finish() []chaosCall {
	close(l.stop)
	l.wg.Wait()
	return l.calls
}

// writeChaosRules writes domain "chaos": a million per hour for each user,
// so that a decision Redis made always has some remaining, while the open
// and closed failure modes report none.
func writeChaosRules(t *testing.T) string {
	dir := t.TempDir()
	rules := "domain: chaos\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n"
	if err := os.WriteFile(filepath.Join(dir, "chaos.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// evalsha counts the decision calls (FCALL, or EVALSHA) of the server at
// addr, over a new connection (the old one may have died with the server).
func evalsha(t *testing.T, addr string) int {
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	return redistest.CommandCalls(t, c, "fcall") + redistest.CommandCalls(t, c, "evalsha")
}

// TestRedisFailures runs a ratelimitd under steady load while its Redis is
// killed (SIGKILL) and restarted, or paused (CLIENT PAUSE), for each
// failure mode, and checks what callers see: in open, closed and local
// modes no call fails, in error mode every call during the outage fails
// fast with Unavailable; no call waits past the deadline plus a margin;
// and decisions come from Redis again soon after it returns.
func TestRedisFailures(t *testing.T) {
	rules := writeChaosRules(t)
	for _, fault := range []string{"kill", "pause"} {
		for _, mode := range []string{"open", "closed", "error", "local"} {
			t.Run(fault+"/"+mode, func(t *testing.T) {
				t.Parallel()
				node := redistest.StartNode(t)
				srv := startServer(t, "-config", rules, "-backend", "redis", "-redis-url", "redis://"+node.Addr,
					"-failure-mode", mode, "-backend-timeout", chaosTimeout.String(),
					"-circuit-failures", "3", "-circuit-cooldown", chaosCooldown.String())
				ld := startLoad(rlsv3.NewRateLimitServiceClient(srv.dial(t)), 4)
				time.Sleep(500 * time.Millisecond)

				// down is when the fault is in effect: calls that start
				// later meet it.
				var down time.Time
				switch fault {
				case "kill":
					node.Kill(t)
					down = time.Now()
					time.Sleep(chaosOutage)
					node.Restart(t)
				case "pause":
					admin := goredis.NewClient(&goredis.Options{Addr: node.Addr})
					err := admin.Do(context.Background(), "CLIENT", "PAUSE", chaosOutage.Milliseconds(), "ALL").Err()
					down = time.Now()
					admin.Close()
					if err != nil {
						t.Fatal(err)
					}
					time.Sleep(chaosOutage - time.Since(down))
				}
				back := time.Now()
				before := 0
				if fault == "pause" {
					before = evalsha(t, node.Addr) // the same process keeps counting
				}
				var resumed time.Time
				for deadline := back.Add(maxResume); resumed.IsZero(); time.Sleep(20 * time.Millisecond) {
					if evalsha(t, node.Addr) > before {
						resumed = time.Now()
					} else if time.Now().After(deadline) {
						ld.finish()
						t.Fatalf("Redis decided nothing within %v of returning", maxResume)
					}
				}
				time.Sleep(2*(chaosCooldown+chaosTimeout) + 1500*time.Millisecond)
				calls := ld.finish()
				checkChaos(t, mode, calls, down, back, resumed)
				metrics := httpGet(t, "http://"+srv.httpAddr+"/metrics")
				for _, want := range []string{
					`ratelimitd_failure_mode_decisions_total{domain="chaos",mode="` + mode + `"} `,
					"ratelimitd_backend_circuit_opens_total ",
					"ratelimitd_backend_circuit_state 0\n",
				} {
					if !strings.Contains(metrics, want) || strings.Contains(metrics, want+"0\n") {
						t.Errorf("/metrics lacks a non-zero %q", want)
					}
				}
			})
		}
	}
}

// checkChaos checks and reports the calls of one chaos run.
func checkChaos(t *testing.T, mode string, calls []chaosCall, down, back, resumed time.Time) {
	t.Helper()
	var latencies []time.Duration
	failed, outage, degraded := 0, 0, 0
	for _, c := range calls {
		latencies = append(latencies, c.latency)
		if c.latency > maxLatency {
			t.Errorf("a call started %v after the fault took %v, over %v", c.start.Sub(down).Round(time.Millisecond), c.latency, maxLatency)
		}
		if c.code != codes.OK {
			failed++
		}
		// Calls that started while Redis was away, and ended before it
		// came back, are decided by the failure mode.
		if c.start.Before(down) || c.start.Add(c.latency).After(back) {
			continue
		}
		outage++
		var ok bool
		switch mode {
		case "open":
			ok = c.code == codes.OK && c.overall == rlsv3.RateLimitResponse_OK && c.remaining == 0
		case "closed":
			ok = c.code == codes.OK && c.overall == rlsv3.RateLimitResponse_OVER_LIMIT
		case "error":
			ok = c.code == codes.Unavailable
		case "local":
			ok = c.code == codes.OK && c.overall == rlsv3.RateLimitResponse_OK && c.remaining > 0
		}
		if ok {
			degraded++
		}
	}
	if outage == 0 {
		t.Fatal("no call was made while Redis was away")
	}
	if degraded != outage {
		t.Errorf("%d of %d calls during the outage were answered as failure mode %s says", degraded, outage, mode)
	}
	if mode != "error" && failed > 0 {
		t.Errorf("%d calls failed; in failure mode %s none may", failed, mode)
	}
	// After Redis is back and the circuit has had time for two probes (the
	// first may time out loading the script on a busy machine), every call
	// is decided by Redis again: OK with something remaining.
	settled := resumed.Add(2*(chaosCooldown+chaosTimeout) + 500*time.Millisecond)
	after := 0
	for _, c := range calls {
		if c.start.After(settled) {
			after++
			if c.code != codes.OK || c.overall != rlsv3.RateLimitResponse_OK || c.remaining == 0 {
				t.Errorf("a call %v after Redis resumed answered %v %v remaining %d", c.start.Sub(resumed).Round(time.Millisecond), c.code, c.overall, c.remaining)
				break
			}
		}
	}
	if after == 0 {
		t.Error("no call after Redis resumed")
	}
	slices.Sort(latencies)
	p99 := latencies[len(latencies)*99/100]
	t.Logf("%s: %d calls, %d during the outage (%d failed in all); latency p50 %v p99 %v max %v; Redis deciding again %v after it returned",
		t.Name(), len(calls), outage, failed, latencies[len(latencies)/2].Round(time.Microsecond), p99.Round(time.Microsecond),
		latencies[len(latencies)-1].Round(time.Microsecond), resumed.Sub(back).Round(time.Millisecond))
}
