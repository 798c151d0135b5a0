// Package integration tests ratelimitd as its users run it: the real
// binary, started as a process on free loopback ports.
package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

// startupTimeout bounds how long a server may take to log its addresses.
const startupTimeout = 60 * time.Second

// binary is the ratelimitd executable TestMain builds for every test of
// this package; it is set once, before any test runs.
var binary string

// TestMain compiles ratelimitd once into a temporary directory.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ratelimitd-integration")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "ratelimitd")
	out, err := exec.Command("go", "build", "-o", binary, "../cmd/ratelimitd").CombinedOutput()
	code := 1
	if err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
	} else {
		code = m.Run()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// server is a running ratelimitd process.
type server struct {
	cmd      *exec.Cmd
	grpcAddr string
	httpAddr string
	exited   chan struct{}
	waitErr  error

	addrs chan [2]string // log message and address of listeners, for startProcess

	mu        sync.Mutex
	logs      []string
	listening map[string]string // log message → address, of every listener logged
}

// addr returns the address the server logged with msg, such as "serving
// reference metrics", or fails.
func (s *server) addr(t *testing.T, msg string) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s.mu.Lock()
		a, ok := s.listening[msg]
		seen := fmt.Sprint(s.listening)
		s.mu.Unlock()
		if ok {
			return a
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the logs within 10s: %s", msg, seen)
		}
	}
}

// startServer starts ratelimitd on free loopback ports with the example
// rules and JSON logs, and waits until it logs where it listens.
func startServer(t *testing.T, extraArgs ...string) *server {
	t.Helper()
	args := append([]string{
		"-config", "../examples",
		"-grpc-addr", "127.0.0.1:0",
		"-http-addr", "127.0.0.1:0",
		"-log-format", "json",
		// Stopped at once; TestShutdownDelay sets its own.
		"-shutdown-delay", "0s",
	}, extraArgs...)
	return startProcess(t, exec.Command(binary, args...))
}

// textAddr finds the message and address of a text log line.
var textAddr = regexp.MustCompile(`msg="([^"]*)".* addr=(\S+)`)

// listening returns the message and address of a log line that gives an
// address, in JSON or in text; "" when it gives none.
func listening(line string) (msg, addr string) {
	var rec struct{ Msg, Addr string }
	if json.Unmarshal([]byte(line), &rec) == nil {
		return rec.Msg, rec.Addr
	}
	if m := textAddr.FindStringSubmatch(line); m != nil {
		return m[1], m[2]
	}
	return "", ""
}

// startProcess starts cmd, a ratelimitd logging at level info or more,
// and waits until it logs where it listens.
func startProcess(t *testing.T, cmd *exec.Cmd) *server {
	t.Helper()
	return startProcessWait(t, launchProcess(t, cmd))
}

// startProcessWait waits until s, launched by launchProcess, logs where
// it listens, and returns it.
func startProcessWait(t *testing.T, s *server) *server {
	t.Helper()
	deadline := time.After(startupTimeout)
	for s.grpcAddr == "" || s.httpAddr == "" {
		select {
		case a := <-s.addrs:
			switch a[0] {
			case "serving gRPC":
				s.grpcAddr = a[1]
			case "serving HTTP":
				s.httpAddr = a[1]
			}
		case <-s.exited:
			t.Fatalf("ratelimitd exited before serving: %v\n%s", s.waitErr, strings.Join(s.logLines(), "\n"))
		case <-deadline:
			t.Fatalf("ratelimitd did not log its addresses within %v", startupTimeout)
		}
	}
	return s
}

// launchProcess starts cmd, a ratelimitd logging at level info or more,
// and returns at once: startProcess waits for its addresses.
func launchProcess(t *testing.T, cmd *exec.Cmd) *server {
	t.Helper()
	s := &server{cmd: cmd, exited: make(chan struct{}), listening: map[string]string{}, addrs: make(chan [2]string, 16)}
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			s.mu.Lock()
			s.logs = append(s.logs, line)
			s.mu.Unlock()
			if msg, addr := listening(line); addr != "" {
				select {
				case s.addrs <- [2]string{msg, addr}:
				default: // more listeners than startProcess reads
				}
				s.mu.Lock()
				s.listening[msg] = addr
				s.mu.Unlock()
			}
		}
		s.waitErr = s.cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() {
		s.cmd.Process.Kill()
		<-s.exited
		if t.Failed() {
			t.Logf("server logs:\n%s", strings.Join(s.logLines(), "\n"))
		}
	})
	return s
}

