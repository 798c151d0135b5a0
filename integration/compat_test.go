package integration

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/reftest"
)

// asReference links the ratelimitd binary into a directory of the test as
// bin/ratelimit, the reference image's entry point, as the image links it,
// and returns its path. A link, not a copy: a copy just written cannot be
// started while another test's fork still holds it open for writing
// (ETXTBSY, "text file busy"), which parallel tests made happen.
func asReference(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bin", "ratelimit")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(binary, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// referenceEnv is the environment of a reference container on free
// loopback ports, with rules in root/ratelimit/config and Redis at addr,
// plus extra.
func referenceEnv(root, redisAddr string, extra ...string) []string {
	return referenceEnvOn(root, redisAddr, "0", "0", "0", extra...)
}

// referenceEnvOn is the environment of a reference server on the given
// loopback ports (the reference itself cannot take port 0: it would not
// say which it got).
func referenceEnvOn(root, redisAddr, httpPort, grpcPort, debugPort string, extra ...string) []string {
	return append([]string{
		"PATH=" + os.Getenv("PATH"),
		"HOST=127.0.0.1", "PORT=" + httpPort,
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + grpcPort,
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + debugPort,
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_IGNOREDOTFILES=true",
		"LOG_LEVEL=info", "LOG_FORMAT=json",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisAddr,
		"USE_STATSD=false",
	}, extra...)
}

// TestReferenceEnvironment starts the binary as /bin/ratelimit with a
// reference container's environment only, no flag: it serves the rule
// files of RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config from the Redis of
// REDIS_URL, answers /healthcheck, and names in one warning the settings
// it does not honour.
func TestReferenceEnvironment(t *testing.T) {
	t.Parallel()
	redis := redistest.Start(t)
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	rules := "domain: gateway\ndescriptors:\n  - key: client\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"
	if err := os.WriteFile(filepath.Join(dir, "gateway.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(asReference(t))
	// A setting ignored, and two set that neither server reads with the
	// others given: all three are named at start.
	cmd.Env = referenceEnv(root, redis.Addr, "REDIS_PIPELINE_WINDOW=150us", "MEMCACHE_HOST_PORT=memcached:11211", "REDIS_PERSECOND_URL=127.0.0.1:2")
	s := startProcess(t, cmd)

	rls := rlsv3.NewRateLimitServiceClient(s.dial(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var codes []rlsv3.RateLimitResponse_Code
	for range 3 {
		resp, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "gateway", Descriptors: []*rlv3.RateLimitDescriptor{
			{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "client", Value: "a"}}}}})
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, resp.OverallCode)
	}
	if want := []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT}; !slices.Equal(codes, want) {
		t.Errorf("decisions %v, want %v", codes, want)
	}
	// The count is in the Redis of REDIS_URL.
	admin := goredis.NewClient(&goredis.Options{Addr: redis.Addr})
	defer admin.Close()
	if n, err := admin.DBSize(ctx).Result(); err != nil || n == 0 {
		t.Errorf("keys in the Redis of REDIS_URL: %d, %v; want the counter", n, err)
	}
	resp, err := http.Get("http://" + s.httpAddr + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthcheck: %d %s", resp.StatusCode, body)
	}
	// /rlconfig on the debug port too, where the reference serves it.
	if rc := httpGet(t, "http://"+s.addr(t, "serving profiles (pprof): keep this address private")+"/rlconfig"); !strings.Contains(rc, "gateway.client: unit=MINUTE requests_per_unit=2") {
		t.Errorf("/rlconfig on the debug port:\n%s", rc)
	}
	logs := strings.Join(s.logLines(), "\n")
	for _, want := range []string{"compatibility mode", "settings not honoured", "REDIS_PIPELINE_WINDOW", "MEMCACHE_HOST_PORT (a setting of the reference's memcached backend", "REDIS_PERSECOND_URL (not read"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs do not say %q:\n%s", want, logs)
		}
	}
}

// TestReferenceEnvironmentRefused: a setting that would change decisions
// stops the start with exit code 2, naming it.
func TestReferenceEnvironmentRefused(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(asReference(t))
	cmd.Env = referenceEnv(t.TempDir(), "127.0.0.1:1", "REDIS_PERSECOND=true", "REDIS_PERSECOND_URL=127.0.0.1:2")
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 2 || !strings.Contains(string(out), "REDIS_PERSECOND=true") {
		t.Fatalf("exit %v, want 2 naming REDIS_PERSECOND:\n%s", err, out)
	}
}

