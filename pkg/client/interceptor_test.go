package client_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/pkg/client"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// byCaller limits calls by their x-user metadata; without it, a call has
// no descriptor.
func byCaller(ctx context.Context, fullMethod string, req any) []client.Descriptor {
	md, _ := metadata.FromIncomingContext(ctx)
	if u := md.Get("x-user"); len(u) > 0 {
		return []client.Descriptor{client.D("user_id", u[0])}
	}
	return nil
}

// limitedHealth serves grpc.health.v1 behind interceptor, and returns a
// client of it.
func limitedHealth(t testing.TB, interceptor grpc.UnaryServerInterceptor) healthpb.HealthClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.UnaryInterceptor(interceptor))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func asUser(user string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "x-user", user)
}

// retryDelay returns the retry delay of err's RetryInfo, and whether it
// has one.
func retryDelay(err error) (time.Duration, bool) {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

// TestUnaryServerInterceptor: calls are handled until the limit, then
// fail with ResourceExhausted and the retry delay.
func TestUnaryServerInterceptor(t *testing.T) {
	s := startServer(t, service.Options{})
	c := newClient(t, s.addr)
	var mu sync.Mutex // the server's goroutines write, the test reads
	var methods []string
	var requests []any
	descriptors := func(ctx context.Context, fullMethod string, req any) []client.Descriptor {
		mu.Lock()
		defer mu.Unlock()
		methods = append(methods, fullMethod)
		requests = append(requests, req)
		return byCaller(ctx, fullMethod, req)
	}
	hc := limitedHealth(t, client.UnaryServerInterceptor(c, "api", descriptors, false))
	for i := range 3 {
		if resp, err := hc.Check(asUser("alice"), &healthpb.HealthCheckRequest{}); err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("call %d: %v, %v", i+1, resp, err)
		}
	}
	_, err := hc.Check(asUser("alice"), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("the 4th call: %v, want ResourceExhausted", err)
	}
	if d, ok := retryDelay(err); !ok || d != 20*time.Second {
		t.Errorf("the 4th call: retry delay %v (%v), want 20s", d, ok)
	}
	mu.Lock()
	if methods[0] != "/grpc.health.v1.Health/Check" {
		t.Errorf("the descriptors function was given method %q", methods[0])
	}
	if _, ok := requests[0].(*healthpb.HealthCheckRequest); !ok {
		t.Errorf("the descriptors function was given request %T", requests[0])
	}
	mu.Unlock()
	// Others, and calls without descriptors, are handled.
	if _, err := hc.Check(asUser("bob"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("bob: %v", err)
	}
	if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("an anonymous call: %v", err)
	}
	s.clock.Advance(20 * time.Second)
	if _, err := hc.Check(asUser("alice"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("after the retry delay: %v", err)
	}
}

// TestUnaryServerInterceptorFailure: when ratelimitd cannot be reached,
// failOpen handles calls, and otherwise they fail with Unavailable.
func TestUnaryServerInterceptorFailure(t *testing.T) {
	c := newClient(t, closedAddr(t))
	open := limitedHealth(t, client.UnaryServerInterceptor(c, "api", byCaller, true))
	if _, err := open.Check(asUser("alice"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("fail open: %v", err)
	}
	closed := limitedHealth(t, client.UnaryServerInterceptor(c, "api", byCaller, false))
	if _, err := closed.Check(asUser("alice"), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("fail closed: %v, want Unavailable", err)
	}
}

// TestUnaryServerInterceptorNever: a call no wait admits has no retry
// delay.
func TestUnaryServerInterceptorNever(t *testing.T) {
	never := client.LimiterFunc(func(context.Context, string, ...client.Descriptor) (client.Decision, error) {
		return client.Decision{RetryAfter: client.Never}, nil
	})
	hc := limitedHealth(t, client.UnaryServerInterceptor(never, "api", byCaller, false))
	_, err := hc.Check(asUser("alice"), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("%v, want ResourceExhausted", err)
	}
	if d, ok := retryDelay(err); ok {
		t.Errorf("a retry delay of %v for a call no wait admits", d)
	}
}

func TestUnaryServerInterceptorPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic for a nil descriptors function")
		}
	}()
	client.UnaryServerInterceptor(client.LimiterFunc(nil), "api", nil, false)
}
