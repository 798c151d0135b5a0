package aigwsim_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/ratelimitd/ratelimitd/internal/aigwsim"
)

// Each test below checks one branch of the filter the Client models
// against a fake rate limit service that records the calls it gets; where
// each branch is in Envoy's and AI Gateway's source is cited in client.go
// and route.go.

var route = aigwsim.Route{Namespace: "default", Backend: "openai", Model: "gpt-4o"}

// call is one call a fake got.
type call struct {
	replica   int
	req       *rlsv3.RateLimitRequest
	cancelled bool // the caller cancelled it before it was answered
}

// streamDone reports whether c is a stream-done call: its descriptor
// carries a hits_addend of its own.
func (c call) streamDone() bool { return c.req.Descriptors[0].HitsAddend != nil }

// fake is a rate limit service answering by its answer function and
// recording every call. A call it holds waits until release is closed or
// its caller goes away.
type fake struct {
	rlsv3.UnimplementedRateLimitServiceServer
	replica int
	answer  func(*rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error)
	hold    func(*rlsv3.RateLimitRequest) bool
	release chan struct{}
	log     *callLog
}

type callLog struct {
	mu    sync.Mutex
	calls []call
	got   chan struct{} // a value per call received
}

func (l *callLog) all() []call {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]call(nil), l.calls...)
}

func (f *fake) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	f.log.got <- struct{}{}
	c := call{replica: f.replica, req: req}
	if f.hold != nil && f.hold(req) {
		select {
		case <-f.release:
		case <-ctx.Done():
			c.cancelled = true
		}
	}
	f.log.mu.Lock()
	f.log.calls = append(f.log.calls, c)
	f.log.mu.Unlock()
	if c.cancelled {
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if f.answer != nil {
		return f.answer(req)
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// serve starts n fakes, each configured by setup, and returns a client of
// each and their shared log.
func serve(t *testing.T, n int, setup func(*fake)) ([]rlsv3.RateLimitServiceClient, *callLog) {
	t.Helper()
	log := &callLog{got: make(chan struct{}, 1000)}
	var clients []rlsv3.RateLimitServiceClient
	for i := range n {
		f := &fake{replica: i, log: log, release: make(chan struct{})}
		if setup != nil {
			setup(f)
		}
		lis := bufconn.Listen(1 << 20)
		srv := grpc.NewServer()
		rlsv3.RegisterRateLimitServiceServer(srv, f)
		go srv.Serve(lis)
		conn, err := grpc.NewClient("passthrough:///fake", grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			conn.Close()
			srv.Stop()
		})
		clients = append(clients, rlsv3.NewRateLimitServiceClient(conn))
	}
	return clients, log
}

// stepClock is a clock for one goroutine: Sleep moves it on at once.
type stepClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return nil
}

func newStepClock() *stepClock { return &stepClock{now: time.Unix(1_800_000_000, 0)} }

// resetClock is a stepClock whose downstream resets as soon as anything
// sleeps on it: for a stream admitted, in the middle of the stream.
type resetClock struct {
	*stepClock
	reset context.CancelFunc
}

func (c resetClock) Sleep(ctx context.Context, _ time.Duration) error {
	c.reset()
	<-ctx.Done()
	return ctx.Err()
}

// arrivalClock is a stepClock on which a sleep lasts until a call has
// reached the server: a client resetting while checking resets once its
// request-time call is in flight.
type arrivalClock struct {
	*stepClock
	got <-chan struct{}
}