// TestReferenceEnvironmentMutualTLS: GRPC_SERVER_USE_TLS with
// GRPC_CLIENT_TLS_CACERT and GRPC_CLIENT_TLS_SAN require a client
// certificate of that CA valid for that name, as the reference does.
func TestReferenceEnvironmentMutualTLS(t *testing.T) {
	t.Parallel()
	redis := redistest.Start(t)
	certs := redistest.WriteCerts(t)
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "gateway.yaml"), []byte("domain: gateway\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	call := func(addr string, withCert bool) error {
		cfg := certs.MutualClient()
		if !withCert {
			cfg.Certificates = nil
		}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "gateway", Descriptors: []*rlv3.RateLimitDescriptor{
			{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "client", Value: "a"}}}}})
		return err
	}
	for _, c := range []struct {
		san     string
		withOK  bool // a client with the certificate is served
		without bool // a client without one is served
	}{
		{"localhost", true, false},  // the certificate holds localhost
		{"elsewhere", false, false}, // it does not hold this name
	} {
		cmd := exec.Command(asReference(t))
		cmd.Env = referenceEnv(root, redis.Addr, "GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT="+certs.Cert, "GRPC_SERVER_TLS_KEY="+certs.Key,
			"GRPC_CLIENT_TLS_CACERT="+certs.CA, "GRPC_CLIENT_TLS_SAN="+c.san)
		s := startProcess(t, cmd)
		if err := call(s.grpcAddr, true); (err == nil) != c.withOK {
			t.Errorf("SAN %s, client with a certificate for localhost: %v; served: want %v", c.san, err, c.withOK)
		}
		if err := call(s.grpcAddr, false); (err == nil) != c.without {
			t.Errorf("SAN %s, client without a certificate: %v; served: want %v", c.san, err, c.without)
		}
	}
}

// TestReferenceRuleFiles runs the binary as /bin/ratelimit on the runtime
// tree envoyproxy/ratelimit was run on (pkg/config/testdata/reference/
// layout), under RUNTIME_WATCH_ROOT=true and false, and answers every
// descriptor as the reference answered it there (layout.answers.txt,
// recorded from its commit f2fb157): rule files in subdirectories and of
// any name read, rate_limit: null as no limit, a top-level name, an empty
// trailing document, a field given twice (the last wins), a second
// document not read. The start-up log warns of each, naming file and line.
func TestReferenceRuleFiles(t *testing.T) {
	t.Parallel()
	sections, err := reftest.Read("../pkg/config/testdata/reference/layout.answers.txt")
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("../pkg/config/testdata/reference/layout/rt")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sections {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			redis := redistest.Start(t)
			cmd := exec.Command(asReference(t))
			cmd.Env = referenceEnv(root, redis.Addr, s.Name)
			srv := startProcess(t, cmd)
			replay(t, rlsv3.NewRateLimitServiceClient(srv.dial(t)), s)
			logs := strings.Join(srv.logLines(), "\n")
			for _, want := range []string{
				"config/dup.yaml:5:5: descriptors[0].rate_limit: given twice",
				"config/sub/nested.yaml:1:1: name: not used",
				"config/sub/nested.yaml:6:1: an empty YAML document",
				"config/twodocs.yaml:5:1: a second YAML document, not read",
				"config/linkdir: not read: a symbolic link to a directory",
			} {
				if !strings.Contains(logs, want) {
					t.Errorf("the start-up log does not warn %q", want)
				}
			}
		})
	}
}

// replay sends each descriptor of a recording of the reference as many
// times as it answered it there, and compares every answer: overall code,
// the descriptor's code, its current limit and what remains.
func replay(t *testing.T, rls rlsv3.RateLimitServiceClient, s reftest.Section) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range s.Cases {
		entries := make([]*rlv3.RateLimitDescriptor_Entry, len(c.Entries))
		for i, e := range c.Entries {
			entries[i] = &rlv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value}
		}
		for i, want := range c.Answers {
			resp, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: c.Domain,
				Descriptors: []*rlv3.RateLimitDescriptor{{Entries: entries}}})
			if err != nil {
				t.Fatalf("%s %v call %d: %v", c.Domain, c.Entries, i+1, err)
			}
			st := resp.Statuses[0]
			got := reftest.Answer{Overall: resp.OverallCode.String(), Code: st.Code.String(),
				Limit: st.GetCurrentLimit().GetRequestsPerUnit(), Remaining: st.LimitRemaining}
			if st.CurrentLimit != nil {
				got.Unit = st.CurrentLimit.Unit.String()
			}
			if got != want {
				t.Errorf("%s %v call %d: %+v; the reference answered %+v", c.Domain, c.Entries, i+1, got, want)
			}
		}
	}
}

