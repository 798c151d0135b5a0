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
	"google.golang.org/protobuf/types/known/wrapperspb"

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
	// chaosSlow is the least a call takes whose backend call failed on
	// time: past the deadline, or refused as late within the not-after
	// margin before it (min(20 ms, deadline ÷ 4), docs/failure-modes.md).
	chaosSlow = chaosTimeout - chaosTimeout/4
	// chaosReopen bounds how long after such a call ends the open circuit
	// may answer calls by the failure mode without a slow call of its own:
	// a cooldown, then a probe that succeeds (the deadline at most), and a
	// margin for a loaded machine.
	chaosReopen = chaosCooldown + chaosTimeout + 150*time.Millisecond
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

// chaosLimit is the limit of writeChaosRules, per hour.
const chaosLimit = 1_000_000

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
				if fault == "pause" {
					// checkPauseCounted reads back what the hour's
					// window counted: not across the hour's end.
					node.AwayFromHourEnd(t, 30*time.Second)
				}
				srv := startServer(t, "-config", rules, "-backend", "redis", "-redis-url", "redis://"+node.Addr,
					"-failure-mode", mode, "-backend-timeout", chaosTimeout.String(),
					"-circuit-failures", "3", "-circuit-cooldown", chaosCooldown.String())
				client := rlsv3.NewRateLimitServiceClient(srv.dial(t))
				ld := startLoad(client, 4)
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
				if fault == "pause" && mode != "local" {
					checkPauseCounted(t, client, calls, back)
				}
				// The load may have ended within a cooldown of the circuit
				// opening again on a backend call the loaded machine failed
				// (checkChaos): the circuit closes on the next call's probe.
				metrics := httpGet(t, "http://"+srv.httpAddr+"/metrics")
				for deadline := time.Now().Add(maxResume); !strings.Contains(metrics, "ratelimitd_backend_circuit_state 0\n") && time.Now().Before(deadline); {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					_, _ = client.ShouldRateLimit(ctx, descriptorRequest("chaos", "user", "u1"))
					cancel()
					time.Sleep(50 * time.Millisecond)
					metrics = httpGet(t, "http://"+srv.httpAddr+"/metrics")
				}
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
	// first may time out loading the script on a busy machine), calls are
	// decided by Redis again: OK with something remaining. But a loaded
	// machine fails a backend call now and then, after the outage as
	// before it: a decision Redis runs past the 100 ms deadline, or within
	// the not-after margin before it, is answered by the failure mode, and
	// three in a row (coalesced callers fail together) open the circuit
	// for a cooldown. The CI run of issue 32 saw that: the circuit opened
	// again on "late" 2 s after Redis returned, and a call was answered
	// OVER_LIMIT by mode closed (not by Redis: the limit, a million, was
	// far from reached, and checkPauseCounted finds no call of the outage
	// counted). So a call
	// after the settling may be answered by the failure mode only within
	// chaosReopen of a call slow enough to be such a failure; any other
	// means Redis was back and the server did not let it decide.
	settled := resumed.Add(2*(chaosCooldown+chaosTimeout) + 500*time.Millisecond)
	after, byRedis, byMode, unexplained := 0, 0, 0, false
	reopened := func(c chaosCall) bool {
		for _, s := range calls {
			if s.latency >= chaosSlow && !s.start.After(c.start.Add(c.latency)) && !c.start.After(s.start.Add(s.latency+chaosReopen)) {
				return true
			}
		}
		return false
	}
	for _, c := range calls {
		if !c.start.After(settled) {
			continue
		}
		after++
		if c.code == codes.OK && c.overall == rlsv3.RateLimitResponse_OK && c.remaining > 0 {
			byRedis++
			continue
		}
		byMode++
		if !unexplained && !reopened(c) {
			unexplained = true
			t.Errorf("a call %v after Redis resumed answered %v %v remaining %d in %v, not within %v of a call that took %v or more",
				c.start.Sub(resumed).Round(time.Millisecond), c.code, c.overall, c.remaining, c.latency, chaosReopen, chaosSlow)
		}
	}
	if byRedis == 0 {
		t.Errorf("none of the %d calls after the circuit settled was decided by Redis", after)
	} else if byMode > 0 && !unexplained {
		t.Logf("%d of %d calls after the circuit settled were answered by the failure mode, each near a backend call the loaded machine failed", byMode, after)
	}
	slices.Sort(latencies)
	p99 := latencies[len(latencies)*99/100]
	t.Logf("%s: %d calls, %d during the outage (%d failed in all); latency p50 %v p99 %v max %v; Redis deciding again %v after it returned",
		t.Name(), len(calls), outage, failed, latencies[len(latencies)/2].Round(time.Microsecond), p99.Round(time.Microsecond),
		latencies[len(latencies)-1].Round(time.Microsecond), resumed.Sub(back).Round(time.Millisecond))
}

// checkPauseCounted checks the hits Redis counted in a pause run against
// the calls: every call Redis answered (OK with something remaining: in
// modes open, closed and error the failure mode's answers have none, or
// are errors) was counted, and no call the failure mode answered was,
// CLIENT PAUSE held them or not, but for those whose backend call failed
// on time (chaosSlow) after Redis returned: a loaded machine may have
// kept their answer from the server past the deadline after Redis decided
// them in time (docs/failure-modes.md#what-can-still-be-counted).
func checkPauseCounted(t *testing.T, client rlsv3.RateLimitServiceClient, calls []chaosCall, back time.Time) {
	t.Helper()
	byRedis, late := 0, 0
	for _, c := range calls {
		switch {
		case c.code == codes.OK && c.overall == rlsv3.RateLimitResponse_OK && c.remaining > 0:
			byRedis++
		case c.latency >= chaosSlow && c.start.Add(c.latency).After(back):
			late++
		}
	}
	// A peek, which counts nothing, that Redis decides.
	peek := descriptorRequest("chaos", "user", "u1")
	peek.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
	var remaining uint32
	for deadline := time.Now().Add(maxResume); remaining == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("no peek decided by Redis within %v", maxResume)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := client.ShouldRateLimit(ctx, peek)
		cancel()
		if err == nil && resp.OverallCode == rlsv3.RateLimitResponse_OK {
			remaining = resp.Statuses[0].LimitRemaining
		}
	}
	counted := chaosLimit - int(remaining)
	t.Logf("Redis counted %d hits: %d calls it answered, %d that failed on time after it returned", counted, byRedis, late)
	if counted < byRedis || counted > byRedis+late {
		t.Errorf("Redis counted %d hits for %d calls it answered (and %d that failed on time after it returned): want %d to %d; more are calls the failure mode answered",
			counted, byRedis, late, byRedis, byRedis+late)
	}
}