func (c arrivalClock) Sleep(ctx context.Context, _ time.Duration) error {
	select {
	case <-c.got:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run runs s through a client of replicas and waits for its stream-done
// call.
func run(t *testing.T, cfg aigwsim.Config, replicas []rlsv3.RateLimitServiceClient, s aigwsim.Stream) aigwsim.Result {
	t.Helper()
	if cfg.Clock == nil {
		cfg.Clock = newStepClock()
	}
	cfg.Route = route
	c := aigwsim.NewClient(cfg, replicas...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res := c.Run(ctx, s)
	c.Wait()
	return res
}

func sameEntries(t *testing.T, what string, d *rlv3.RateLimitDescriptor) {
	t.Helper()
	e := d.GetEntries()
	if len(e) != 2 || e[0].Key != "backend_name" || e[0].Value != "default/openai" || e[1].Key != "model_name_override" || e[1].Value != "gpt-4o" {
		t.Fatalf("%s entries %v; want backend_name default/openai, model_name_override gpt-4o", what, e)
	}
}

// TestServedStreamMakesBothCalls: a 2xx stream to its end makes the
// request-time call (no hits_addend on its descriptor, request hits_addend
// 0), waits its duration, then the stream-done call with the same keys and
// its cost as the descriptor's hits_addend.
func TestServedStreamMakesBothCalls(t *testing.T) {
	replicas, log := serve(t, 1, nil)
	clock := newStepClock()
	res := run(t, aigwsim.Config{Clock: clock}, replicas, aigwsim.Stream{Fate: aigwsim.Complete, Cost: 700, Duration: 3 * time.Second})
	if res.Outcome != aigwsim.Served || !res.StreamDone || res.Charged != 700 {
		t.Fatalf("result %+v; want served, 700 charged", res)
	}
	if d := res.Ended.Sub(res.Asked); d != 3*time.Second {
		t.Fatalf("the stream lasted %v; want its 3s", d)
	}
	calls := log.all()
	if len(calls) != 2 {
		t.Fatalf("%d calls; want 2", len(calls))
	}
	check, done := calls[0].req, calls[1].req
	for _, r := range []*rlsv3.RateLimitRequest{check, done} {
		if r.Domain != "ai-gateway-quota" || len(r.Descriptors) != 1 || r.HitsAddend != 0 {
			t.Fatalf("call %v; want domain ai-gateway-quota, one descriptor, request hits_addend 0", r)
		}
	}
	sameEntries(t, "request-time", check.Descriptors[0])
	sameEntries(t, "stream-done", done.Descriptors[0])
	if check.Descriptors[0].HitsAddend != nil {
		t.Fatalf("request-time descriptor carries hits_addend %v; want none", check.Descriptors[0].HitsAddend)
	}
	if h := done.Descriptors[0].HitsAddend; h == nil || h.Value != 700 {
		t.Fatalf("stream-done hits_addend %v; want 700", h)
	}
}

// TestZeroCostIsCharged: a stream of no tokens still makes its stream-done
// call, its hits_addend set to 0 rather than left out.
func TestZeroCostIsCharged(t *testing.T) {
	replicas, log := serve(t, 1, nil)
	res := run(t, aigwsim.Config{}, replicas, aigwsim.Stream{Fate: aigwsim.Complete, Cost: 0, Duration: time.Second})
	calls := log.all()
	if !res.StreamDone || len(calls) != 2 {
		t.Fatalf("result %+v, %d calls; want a stream-done call", res, len(calls))
	}
	if h := calls[1].req.Descriptors[0].HitsAddend; h == nil || h.Value != 0 {
		t.Fatalf("stream-done hits_addend %v; want set, 0", h)
	}
}

// TestNoStreamDoneCall: a stream that does not reach the end of a 2xx body
// leaves no cost metadata, so Envoy drops the stream-done descriptor and
// makes no call: after a 429, a 500 on a failed check, an upstream
// failure, a reset mid-stream, and a reset while the request-time call is
// in flight (which is cancelled). A cost past 1e9 is dropped too.
func TestNoStreamDoneCall(t *testing.T) {
	overLimit := func(*rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}, nil
	}
	unavailable := func(*rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		return nil, status.Error(codes.Unavailable, "redis down")
	}
	holdChecks := func(f *fake) {
		f.hold = func(r *rlsv3.RateLimitRequest) bool { return r.Descriptors[0].HitsAddend == nil }
	}
	served := aigwsim.Stream{Fate: aigwsim.Complete, Cost: 900, Duration: time.Second}
	// The downstream goes away when the request-time call has reached the
	// server (reset), or once the stream is admitted (mid-stream).
	const (
		never = iota
		reset
		midStream
	)
	for _, c := range []struct {
		name      string
		setup     func(*fake)
		cfg       aigwsim.Config
		stream    aigwsim.Stream
		gone      int // when the downstream goes away
		want      aigwsim.Outcome
		cancelled bool // the request-time call was cancelled in flight
	}{
		{name: "refused", setup: func(f *fake) { f.answer = overLimit }, stream: served, want: aigwsim.Refused},
		{name: "check failed, failure_mode_deny", setup: func(f *fake) { f.answer = unavailable }, cfg: aigwsim.Config{FailureModeDeny: true}, stream: served, want: aigwsim.Denied},
		{name: "check timed out, failure_mode_deny", setup: holdChecks, cfg: aigwsim.Config{FailureModeDeny: true, Timeout: 50 * time.Millisecond}, stream: served, want: aigwsim.Denied, cancelled: true},
		{name: "upstream failure", stream: aigwsim.Stream{Fate: aigwsim.UpstreamFailure, Duration: time.Second}, want: aigwsim.UpstreamFailed},
		{name: "client reset mid-stream", stream: aigwsim.Stream{Fate: aigwsim.ClientReset, Duration: time.Second}, want: aigwsim.Reset},
		{name: "reset while checking", setup: holdChecks, stream: aigwsim.Stream{Fate: aigwsim.ResetWhileChecking}, want: aigwsim.CancelledInFlight, cancelled: true},
		{name: "downstream gone while checking", setup: holdChecks, stream: served, gone: reset, want: aigwsim.CancelledInFlight, cancelled: true},
		{name: "downstream gone mid-stream", stream: served, gone: midStream, want: aigwsim.Reset},
		{name: "cost past 1e9", stream: aigwsim.Stream{Fate: aigwsim.Complete, Cost: 1_000_000_001, Duration: time.Second}, want: aigwsim.Served},
	} {
		t.Run(c.name, func(t *testing.T) {
			replicas, log := serve(t, 1, c.setup)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cfg := c.cfg
			cfg.Route = route
			switch {
			case c.gone == midStream:
				cfg.Clock = resetClock{newStepClock(), cancel}
			case c.stream.Fate == aigwsim.ResetWhileChecking:
				cfg.Clock = arrivalClock{newStepClock(), log.got}
			default:
				cfg.Clock = newStepClock()
			}
			if c.gone == reset {
				go func() {
					<-log.got
					cancel()
				}()
			}
			client := aigwsim.NewClient(cfg, replicas...)
			res := client.Run(ctx, c.stream)
			client.Wait()
			// A cancelled call is logged once the fake sees it cancelled.
			deadline := time.Now().Add(5 * time.Second)
			for len(log.all()) < 1 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			calls := log.all()
			if res.Outcome != c.want || res.StreamDone {
				t.Fatalf("result %+v; want %v and no stream-done call", res, c.want)
			}
			if len(calls) != 1 || calls[0].streamDone() {
				t.Fatalf("%d calls %v; want the request-time call only", len(calls), calls)
			}
			if calls[0].cancelled != c.cancelled {
				t.Fatalf("request-time call cancelled: %v; want %v", calls[0].cancelled, c.cancelled)
			}
		})
	}
}

// TestFailOpen: with failure_mode_deny false, a failed request-time call
// lets the stream through, and its cost is charged at its end.
func TestFailOpen(t *testing.T) {
	replicas, log := serve(t, 1, func(f *fake) {
		f.answer = func(r *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
			if r.Descriptors[0].HitsAddend == nil {
				return nil, status.Error(codes.Unavailable, "redis down")
			}
			return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
		}
	})
	res := run(t, aigwsim.Config{}, replicas, aigwsim.Stream{Fate: aigwsim.Complete, Cost: 300, Duration: time.Second})
	if res.Outcome != aigwsim.Served || !res.FailedOpen || res.CheckErr == nil || !res.StreamDone || res.Charged != 300 {
		t.Fatalf("result %+v; want served on a failed check, 300 charged", res)
	}
	if n := len(log.all()); n != 2 {
		t.Fatalf("%d calls; want 2", n)
	}
}

// TestStreamDoneAnswerIgnored: whatever the stream-done call gets back
// (OVER_LIMIT, an error), the stream was served and nothing is sent again;
// and the call goes out and completes even when the downstream is gone as
// soon as the stream ends, as Envoy's OnStreamDoneCallBack outlives the
// filter.
func TestStreamDoneAnswerIgnored(t *testing.T) {
	for _, answer := range []func(*rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error){
		func(*rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
			return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}, nil
		},
		func(*rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
			return nil, status.Error(codes.Internal, "boom")
		},
	} {
		replicas, log := serve(t, 1, func(f *fake) {
			f.answer = func(r *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
				if r.Descriptors[0].HitsAddend == nil {
					return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
				}
				return answer(r)
			}
		})
		res := run(t, aigwsim.Config{}, replicas, aigwsim.Stream{Fate: aigwsim.Complete, Cost: 50, Duration: time.Second})
		if res.Outcome != aigwsim.Served || !res.StreamDone {
			t.Fatalf("result %+v; want served", res)
		}
		if n := len(log.all()); n != 2 {
			t.Fatalf("%d calls; want 2, the stream-done call not retried", n)
		}
	}

	// The downstream goes away the moment the stream ends, while the
	// stream-done call is held by the server.
	var release chan struct{}
	replicas, log := serve(t, 1, func(f *fake) {
		f.hold = func(r *rlsv3.RateLimitRequest) bool { return r.Descriptors[0].HitsAddend != nil }
		release = f.release
	})
	client := aigwsim.NewClient(aigwsim.Config{Route: route, Clock: newStepClock()}, replicas...)
	ctx, cancel := context.WithCancel(context.Background())
	res := client.Run(ctx, aigwsim.Stream{Fate: aigwsim.Complete, Cost: 50, Duration: time.Second})
	cancel()
	for i := range 2 { // the request-time call, then the stream-done call
		select {
		case <-log.got:
		case <-time.After(5 * time.Second):
			close(release)
			t.Fatalf("call %d never reached the server once the downstream was gone", i+1)
		}
	}
	close(release)
	client.Wait()
	calls := log.all()
	if !res.StreamDone || len(calls) != 2 || !calls[1].streamDone() || calls[1].cancelled {
		t.Fatalf("result %+v, calls %v; want the stream-done call answered despite the downstream gone", res, calls)
	}
}

// TestRoundRobin: calls go to the replicas in turn, request-time and
// stream-done calls alike, as Envoy's round-robin cluster sends them.
func TestRoundRobin(t *testing.T) {
	replicas, log := serve(t, 3, nil)
	client := aigwsim.NewClient(aigwsim.Config{Route: route, Clock: newStepClock()}, replicas...)
	for range 3 {
		client.Run(context.Background(), aigwsim.Stream{Fate: aigwsim.Complete, Cost: 10, Duration: time.Second})
		client.Wait()
	}
	var got []int
	for _, c := range log.all() {
		got = append(got, c.replica)
	}
	want := []int{0, 1, 2, 0, 1, 2}
	if len(got) != len(want) {
		t.Fatalf("replicas %v; want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("replicas %v; want %v", got, want)
		}
	}
}