// TestEnvoyGatewayRuleFiles runs the binary as /bin/ratelimit on six rule
// files written in exactly the shape Envoy Gateway generates
// (integration/testdata/envoygateway/rt/ratelimit/config, each naming the
// file of envoyproxy/gateway d32f282 it follows: a top-level name,
// rate_limit: null on every intermediate descriptor, empty name, replaces
// and descriptors, every flag written out) and decides descriptors built
// as Envoy Gateway's route actions build them exactly as the reference
// decided them on the same files (answers.txt, from its commit f2fb157).
func TestEnvoyGatewayRuleFiles(t *testing.T) {
	t.Parallel()
	sections, err := reftest.Read("testdata/envoygateway/answers.txt")
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("testdata/envoygateway/rt")
	if err != nil {
		t.Fatal(err)
	}
	// The limits are per hour, month and year: stay away from the hour's
	// end, where two calls could fall in two windows.
	if left := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)); left < 10*time.Second {
		time.Sleep(left + time.Second)
	}
	redis := redistest.Start(t)
	cmd := exec.Command(asReference(t))
	cmd.Env = referenceEnv(root, redis.Addr)
	srv := startProcess(t, cmd)
	s := reftest.Find(sections, "envoygateway")
	if s == nil || len(s.Cases) < 10 {
		t.Fatal("no recorded answers")
	}
	replay(t, rlsv3.NewRateLimitServiceClient(srv.dial(t)), *s)
	if logs := strings.Join(srv.logLines(), "\n"); strings.Count(logs, "name: not used") != 6 {
		t.Errorf("the start-up log does not warn once per file of the unused top-level name:\n%s", logs)
	}
}

// TestReferenceRulesDoNotLoad: where the reference keeps running with no
// rules (every call an error, health 200), ratelimitd in compatibility
// mode exits with status 1 before opening any port, listing every problem
// of every file, FORCE_START_WITHOUT_INITIAL_CONFIG or not; that setting
// is named as without effect with files (docs/migrating.md).
func TestReferenceRulesDoNotLoad(t *testing.T) {
	t.Parallel()
	redis := redistest.Start(t)
	root := rulesRoot(t, "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minutes, requests_per_unit: 1}\n")
	bad := filepath.Join(root, "ratelimit", "config", "sub", "b.yaml")
	if err := os.MkdirAll(filepath.Dir(bad), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("domain: b\ndescriptors:\n  - kee: k\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, force := range []string{"false", "true"} {
		cmd := exec.Command(asReference(t))
		cmd.Env = referenceEnv(root, redis.Addr, "FORCE_START_WITHOUT_INITIAL_CONFIG="+force)
		s := launchProcess(t, cmd)
		select {
		case <-s.exited:
		case <-time.After(30 * time.Second):
			t.Fatalf("FORCE_START_WITHOUT_INITIAL_CONFIG=%s: still running with rules that do not load", force)
		}
		var exitErr *exec.ExitError
		if !errors.As(s.waitErr, &exitErr) || exitErr.ExitCode() != 1 {
			t.Errorf("FORCE_START_WITHOUT_INITIAL_CONFIG=%s: exit %v, want status 1", force, s.waitErr)
		}
		logs := strings.Join(s.logLines(), "\n")
		for _, want := range []string{
			`config/rules.yaml:4:24: descriptors[0].rate_limit.unit: unknown unit \"minutes\"`,
			`config/sub/b.yaml:3:5: descriptors[0].kee: unknown field \"kee\"`,
		} {
			if !strings.Contains(logs, want) {
				t.Errorf("FORCE_START_WITHOUT_INITIAL_CONFIG=%s: the log does not list %s:\n%s", force, want, logs)
			}
		}
		if force == "true" && !strings.Contains(logs, "FORCE_START_WITHOUT_INITIAL_CONFIG (with rule files, nothing is waited for") {
			t.Errorf("FORCE_START_WITHOUT_INITIAL_CONFIG=true is not named as without effect:\n%s", logs)
		}
		if len(s.listening) != 0 {
			t.Errorf("ports opened: %v", s.listening)
		}
	}
}
