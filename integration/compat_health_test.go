package integration

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/xdstest"
)

// The reference's health and Redis start-up settings, each under the
// binary run as /bin/ratelimit with a real Redis (redis-server processes
// killed and restarted on their port) and, for
// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, a real xDS control plane. The
// reference's behaviour is read from its source at f2fb157:
// src/redis/driver_impl.go (newClientImpl, poolTrace), src/server/health.go,
// src/service/ratelimit.go (SetConfig).

// health returns the status code and body of GET /healthcheck.
func health(t *testing.T, s *server) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + s.httpAddr + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(body))
}

// grpcHealth returns the gRPC health status of the whole server.
func grpcHealth(t *testing.T, s *server) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(s.dial(t)).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Status
}

// eventually waits up to 20s for cond, polling.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 20s: %s", what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// rulesRoot returns a runtime root holding rules as
// ratelimit/config/rules.yaml, for referenceEnv.
func rulesRoot(t *testing.T, rules string) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

// decideOnce asks s about one descriptor of one entry and returns the
// overall code.
func decideOnce(t *testing.T, s *server, domain, key, value string) string {
	t.Helper()
	return decide(t, rlsv3.NewRateLimitServiceClient(s.dial(t)), descriptorRequest(domain, key, value)).OverallCode.String()
}

// countLogs counts the log lines holding s.
func (s *server) countLogs(sub string) int {
	n := 0
	for _, l := range s.logLines() {
		if strings.Contains(l, sub) {
			n++
		}
	}
	return n
}

// TestReferenceRedisStartup: REDIS_STARTUP_INITIAL_INTERVAL and
// REDIS_STARTUP_MAX_INTERVAL. With Redis down at start, no port opens and
// the connection is tried again and again, with waits between the initial
// and the maximum interval; once Redis answers, the server opens its ports
// healthy and decides against it.
func TestReferenceRedisStartup(t *testing.T) {
	t.Parallel()
	node := redistest.StartNode(t)
	node.Kill(t)
	root := rulesRoot(t, "domain: startup\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	cmd := exec.Command(asReference(t))
	cmd.Env = referenceEnv(root, node.Addr, "REDIS_STARTUP_INITIAL_INTERVAL=100ms", "REDIS_STARTUP_MAX_INTERVAL=300ms")
	s := launchProcess(t, cmd)
	eventually(t, "three tries logged", func() bool { return s.countLogs("redis not reachable at start") >= 3 })
	s.mu.Lock()
	listening := len(s.listening)
	s.mu.Unlock()
	if listening != 0 {
		t.Fatalf("a port opened before Redis answered: %v", s.listening)
	}
	// Every wait is between the initial and the maximum interval (slog's
	// JSON gives a duration in nanoseconds).
	waits := 0
	for _, l := range s.logLines() {
		var rec struct {
			Msg string
			In  time.Duration
		}
		if json.Unmarshal([]byte(l), &rec) != nil || rec.Msg != "redis not reachable at start; retrying before opening any port" {
			continue
		}
		waits++
		if rec.In < 100*time.Millisecond || rec.In > 300*time.Millisecond {
			t.Errorf("a wait of %v, want 100ms to 300ms: %s", rec.In, l)
		}
	}
	if waits < 3 {
		t.Errorf("%d waits logged with their length, want at least the 3 tries seen", waits)
	}
	node.Restart(t)
	s = startProcessWait(t, s)
	if code, body := health(t, s); code != http.StatusOK {
		t.Errorf("/healthcheck %d %q once Redis answered", code, body)
	}
	if got := decideOnce(t, s, "startup", "k", "a"); got != "OK" {
		t.Errorf("first call %s, want OK", got)
	}
	if got := decideOnce(t, s, "startup", "k", "a"); got != "OVER_LIMIT" {
		t.Errorf("second call %s, want OVER_LIMIT: counted in Redis", got)
	}
}

// TestReferenceRedisStartupGivesUp: REDIS_STARTUP_MAX_ELAPSED_TIME. With
// Redis down for longer, the process exits with an error naming it,
// having opened no port.
func TestReferenceRedisStartupGivesUp(t *testing.T) {
	t.Parallel()
	node := redistest.StartNode(t)
	node.Kill(t)
	root := rulesRoot(t, "domain: startup\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	cmd := exec.Command(asReference(t))
	cmd.Env = referenceEnv(root, node.Addr, "REDIS_STARTUP_INITIAL_INTERVAL=100ms", "REDIS_STARTUP_MAX_ELAPSED_TIME=700ms")
	s := launchProcess(t, cmd)
	select {
	case <-s.exited:
	case <-time.After(15 * time.Second):
		t.Fatal("still running 15s after a start-up limit of 700ms")
	}
	var exitErr *exec.ExitError
	if !errors.As(s.waitErr, &exitErr) || exitErr.ExitCode() == 0 {
		t.Errorf("exit %v, want a failure", s.waitErr)
	}
	logs := strings.Join(s.logLines(), "\n")
	if !strings.Contains(logs, "not reachable after") || !strings.Contains(logs, "-redis-startup-max-elapsed-time 700ms") {
		t.Errorf("the log does not say why it stopped:\n%s", logs)
	}
	if len(s.listening) != 0 {
		t.Errorf("ports opened: %v", s.listening)
	}
	// The limit is the reference's: 0 waits for ever (checked above: it
	// retried with no limit until Redis came).
}

// TestReferenceRedisHealthCheck: REDIS_HEALTH_CHECK_ACTIVE_CONNECTION.
// With it, health checks (HTTP and gRPC) report not serving while Redis is
// down and serving again once it is back; without it, health does not
// follow Redis, as in the reference.
func TestReferenceRedisHealthCheck(t *testing.T) {
	t.Parallel()
	node := redistest.StartNode(t)
	root := rulesRoot(t, "domain: health\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n")
	start := func(extra ...string) *server {
		cmd := exec.Command(asReference(t))
		cmd.Env = referenceEnv(root, node.Addr, extra...)
		return startProcess(t, cmd)
	}
	with := start("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=true")
	without := start()
	for _, s := range []*server{with, without} {
		if code, body := health(t, s); code != http.StatusOK {
			t.Fatalf("/healthcheck %d %q with Redis up", code, body)
		}
	}
	node.Kill(t)
	eventually(t, "health not serving with Redis down", func() bool {
		code, body := health(t, with)
		return code == http.StatusServiceUnavailable && body == "no connection to Redis"
	})
	if st := grpcHealth(t, with); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health %v with Redis down, want NOT_SERVING", st)
	}
	if code, body := health(t, without); code != http.StatusOK {
		t.Errorf("without the setting, /healthcheck %d %q with Redis down; the reference stays healthy", code, body)
	}
	node.Restart(t)
	eventually(t, "health serving with Redis back", func() bool {
		code, _ := health(t, with)
		return code == http.StatusOK
	})
	if st := grpcHealth(t, with); st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC health %v with Redis back, want SERVING", st)
	}
}

