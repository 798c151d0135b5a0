package wire

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// logBuffer collects log output written from other goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newLogBuffer() (*logBuffer, *slog.Logger) {
	b := &logBuffer{}
	return b, slog.New(slog.NewTextHandler(b, nil))
}

// panicInHandler is the function the recovered stacks must start with.
func panicInHandler(v any) {
	panic(v)
}

// nilMapWrite panics in the runtime when m is nil. Tracebacks hide the
// runtime's frames: the stack must start at nilMapWrite.
func nilMapWrite(m map[string]int) {
	m["x"]++
}

// checkPanicLog checks that the log holds one error line with each of
// attrs and a stack trimmed to start at panicInHandler.
func checkPanicLog(t *testing.T, log string, attrs ...string) {
	t.Helper()
	checkPanicLogAt(t, log, "panicInHandler", attrs...)
}

// checkPanicLogAt checks that the log holds one error line with each of
// attrs and a stack trimmed to start at function top of this package.
func checkPanicLogAt(t *testing.T, log, top string, attrs ...string) {
	t.Helper()
	if n := strings.Count(log, "\n"); n != 1 {
		t.Fatalf("%d log lines, want 1:\n%s", n, log)
	}
	for _, a := range append(attrs, "level=ERROR") {
		if !strings.Contains(log, a) {
			t.Errorf("log line lacks %s:\n%s", a, log)
		}
	}
	_, stack, _ := strings.Cut(log, "stack=")
	if !strings.HasPrefix(stack, `"github.com/ratelimitd/ratelimitd/pkg/wire.`+top+"(") {
		t.Errorf("the stack does not start at %s, the function that panicked:\n%s", top, stack)
	}
}

