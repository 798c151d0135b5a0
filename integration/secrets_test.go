package integration

import (
	"context"
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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

// secret is the password every case of TestSecretsNeverShown gives.
const secret = "hunter2-4f1c"

// TestSecretsNeverShown runs the real binary every way a Redis password
// can reach it and looks for the password, and the Redis address, where
// people other than the operator look:
//
//   - the start-up error of a URL that go-redis refuses, with the password
//     as a query parameter or as user info;
//   - the logs of a server whose Redis cannot be reached, from the flag, in
//     Sentinel mode with a sentinel password, and in compatibility mode
//     from REDIS_AUTH;
//   - /debug/pprof/cmdline on -debug-addr;
//   - what callers are told in failure mode error: gRPC (RLS, Check,
//     Reset) and /json, which must name neither the password nor the
//     address.
func TestSecretsNeverShown(t *testing.T) {
	t.Parallel()
	dead := redistest.StartNode(t)
	dead.Kill(t)

	t.Run("start-up errors", func(t *testing.T) {
		for _, url := range []string{
			"redis://" + dead.Addr + "/0?password=" + secret,
			"redis://:" + secret + "@" + dead.Addr + "/0?nosuchoption=1",
			"redis://:" + secret + "@" + dead.Addr + ",redis://h:1/0?password=" + secret,
		} {
			for _, mode := range []string{"standalone", "sentinel", "cluster"} {
				args := []string{"-config", "../examples", "-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0",
					"-backend", "redis", "-redis-mode", mode, "-redis-url", url}
				if mode == "sentinel" {
					args = append(args, "-redis-master", "m")
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				out, err := exec.CommandContext(ctx, binary, args...).CombinedOutput()
				cancel()
				var exitErr *exec.ExitError
				if !errors.As(err, &exitErr) || exitErr.ExitCode() != 2 {
					t.Errorf("%s mode: exit %v, want 2 (a flag to fix):\n%s", mode, err, out)
				}
				if strings.Contains(string(out), secret) || !strings.Contains(string(out), "xxxxx") {
					t.Errorf("%s mode: the start-up error shows the password, or no masked URL:\n%s", mode, out)
				}
			}
		}
	})

	check := func(t *testing.T, s *server, debug bool) {
		t.Helper()
		conn := s.dial(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var errs []error
		_, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, descriptorRequest("secrets", "user", "u"))
		errs = append(errs, err)
		own := ratelimitdv1.NewRateLimiterClient(conn)
		d := []*ratelimitdv1.Descriptor{{Entries: []*ratelimitdv1.Entry{{Key: "user", Value: "u"}}}}
		_, err = own.Check(ctx, &ratelimitdv1.CheckRequest{Domain: "secrets", Descriptors: d})
		errs = append(errs, err)
		_, err = own.Reset(ctx, &ratelimitdv1.ResetRequest{Domain: "secrets", Descriptor_: d[0]})
		errs = append(errs, err)
		for i, err := range errs {
			if status.Code(err) != codes.Unavailable {
				t.Errorf("call %d: %v, want Unavailable", i, err)
			}
			if msg := status.Convert(err).Message(); strings.Contains(msg, secret) || strings.Contains(msg, dead.Addr) {
				t.Errorf("call %d tells the caller %q: the address or the password", i, msg)
			}
		}
		code, body := postJSON(t, "http://"+s.httpAddr+"/json", `{"domain":"secrets","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}`)
		if code != 503 || strings.Contains(body, dead.Addr) || strings.Contains(body, secret) {
			t.Errorf("/json: %d %s; want 503 naming neither the address nor the password", code, body)
		}
		if debug {
			cmdline := httpGet(t, "http://"+s.addr(t, "serving profiles (pprof): keep this address private")+"/debug/pprof/cmdline")
			if strings.Contains(cmdline, secret) || !strings.Contains(cmdline, "redis://:xxxxx@") {
				t.Errorf("/debug/pprof/cmdline shows the password, or no masked URL: %q", cmdline)
			}
		}
		logs := strings.Join(s.logLines(), "\n")
		if strings.Contains(logs, secret) {
			t.Errorf("the logs show the password:\n%s", logs)
		}
		if !strings.Contains(logs, dead.Addr) {
			t.Errorf("the logs do not name the Redis address, which operators need:\n%s", logs)
		}
	}
	rules := t.TempDir()
	if err := os.WriteFile(filepath.Join(rules, "secrets.yaml"), []byte("domain: secrets\ndescriptors:\n  - key: user\n    rate_limit: {requests_per_unit: 10, unit: hour}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"-config", rules, "-backend", "redis", "-failure-mode", "error", "-enable-reset", "-debug-addr", "127.0.0.1:0"}

	t.Run("standalone", func(t *testing.T) {
		check(t, startServer(t, append(base, "-redis-url", "redis://:"+secret+"@"+dead.Addr)...), true)
	})
	t.Run("sentinel", func(t *testing.T) {
		check(t, startServer(t, append(base, "-redis-mode", "sentinel", "-redis-master", "m",
			"-redis-url", "redis://:"+secret+"@"+dead.Addr, "-redis-sentinel-password="+secret)...), true)
	})
	t.Run("compat", func(t *testing.T) {
		root := t.TempDir()
		dir := filepath.Join(root, "ratelimit", "config")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(filepath.Join(rules, "secrets.yaml"))
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "secrets.yaml"), data, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
		// As the reference, compatibility mode waits for Redis before
		// opening a port, and logs each retry: with the address, without
		// the password.
		cmd := exec.Command(asReference(t))
		cmd.Env = referenceEnv(root, dead.Addr, "REDIS_AUTH=user:"+secret)
		w := launchProcess(t, cmd)
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(strings.Join(w.logLines(), "\n"), "redis not reachable at start") {
			if time.Now().After(deadline) {
				t.Fatalf("no retry logged within 30s of a start whose Redis is down:\n%s", strings.Join(w.logLines(), "\n"))
			}
			time.Sleep(50 * time.Millisecond)
		}
		if logs := strings.Join(w.logLines(), "\n"); strings.Contains(logs, secret) || !strings.Contains(logs, dead.Addr) {
			t.Errorf("the start-up retries show the password, or not the address:\n%s", logs)
		}
		w.stop(t)
		// Told not to wait, it serves, by the failure mode.
		cmd = exec.Command(asReference(t), "-failure-mode", "error", "-enable-reset", "-redis-startup-initial-interval", "0")
		cmd.Env = referenceEnv(root, dead.Addr, "REDIS_AUTH=user:"+secret)
		check(t, startProcess(t, cmd), false)
	})
}

// postJSON posts body to url and returns the status code and the body of
// the answer.
func postJSON(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}