func (s *server) logLines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.logs...)
}

// stop sends SIGTERM and returns the exit code.
func (s *server) stop(t *testing.T) int {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("ratelimitd did not exit within 30s of SIGTERM")
	}
	var exitErr *exec.ExitError
	if errors.As(s.waitErr, &exitErr) {
		return exitErr.ExitCode()
	}
	if s.waitErr != nil {
		t.Fatal(s.waitErr)
	}
	return 0
}

func (s *server) dial(t *testing.T) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func basicAuth() *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "auth", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "auth_type", Value: "basic"}}},
	}}
}

// TestServer starts the real binary and uses every endpoint it serves.
func TestServer(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := s.dial(t)

	// The example rule admits 5 basic-auth logins per minute. A window
	// boundary could fall between the calls, so look for the sixth refusal
	// within two windows' worth of calls.
	rls := rlsv3.NewRateLimitServiceClient(conn)
	var seen []rlsv3.RateLimitResponse_Code
	for range 6 {
		resp, err := rls.ShouldRateLimit(ctx, basicAuth())
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		seen = append(seen, resp.OverallCode)
		if st := resp.Statuses[0]; st.CurrentLimit.GetName() != "basic_auth_logins" || st.CurrentLimit.GetRequestsPerUnit() != 5 {
			t.Fatalf("status %v", st)
		}
	}
	if seen[5] != rlsv3.RateLimitResponse_OVER_LIMIT {
		// A minute boundary fell between the calls; the new window is now
		// filled by at most 5 more.
		for range 5 {
			resp, _ := rls.ShouldRateLimit(ctx, basicAuth())
			seen = append(seen, resp.GetOverallCode())
		}
	}
	if seen[len(seen)-1] != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("codes %v: the limit of 5 per minute never refused", seen)
	}

	if _, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "auth"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no descriptors: %v, want InvalidArgument", err)
	}

	hc, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
	if err != nil || hc.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v, %v", hc, err)
	}
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{
		FileContainingSymbol: "envoy.service.ratelimit.v3.RateLimitService"}})
	if r, err := stream.Recv(); err != nil || len(r.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
		t.Fatalf("reflection has no descriptor for the RLS service: %v, %v", r, err)
	}
	// An open stream would hold up the graceful shutdown below.
	stream.CloseSend()
	if _, err := stream.Recv(); err != io.EOF {
		t.Fatalf("reflection stream did not end: %v", err)
	}

	// The same limit over HTTP: 429 at once, or, if a minute boundary has
	// passed since the calls above, by the sixth call.
	body := `{"domain":"auth","descriptors":[{"entries":[{"key":"auth_type","value":"basic"}]}]}`
	for i := 1; ; i++ {
		resp, err := http.Post("http://"+s.httpAddr+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests && strings.Contains(string(b), `"overallCode":"OVER_LIMIT"`) {
			break
		}
		if resp.StatusCode != http.StatusOK || i == 6 {
			t.Fatalf("/json call %d: %d %s", i, resp.StatusCode, b)
		}
	}
	for path, want := range map[string]string{
		"/healthcheck": "OK\n",
		"/rlconfig":    "auth.auth_type_basic: unit=MINUTE requests_per_unit=5",
		"/metrics":     "\nratelimitd_memory_keys ",
	} {
		resp, err := http.Get("http://" + s.httpAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), want) {
			t.Errorf("%s: %d %q, want 200 containing %q", path, resp.StatusCode, b, want)
		}
	}

	if code := s.stop(t); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	if logs := strings.Join(s.logLines(), "\n"); !strings.Contains(logs, `"msg":"stopped"`) || strings.Contains(logs, "cut short") {
		t.Errorf("want a \"stopped\" log line and no call cut short:\n%s", logs)
	}
}

