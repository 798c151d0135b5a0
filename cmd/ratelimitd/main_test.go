package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
)

// env is a fake environment for Main.
type env map[string]string

func (e env) lookup(k string) (string, bool) { v, ok := e[k]; return v, ok }

func runMain(t *testing.T, e env, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = Main(context.Background(), args, e.lookup, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestCheckConfig(t *testing.T) {
	code, out, _ := runMain(t, nil, "check-config", "-config", "../../examples")
	if code != exitOK || !strings.HasPrefix(out, "ok: 9 rule files, 9 domains, 16 rules (hash ") {
		t.Fatalf("examples: exit %d, %q", code, out)
	}
	code, _, errOut := runMain(t, nil, "check-config", "-config", "../../pkg/config/testdata/invalid/missing_fields.yaml")
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	if code != exitError || len(lines) != 5 || !strings.HasPrefix(lines[0], "../../pkg/config/testdata/invalid/missing_fields.yaml:1:1: domain: missing") {
		t.Fatalf("invalid file: exit %d, stderr:\n%s", code, errOut)
	}
	// The environment supplies -config when the command line does not.
	code, out, _ = runMain(t, env{"RATELIMITD_CONFIG": "../../examples/auth.yaml"}, "check-config")
	if code != exitOK || !strings.HasPrefix(out, "ok: 1 rule files, 1 domains, 1 rules") {
		t.Fatalf("from RATELIMITD_CONFIG: exit %d, %q", code, out)
	}
	if code, _, errOut := runMain(t, nil, "check-config", "-config", "/nonexistent"); code != exitError || !strings.Contains(errOut, "no such file or directory") {
		t.Fatalf("missing path: exit %d, %q", code, errOut)
	}
}

func TestFlagsFromEnvironment(t *testing.T) {
	c := newServeConfig()
	fromEnv, err := parseFlags(c.flags, []string{"-grpc-addr", "127.0.0.1:1"}, env{
		"RATELIMITD_GRPC_ADDR":        "127.0.0.1:2", // the command line wins
		"RATELIMITD_HTTP_ADDR":        "127.0.0.1:3",
		"RATELIMITD_MEMORY_MAX_KEYS":  "42",
		"RATELIMITD_SHUTDOWN_TIMEOUT": "3s",
	}.lookup, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var memoryMaxKeys int
	for _, comp := range c.components {
		if b, ok := comp.(*backendStore); ok {
			memoryMaxKeys = b.memoryMaxKeys
		}
	}
	if c.serving.grpcAddr != "127.0.0.1:1" || c.serving.httpAddr != "127.0.0.1:3" || memoryMaxKeys != 42 || c.serving.shutdownTimeout != 3*time.Second {
		t.Fatalf("parsed %+v, -memory-max-keys %d", c.serving, memoryMaxKeys)
	}
	if fromEnv["http-addr"] != "RATELIMITD_HTTP_ADDR" || fromEnv["grpc-addr"] != "" {
		t.Fatalf("fromEnv = %v", fromEnv)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, c := range []struct {
		env  env
		args []string
		want string
	}{
		{nil, []string{"bogus"}, `unknown command "bogus"; commands: serve, check-config, version, help`},
		{nil, []string{"-backend", "etcd"}, `invalid -backend "etcd"; accepted: memory, redis`},
		{nil, []string{"-backend", "redis"}, `-redis-url is required with -backend redis`},
		{nil, []string{"-backend", "redis", "-redis-url", "redis://h:1", "-redis-mode", "ring"}, `invalid -redis-mode "ring"; accepted: standalone, sentinel, cluster`},
		{env{"RATELIMITD_BACKEND": "redis", "RATELIMITD_REDIS_URL": "redis://s:26379", "RATELIMITD_REDIS_MODE": "sentinel"}, nil, `-redis-master is required with -redis-mode sentinel`},
		{nil, []string{"-backend", "redis", "-redis-url", "redis://h:1", "-redis-master", "m"}, `-redis-master is only for -redis-mode sentinel`},
		{nil, []string{"-backend", "redis", "-redis-url", "redis://h:1", "-redis-hash-tag", "user"}, `invalid -redis-hash-tag "user"; accepted: descriptor, domain`},
		{nil, []string{"-backend", "redis", "-redis-url", "redis://h:1", "-redis-clock", "ntp"}, `invalid -redis-clock "ntp"; accepted: redis, local`},
		{nil, []string{"-backend", "redis", "-redis-url", "redis://h:1", "-redis-read-timeout", "0s"}, `invalid -redis-read-timeout 0s; it must be positive`},
		{nil, []string{"-backend", "redis", "-redis-url", "redis://:hunter2@a:1,redis://b:2"}, `invalid -redis-url: redis: standalone mode takes one address`},
		{nil, []string{"-backend", "redis", "-redis-url", "http://:hunter2@a:1"}, `invalid -redis-url: redis: address 1 of the URL (http://:xxxxx@a:1)`},
		{nil, []string{"-local-cache-keys", "-1"}, `invalid -local-cache-keys -1; it must not be negative`},
		{nil, []string{"-shutdown-delay", "-1s"}, `invalid -shutdown-delay -1s; it must not be negative`},
		{nil, []string{"-response-headers", "draft"}, `invalid value "draft" for flag -response-headers`},
		{nil, []string{"-near-limit-ratio", "0"}, `invalid -near-limit-ratio 0; it must be above 0 and at most 1`},
		{nil, []string{"-backend", "redis", "-redis-url", "redis://h:1", "-redis-coalesce", "-1"}, `invalid -redis-coalesce -1; it must not be negative`},
		{nil, []string{"-failure-mode", "deny"}, `invalid -failure-mode "deny"; accepted: open, closed, error, local`},
		{env{"RATELIMITD_LOCAL_SHARE": "1.5"}, nil, `invalid RATELIMITD_LOCAL_SHARE 1.5; it must be above 0 and at most 1`},
		{nil, []string{"-backend-timeout", "0s"}, `invalid -backend-timeout 0s; it must be positive`},
		{nil, []string{"-circuit-cooldown", "-1s"}, `invalid -circuit-cooldown -1s; it must be positive`},
		{nil, []string{"-circuit-failures", "0"}, `invalid -circuit-failures 0; it must be at least 1`},
		{env{"RATELIMITD_LOG_FORMAT": "xml"}, nil, `invalid RATELIMITD_LOG_FORMAT "xml"; accepted: text, json`},
		{env{"RATELIMITD_MAX_ENTRIES": "many"}, nil, `invalid value "many" for RATELIMITD_MAX_ENTRIES`},
		{nil, []string{"-max-descriptors", "0"}, `invalid -max-descriptors 0; it must be at least 1`},
		{nil, []string{"-no-such-flag"}, `flag provided but not defined: -no-such-flag`},
		{nil, []string{"serve", "extra"}, `unexpected argument "extra"`},
		{env{"RATELIMITD_GRPC_ADDR": ""}, nil, `invalid RATELIMITD_GRPC_ADDR: it must not be empty`},
		{nil, []string{"-max-domain-bytes", "0"}, `invalid -max-domain-bytes 0; it must be at least 1`},
		{nil, []string{"-rlqs-default", "maybe"}, `invalid -rlqs-default "maybe"; accepted: allow, deny`},
		{env{"RATELIMITD_RLQS_HEADROOM": "0.5"}, nil, `invalid RATELIMITD_RLQS_HEADROOM 0.5; it must be at least 1`},
		{nil, []string{"-rlqs-floor", "0"}, `invalid -rlqs-floor 0; it must be above 0`},
		{nil, []string{"-rlqs-max-buckets", "100", "-rlqs-max-stream-buckets", "10"}, `invalid -rlqs-max-stream-buckets 10; it must be at least -rlqs-max-buckets (100)`},
		{nil, []string{"-rlqs-reporting-interval", "0s"}, `invalid -rlqs-reporting-interval 0s; it must be at least 1ms`},
	} {
		code, _, errOut := runMain(t, c.env, c.args...)
		if code != exitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("%v %v: exit %d, stderr %q; want exit 2 and %q", c.env, c.args, code, errOut, c.want)
		}
		if strings.Contains(errOut, "hunter2") {
			t.Errorf("%v %v: stderr shows the password: %q", c.env, c.args, errOut)
		}
	}
}

func TestHelpAndVersion(t *testing.T) {
	for _, arg := range []string{"help", "-h", "--help"} {
		code, out, _ := runMain(t, nil, arg)
		if code != exitOK || !strings.Contains(out, "-grpc-addr address") || !strings.Contains(out, "RATELIMITD_GRPC_ADDR") {
			t.Errorf("%s: exit %d, %q", arg, code, out)
		}
	}
	for _, args := range [][]string{{"serve", "-h"}, {"check-config", "-h"}} {
		code, _, errOut := runMain(t, nil, args...)
		if code != exitOK || !strings.Contains(errOut, "-config") {
			t.Errorf("%v: exit %d, %q; want the flags and exit 0", args, code, errOut)
		}
	}
	code, out, _ := runMain(t, nil, "version")
	if code != exitOK || !strings.HasPrefix(out, "ratelimitd ") {
		t.Errorf("version: exit %d, %q", code, out)
	}
}

func TestServeFailsOnBadRules(t *testing.T) {
	code, _, errOut := runMain(t, nil, "-config", "../../pkg/config/testdata/invalid/unknown_unit.yaml",
		"-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0")
	if code != exitError || !strings.Contains(errOut, `unknown unit \"minutes\"`) {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
}

// lineWriter hands each written log line to a channel, dropping lines
// nobody waits for so the server never blocks on its logs.
type lineWriter struct{ lines chan string }

func (w lineWriter) Write(p []byte) (int, error) {
	sc := bufio.NewScanner(bytes.NewReader(p))
	for sc.Scan() {
		select {
		case w.lines <- sc.Text():
		default:
		}
	}
	return len(p), nil
}

// TestServeInProcess runs serve on free ports, calls it over gRPC and
// HTTP, and stops it through the context as a signal would.
func TestServeInProcess(t *testing.T) {
	p := startServe(t, true, "-config", "../../examples")
	ctx := context.Background()
	addrs := p.addrs

	conn, err := grpc.NewClient(addrs["serving gRPC"], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := &rlsv3.RateLimitRequest{Domain: "posts", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user_id", Value: "alice"}}}}}
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req)
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 2 {
		t.Fatalf("ShouldRateLimit: %v, %v", resp, err)
	}
	hr, err := http.Get(fmt.Sprintf("http://%s/healthcheck", addrs["serving HTTP"]))
	if err != nil || hr.StatusCode != http.StatusOK {
		t.Fatalf("healthcheck: %v, %v", hr, err)
	}
	hr.Body.Close()

	if code := p.stop(t); code != exitOK {
		t.Fatalf("exit %d after shutdown, want 0", code)
	}
}

func TestWatchEvictionsWarns(t *testing.T) {
	b := memory.New(memory.Options{MaxKeys: 1, SweepInterval: -1})
	defer b.Close()
	logs := lineWriter{lines: make(chan string, 10)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		watchEvictions(ctx, b.Evictions, memoryEvictionsWarning, slog.New(slog.NewTextHandler(logs, nil)), time.Millisecond)
		close(done)
	}()

	reqs := []algo.Request{{Limit: algo.Limit{Requests: 1, Window: time.Hour}, Hits: 1}}
	out := make([]algo.Decision, 1)
	for _, k := range []string{"a", "b"} { // the second evicts the first
		reqs[0].Key = []byte(k)
		if err := b.Decide(ctx, reqs, out); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case line := <-logs.lines:
		if !strings.Contains(line, "raise -memory-max-keys") || !strings.Contains(line, "evicted=1") {
			t.Fatalf("log line %q", line)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no warning within 30s of an eviction")
	}
	cancel()
	<-done
}

// TestServeUnixSocket serves gRPC on a Unix socket (-grpc-addr unix:PATH,
// the reference's GRPC_UDS), replacing a socket file a previous run left.
func TestServeUnixSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "ratelimit.sock")
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close() // the file stays, as after a crash
	p := startServe(t, false, "-config", "../../examples", "-grpc-addr", "unix:"+sock)
	if a := p.addr(t, "serving gRPC"); a != sock {
		t.Fatalf("serving gRPC at %q, want %q", a, sock)
	}
	ctx := context.Background()
	conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "posts", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user_id", Value: "alice"}}}}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit over the socket: %v, %v", resp, err)
	}
	if code := p.stop(t); code != exitOK {
		t.Fatalf("exit %d", code)
	}
}
