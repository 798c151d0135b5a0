package main

import (
	"context"
	"net"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// TestTracing serves one decision with the server's tracing options and
// a traced backend, and wants a server span for the call with the backend
// call's span as its child.
func TestTracing(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	rules, err := config.Parse(config.File{Name: "r.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n")})
	if err != nil {
		t.Fatal(err)
	}
	mem := memory.New(memory.Options{})
	defer mem.Close()
	svc, err := service.New(newTracedBackend(mem, tp, "memory"), rules, service.Options{})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(tracingServerOptions(tp)...)
	svc.RegisterGRPC(gs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	defer gs.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}},
	}}
	if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	gs.GracefulStop() // the server span ends with the call
	var server, backend sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit":
			server = s
		case "ratelimitd.backend.decide":
			backend = s
		}
	}
	if server == nil || backend == nil {
		t.Fatalf("spans %v: want the gRPC call's and the backend call's", rec.Ended())
	}
	if backend.Parent().SpanID() != server.SpanContext().SpanID() || backend.SpanContext().TraceID() != server.SpanContext().TraceID() {
		t.Errorf("the backend span is not a child of the call's span")
	}
}

// TestTracerProviderFromEnvironment reads the exporter from the OTEL_*
// variables and refuses ones it does not know, naming them.
func TestTracerProviderFromEnvironment(t *testing.T) {
	ctx := context.Background()
	for _, e := range []env{
		{"OTEL_TRACES_EXPORTER": "none"},
		{"OTEL_TRACES_EXPORTER": "console"},
		{},
		{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
	} {
		tp, err := newTracerProvider(ctx, e.lookup)
		if err != nil {
			t.Errorf("%v: %v", e, err)
			continue
		}
		tp.Shutdown(ctx)
	}
	for _, c := range []struct {
		e    env
		want string
	}{
		{env{"OTEL_TRACES_EXPORTER": "zipkin"}, `OTEL_TRACES_EXPORTER "zipkin" is not supported; accepted: otlp, console, none`},
		{env{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, `OTLP protocol "http/json" is not supported`},
	} {
		if _, err := newTracerProvider(ctx, c.e.lookup); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error containing %q", c.e, err, c.want)
		}
	}
}