func TestRecoverUnary(t *testing.T) {
	info := &grpc.UnaryServerInfo{FullMethod: "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"}
	cases := []struct {
		name  string
		req   any
		do    func()
		top   string // the function the stack must start at
		attrs []string
	}{
		{"value", &rlsv3.RateLimitRequest{Domain: "messaging"}, func() { panicInHandler("boom") }, "panicInHandler",
			[]string{"domain=messaging", "panic=boom"}},
		{"nil", &rlsv3.RateLimitRequest{Domain: "a b"}, func() { panicInHandler(nil) }, "panicInHandler",
			[]string{`domain="a b"`, `panic="panic called with nil argument`}},
		{"long domain", &rlsv3.RateLimitRequest{Domain: strings.Repeat("x", 5000)}, func() { panicInHandler("boom") }, "panicInHandler",
			[]string{"domain=" + strings.Repeat("x", maxLoggedField) + "... ", "panic=boom"}},
		{"request without a domain", "not a request", func() { panicInHandler("boom") }, "panicInHandler", []string{"panic=boom"}},
		{"runtime error", &rlsv3.RateLimitRequest{Domain: "d"}, func() { nilMapWrite(nil) }, "nilMapWrite",
			[]string{"domain=d", `panic="assignment to entry in nil map"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			buf, log := newLogBuffer()
			var panics atomic.Uint64
			resp, err := RecoverUnary(log, &panics)(context.Background(), c.req, info, func(context.Context, any) (any, error) {
				c.do()
				return "unreachable", nil
			})
			if st := status.Convert(err); resp != nil || st.Code() != codes.Internal || st.Message() != "internal error (logged)" {
				t.Fatalf("got %v, %v; want nil, Internal", resp, err)
			}
			if panics.Load() != 1 {
				t.Errorf("%d panics counted, want 1", panics.Load())
			}
			l := buf.String()
			checkPanicLogAt(t, l, c.top, append(c.attrs, "method="+info.FullMethod)...)
			if _, ok := c.req.(*rlsv3.RateLimitRequest); !ok && strings.Contains(l, "domain=") {
				t.Errorf("a domain logged for a request without one:\n%s", l)
			}
		})
	}
}

func TestRecoverUnaryPassesThrough(t *testing.T) {
	buf, log := newLogBuffer()
	var panics atomic.Uint64
	want := status.Error(codes.InvalidArgument, "domain: must not be empty")
	resp, err := RecoverUnary(log, &panics)(context.Background(), nil, &grpc.UnaryServerInfo{}, func(context.Context, any) (any, error) {
		return "resp", want
	})
	if resp != "resp" || err != want || panics.Load() != 0 || buf.String() != "" {
		t.Fatalf("got %v, %v, %d panics, log %q", resp, err, panics.Load(), buf)
	}
	// A nil counter is allowed.
	_, err = RecoverUnary(slog.New(slog.DiscardHandler), nil)(context.Background(), nil, &grpc.UnaryServerInfo{}, func(context.Context, any) (any, error) {
		panic("boom")
	})
	if status.Code(err) != codes.Internal {
		t.Fatalf("without a counter: %v", err)
	}
}

func TestRecoverStream(t *testing.T) {
	buf, log := newLogBuffer()
	var panics atomic.Uint64
	info := &grpc.StreamServerInfo{FullMethod: "/grpc.health.v1.Health/Watch"}
	err := RecoverStream(log, &panics)(nil, fakeStream{}, info, func(any, grpc.ServerStream) error {
		panicInHandler("boom")
		return nil
	})
	if st := status.Convert(err); st.Code() != codes.Internal || st.Message() != "internal error (logged)" {
		t.Fatalf("got %v, want Internal", err)
	}
	if panics.Load() != 1 {
		t.Errorf("%d panics counted, want 1", panics.Load())
	}
	checkPanicLog(t, buf.String(), "method="+info.FullMethod, "panic=boom")
}

type fakeStream struct{ grpc.ServerStream }

func (fakeStream) Context() context.Context { return context.Background() }

// panickyRLS panics on the domain "boom" and answers OK otherwise.
type panickyRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (panickyRLS) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if req.Domain == "boom" {
		panicInHandler("handler bug")
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// TestRecoverUnaryServer serves on a real loopback listener: the call that
// panics gets Internal, and the server goes on answering.
func TestRecoverUnaryServer(t *testing.T) {
	buf, log := newLogBuffer()
	var panics atomic.Uint64
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(RecoverUnary(log, &panics)))
	rlsv3.RegisterRateLimitServiceServer(gs, panickyRLS{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := rlsv3.NewRateLimitServiceClient(conn)

	_, err = client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "boom"})
	if st := status.Convert(err); st.Code() != codes.Internal || st.Message() != "internal error (logged)" {
		t.Fatalf("panicking call: %v, want Internal", err)
	}
	resp, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "fine"})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("the call after the panic: %v, %v", resp, err)
	}
	if panics.Load() != 1 {
		t.Errorf("%d panics counted, want 1", panics.Load())
	}
	checkPanicLog(t, buf.String(), "domain=boom", "method=/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", `panic="handler bug"`)
}

func TestRecoverHTTP(t *testing.T) {
	buf, log := newLogBuffer()
	var panics atomic.Uint64
	mux := http.NewServeMux()
	mux.HandleFunc("/boom", func(http.ResponseWriter, *http.Request) { panicInHandler("boom") })
	mux.HandleFunc("/ok", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "fine") })
	h := RecoverHTTP(log, &panics, mux)

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/boom", nil))
	var body map[string]string
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != http.StatusInternalServerError ||
		rec.Header().Get("Content-Type") != "application/json" || len(body) != 1 || body["error"] != "internal error" {
		t.Fatalf("got %d %s %q", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
	checkPanicLog(t, buf.String(), "method=POST", "path=/boom", "panic=boom")

	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ok", nil))
	if rec.Code != http.StatusOK || rec.Body.String() != "fine" {
		t.Fatalf("the request after the panic: %d %q", rec.Code, rec.Body)
	}
	if panics.Load() != 1 {
		t.Errorf("%d panics counted, want 1", panics.Load())
	}
}

// TestRecoverHTTPAfterResponseStarted checks that a panic after the status
// was sent cuts the response short, and that http.ErrAbortHandler passes
// through.
func TestRecoverHTTPAfterResponseStarted(t *testing.T) {
	cases := []struct {
		name    string
		handler http.HandlerFunc
		counted uint64
	}{
		{"after WriteHeader", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusOK)
			panicInHandler("late")
		}, 1},
		{"after Write", func(w http.ResponseWriter, _ *http.Request) {
			io.WriteString(w, "partial")
			panicInHandler("late")
		}, 1},
		{"after Flush", func(w http.ResponseWriter, _ *http.Request) {
			http.NewResponseController(w).Flush()
			panicInHandler("late")
		}, 1},
		{"ErrAbortHandler", func(http.ResponseWriter, *http.Request) {
			panic(http.ErrAbortHandler)
		}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			buf, log := newLogBuffer()
			var panics atomic.Uint64
			h := RecoverHTTP(log, &panics, c.handler)
			p := func() (p any) {
				defer func() { p = recover() }()
				h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/x", nil))
				return nil
			}()
			if p != http.ErrAbortHandler {
				t.Fatalf("panicked with %v, want http.ErrAbortHandler", p)
			}
			if panics.Load() != c.counted || (buf.String() != "") != (c.counted > 0) {
				t.Fatalf("%d panics counted, log %q", panics.Load(), buf)
			}
		})
	}
}

// TestRecoverHTTPServer checks, over a real connection, that the server
// answers 500 to the request that panicked and goes on serving; and that a
// 103 Early Hints does not count as the response started.
func TestRecoverHTTPServer(t *testing.T) {
	_, log := newLogBuffer()
	var panics atomic.Uint64
	srv := httptest.NewServer(RecoverHTTP(log, &panics, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/boom" {
			w.WriteHeader(http.StatusEarlyHints)
			panicInHandler("boom")
		}
		io.WriteString(w, "fine")
	})))
	t.Cleanup(srv.Close)
	for _, c := range []struct {
		path string
		code int
	}{{"/boom", http.StatusInternalServerError}, {"/ok", http.StatusOK}} {
		res, err := srv.Client().Get(srv.URL + c.path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != c.code {
			t.Errorf("%s: %d, want %d", c.path, res.StatusCode, c.code)
		}
	}
	if panics.Load() != 1 {
		t.Errorf("%d panics counted, want 1", panics.Load())
	}
}

// TestRecoveryCountsEveryServer: one Recovery shared by a gRPC server (a
// unary and a streaming call) and an HTTP handler counts the panics of all
// three, as ratelimitd_panics_total does for every server of the process.
func TestRecoveryCountsEveryServer(t *testing.T) {
	buf, log := newLogBuffer()
	r := NewRecovery(log)
	opts := r.ServerOptions()
	if len(opts) != 2 {
		t.Fatalf("%d server options, want a unary and a stream interceptor", len(opts))
	}
	gs := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(gs, panickyRLS{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "boom"})
	if status.Code(err) != codes.Internal {
		t.Fatalf("panicking unary call: %v, want Internal", err)
	}

	err = r.StreamInterceptor()(nil, fakeStream{}, &grpc.StreamServerInfo{FullMethod: "/s/Watch"}, func(any, grpc.ServerStream) error {
		panicInHandler("stream")
		return nil
	})
	if status.Code(err) != codes.Internal {
		t.Fatalf("panicking stream: %v, want Internal", err)
	}

	rec := httptest.NewRecorder()
	r.WrapHTTP(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panicInHandler("http") })).
		ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/boom", nil))
	if rec.Code != http.StatusInternalServerError {
		t.Fatalf("panicking HTTP handler: %d, want 500", rec.Code)
	}

	if n := r.Panics(); n != 3 {
		t.Errorf("%d panics counted, want 3", n)
	}
	if n := strings.Count(buf.String(), "level=ERROR"); n != 3 {
		t.Errorf("%d error lines logged, want 3:\n%s", n, buf)
	}
}