// TestReferenceHealthyWithConfigLoaded:
// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED. With rules over xDS and
// FORCE_START_WITHOUT_INITIAL_CONFIG, health reports not serving until a
// snapshot with a domain is in force, and again after one with none;
// calls are answered meanwhile. Without it, health serves throughout.
func TestReferenceHealthyWithConfigLoaded(t *testing.T) {
	t.Parallel()
	cp := xdstest.Start(t, nil)
	redis := redistest.Start(t)
	start := func(extra ...string) *server {
		cmd := exec.Command(asReference(t))
		cmd.Env = referenceEnv(t.TempDir(), redis.Addr, append([]string{"CONFIG_TYPE=GRPC_XDS_SOTW",
			"CONFIG_GRPC_XDS_SERVER_URL=" + cp.Addr, "FORCE_START_WITHOUT_INITIAL_CONFIG=true"}, extra...)...)
		return startProcess(t, cmd)
	}
	with := start("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true")
	without := start()
	if code, body := health(t, with); code != http.StatusServiceUnavailable || body != "waiting for rules" {
		t.Errorf("/healthcheck %d %q before any rules, want 503 waiting for rules", code, body)
	}
	if st := grpcHealth(t, with); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health %v before any rules, want NOT_SERVING", st)
	}
	if got := decideOnce(t, with, "api", "path", "/login"); got != "OK" {
		t.Errorf("a call before any rules: %s, want OK", got)
	}
	if code, _ := health(t, without); code != http.StatusOK {
		t.Errorf("without the setting, /healthcheck %d before any rules", code)
	}
	cp.Set(t, "default", "1", xdstest.Limit("api", "api", "path", "/login", 3, rlsconfv3.RateLimitUnit_HOUR))
	eventually(t, "health serving with a domain in force", func() bool {
		code, _ := health(t, with)
		return code == http.StatusOK
	})
	cp.Set(t, "default", "2")
	eventually(t, "health not serving with no domain in force", func() bool {
		code, body := health(t, with)
		return code == http.StatusServiceUnavailable && body == "waiting for rules"
	})
	if code, _ := health(t, without); code != http.StatusOK {
		t.Errorf("without the setting, /healthcheck %d with no domain", code)
	}
}