// TestShutdownUnderLoad sends SIGTERM while clients are calling: the server
// exits 0, and every call either succeeds or is refused because the server
// is going away; none fails otherwise.
func TestShutdownUnderLoad(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	conn := s.dial(t)
	rls := rlsv3.NewRateLimitServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		ok       int
		bad      []error
		stopping = make(chan struct{})
	)
	for w := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				req := &rlsv3.RateLimitRequest{Domain: "posts", Descriptors: []*rlv3.RateLimitDescriptor{
					{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user_id", Value: string(rune('a'+w)) + string(rune('a'+i%26))}}}}}
				_, err := rls.ShouldRateLimit(ctx, req)
				mu.Lock()
				switch {
				case err == nil:
					ok++
				case status.Code(err) == codes.Unavailable:
					mu.Unlock()
					return // the server has gone away
				default:
					bad = append(bad, err)
				}
				mu.Unlock()
				select {
				case <-stopping:
					if i > 2000 {
						return
					}
				default:
				}
				if i > 20000 {
					return // bounded, whatever happens
				}
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	close(stopping)
	code := s.stop(t)
	wg.Wait()
	if code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	if len(bad) > 0 {
		t.Fatalf("%d calls failed with other than Unavailable, first: %v", len(bad), bad[0])
	}
	if logs := strings.Join(s.logLines(), "\n"); strings.Contains(logs, "cut short") {
		t.Fatalf("calls were cut short instead of drained:\n%s", logs)
	}
	if ok == 0 {
		t.Fatal("no call succeeded")
	}
}

// TestShutdownDelay sends SIGTERM to a server with -shutdown-delay 2s:
// at once its health checks (HTTP and gRPC) report not serving, while it
// still decides every call, so that load balancers stop sending before
// it goes; it closes its listeners only after the delay, then exits 0.
func TestShutdownDelay(t *testing.T) {
	t.Parallel()
	const delay = 2 * time.Second
	s := startServer(t, "-shutdown-delay", delay.String())
	conn := s.dial(t)
	rls := rlsv3.NewRateLimitServiceClient(conn)
	health := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	healthcheck := func() int {
		resp, err := http.Get("http://" + s.httpAddr + "/healthcheck")
		if err != nil {
			t.Fatalf("GET /healthcheck: %v", err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	decide := func() error {
		_, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "posts", Descriptors: []*rlv3.RateLimitDescriptor{
			{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user_id", Value: "delay"}}}}})
		return err
	}
	if code := healthcheck(); code != http.StatusOK {
		t.Fatalf("/healthcheck before SIGTERM: %d", code)
	}

	sent := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Not serving within a moment of the signal...
	for healthcheck() != http.StatusServiceUnavailable {
		if time.Since(sent) > delay/2 {
			t.Fatalf("/healthcheck still 200 %v after SIGTERM", time.Since(sent))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// ... and yet serving calls, for the delay.
	checks := 0
	for time.Since(sent) < delay-300*time.Millisecond {
		if err := decide(); err != nil {
			t.Fatalf("a call %v after SIGTERM, within the delay of %v: %v", time.Since(sent), delay, err)
		}
		hc, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("gRPC health %v after SIGTERM: %v, %v; want NOT_SERVING", time.Since(sent), hc, err)
		}
		if code := healthcheck(); code != http.StatusServiceUnavailable {
			t.Fatalf("/healthcheck %v after SIGTERM: %d, want 503", time.Since(sent), code)
		}
		checks++
		time.Sleep(50 * time.Millisecond)
	}
	if checks == 0 {
		t.Fatal("no call was made within the delay")
	}
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("ratelimitd did not exit within 30s of SIGTERM")
	}
	if took := time.Since(sent); took < delay {
		t.Fatalf("exited %v after SIGTERM, before the delay of %v", took, delay)
	}
	if s.waitErr != nil {
		t.Fatalf("exit: %v", s.waitErr)
	}
	logs := strings.Join(s.logLines(), "\n")
	if !strings.Contains(logs, "health checks report not serving") || !strings.Contains(logs, `"msg":"stopped"`) {
		t.Fatalf("logs do not tell the delay and the stop:\n%s", logs)
	}
}

// TestServerRefusesBadRules checks that a server given invalid rules does
// not start, and says why.
func TestServerRefusesBadRules(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(binary, "-config", "../pkg/config/testdata/invalid/unknown_unit.yaml",
		"-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0")
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 1 {
		t.Fatalf("exit %v, want 1\n%s", err, out)
	}
	if !strings.Contains(string(out), `unknown_unit.yaml:6:13: descriptors[0].rate_limit.unit: unknown unit \"minutes\"`) {
		t.Fatalf("output does not locate the problem:\n%s", out)
	}
}

// TestTLSAndDebugListeners serves gRPC and HTTP over TLS and profiles on
// the opt-in debug address, and checks each is where it should be and
// nowhere else.
func TestTLSAndDebugListeners(t *testing.T) {
	t.Parallel()
	certs := redistest.WriteCerts(t)
	s := startServer(t,
		"-grpc-tls-cert", certs.Cert, "-grpc-tls-key", certs.Key,
		"-http-tls-cert", certs.Cert, "-http-tls-key", certs.Key,
		"-debug-addr", "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(certs.Client)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health over TLS: %v, %v", resp, err)
	}
	if _, err := rlsv3.NewRateLimitServiceClient(s.dial(t)).ShouldRateLimit(ctx, basicAuth()); status.Code(err) != codes.Unavailable {
		t.Errorf("plaintext gRPC to a TLS listener: %v, want Unavailable", err)
	}

	client := &http.Client{Transport: &http.Transport{TLSClientConfig: certs.Client}, Timeout: 10 * time.Second}
	resp, err := client.Get("https://" + s.httpAddr + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /healthcheck over TLS: %d", resp.StatusCode)
	}
	if resp, err := client.Get("https://" + s.httpAddr + "/debug/pprof/"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("profiles on the public HTTP port: %v, %v; want 404", resp, err)
	}

	var debugAddr string
	for _, line := range s.logLines() {
		var rec struct{ Msg, Addr string }
		if json.Unmarshal([]byte(line), &rec) == nil && strings.HasPrefix(rec.Msg, "serving profiles") {
			debugAddr = rec.Addr
		}
	}
	if debugAddr == "" {
		t.Fatal("no log line gives the debug address")
	}
	if body := httpGet(t, "http://"+debugAddr+"/debug/pprof/"); !strings.Contains(body, "goroutine") {
		t.Errorf("/debug/pprof/ lists no profiles:\n%s", body)
	}
}

// TestHotReload edits the rules of a running server: a valid edit is in
// force within seconds, an invalid one is rejected whole and counted while
// the last good rules keep serving.
func TestHotReload(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	write := func(body string) {
		tmp := file + ".tmp"
		if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil { // as editors and ConfigMaps do
			t.Fatal(err)
		}
	}
	write("domain: hot\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 10}\n")
	s := startServer(t, "-config", dir)
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("waited 10s for %s", what)
			}
		}
	}
	rlconfig := func() string { return httpGet(t, "http://"+s.httpAddr+"/rlconfig") }
	if !strings.Contains(rlconfig(), "requests_per_unit=10") {
		t.Fatalf("/rlconfig before the edit:\n%s", rlconfig())
	}

	write("domain: hot\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 20}\n")
	waitFor("the edit to be in force", func() bool { return strings.Contains(rlconfig(), "requests_per_unit=20") })

	write("domain: hot\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 30, burst: oops}\n")
	waitFor("the bad edit to be rejected", func() bool {
		return strings.Contains(httpGet(t, "http://"+s.httpAddr+"/metrics"), "ratelimitd_config_reload_rejections_total 1\n")
	})
	if got := rlconfig(); !strings.Contains(got, "requests_per_unit=20") {
		t.Errorf("after a rejected edit the last good rules must serve:\n%s", got)
	}
	if logs := strings.Join(s.logLines(), "\n"); !strings.Contains(logs, "rules rejected") || !strings.Contains(logs, "rules.yaml:4") {
		t.Errorf("the rejection is not logged with its file and line:\n%s", logs)
	}
	if m := httpGet(t, "http://"+s.httpAddr+"/metrics"); !strings.Contains(m, "ratelimitd_config_reloads_total 1\n") {
		t.Errorf("/metrics does not count the one good reload")
	}
}

// TestHeadersAndExplain runs the server with -response-headers ratelimit:
// the refused /json call carries RateLimit-* and Retry-After; and POST
// /explain tells which rule a descriptor matched without counting it.
func TestHeadersAndExplain(t *testing.T) {
	t.Parallel()
	s := startServer(t, "-response-headers", "ratelimit")
	body := `{"domain": "auth", "descriptors": [{"entries": [{"key": "auth_type", "value": "basic"}]}]}`
	post := func(path string) (*http.Response, string) {
		resp, err := http.Post("http://"+s.httpAddr+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	for range 3 {
		if resp, b := post("/explain"); resp.StatusCode != http.StatusOK || !strings.Contains(b, `"result":"matched"`) || !strings.Contains(b, "basic_auth_logins") {
			t.Fatalf("/explain: %d %s", resp.StatusCode, b)
		}
	}
	// 5 per minute: explaining consumed nothing, so no call before the 6th
	// is refused, and one by the 11th is (a minute boundary may fall
	// between the calls).
	for i := 1; i <= 11; i++ {
		resp, b := post("/json")
		if resp.StatusCode == http.StatusOK {
			if got := resp.Header.Get("RateLimit-Limit"); got != "5" {
				t.Fatalf("call %d: RateLimit-Limit %q, want 5", i, got)
			}
			continue
		}
		if resp.StatusCode != http.StatusTooManyRequests || i < 6 {
			t.Fatalf("call %d: %d %s", i, resp.StatusCode, b)
		}
		if resp.Header.Get("Retry-After") == "" || resp.Header.Get("RateLimit-Remaining") != "0" || resp.Header.Get("RateLimit-Reset") != resp.Header.Get("Retry-After") {
			t.Errorf("refused call: headers %v", resp.Header)
		}
		return
	}
	t.Fatal("no call was refused")
}

// TestDashboardMetricsExist scrapes the real /metrics of a server on Redis
// with every optional part on, and checks that each metric the Grafana
// dashboard queries is there.
func TestDashboardMetricsExist(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	// -reserve auto: the fixed windows of the examples reserve, so the
	// ratelimitd_reserve_* series exist.
	s := startServer(t, "-backend", "redis", "-redis-url", srv.URL, "-local-cache-keys", "100", "-reserve", "auto",
		"-redis-prefix", fmt.Sprintf("dash:%d:", time.Now().UnixNano()))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := rlsv3.NewRateLimitServiceClient(s.dial(t)).ShouldRateLimit(ctx, basicAuth()); err != nil {
		t.Fatal(err)
	}
	exposed := make(map[string]bool)
	for _, line := range strings.Split(httpGet(t, "http://"+s.httpAddr+"/metrics"), "\n") {
		if name, ok := strings.CutPrefix(line, "# TYPE "); ok {
			exposed[strings.Fields(name)[0]] = true
		}
	}
	dash, err := os.ReadFile("../deploy/grafana/ratelimitd.json")
	if err != nil {
		t.Fatal(err)
	}
	queried := regexp.MustCompile(`ratelimitd_[a-z0-9_]+`).FindAllString(string(dash), -1)
	if len(queried) == 0 {
		t.Fatal("the dashboard queries no ratelimitd metric")
	}
	for _, name := range queried {
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(name, suffix); ok && exposed[b] {
				base = b
			}
		}
		if !exposed[base] {
			t.Errorf("the dashboard queries %s, which /metrics does not expose", name)
		}
	}
}

// TestOwnAPI calls ratelimitd.v1.RateLimiter on the real server: Check
// shares the counters of Envoy's API, Peek consumes nothing, and Reset is
// refused unless -enable-reset.
func TestOwnAPI(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	desc := []*ratelimitdv1.Descriptor{{Entries: []*ratelimitdv1.Entry{{Key: "auth_type", Value: "basic"}}}}
	for _, enable := range []bool{false, true} {
		args := []string{}
		if enable {
			args = append(args, "-enable-reset")
		}
		s := startServer(t, args...)
		conn := s.dial(t)
		own := ratelimitdv1.NewRateLimiterClient(conn)
		if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, basicAuth()); err != nil {
			t.Fatal(err)
		}
		peek, err := own.Peek(ctx, &ratelimitdv1.PeekRequest{Domain: "auth", Descriptors: desc})
		if err != nil {
			t.Fatal(err)
		}
		check, err := own.Check(ctx, &ratelimitdv1.CheckRequest{Domain: "auth", Descriptors: desc})
		if err != nil {
			t.Fatal(err)
		}
		// One hit by Envoy's API, one by Check (the peek took none): 3 of 5
		// left, unless a minute boundary fell between the calls.
		if r := check.Results[0]; !check.Allowed || r.Rule != "auth.auth_type_basic" || (r.Remaining != 3 && r.Remaining != 4) || peek.Results[0].Remaining != r.Remaining {
			t.Errorf("Peek %v then Check %v", peek, check)
		}
		_, err = own.Reset(ctx, &ratelimitdv1.ResetRequest{Domain: "auth", Descriptor_: desc[0]})
		if want := map[bool]codes.Code{false: codes.PermissionDenied, true: codes.OK}[enable]; status.Code(err) != want {
			t.Errorf("Reset with -enable-reset %v: %v, want %v", enable, err, want)
		}
	}
}
