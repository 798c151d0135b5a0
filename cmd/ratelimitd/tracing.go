package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// tracerName names the spans ratelimitd makes itself.
const tracerName = "github.com/ratelimitd/ratelimitd"

// tracing is the component that traces gRPC calls and backend calls with
// OpenTelemetry (-tracing): the top layer of the backend stack, and a
// stats handler of the gRPC server.
type tracing struct {
	on bool
}

func (t *tracing) addFlags(fs *flag.FlagSet) {
	fs.BoolVar(&t.on, "tracing", false, "trace gRPC calls and backend calls with OpenTelemetry, exported as the standard OTEL_* variables say (OTLP over HTTP by default)")
}

func (t *tracing) check(func(string) string) error { return nil }

func (t *tracing) build(ctx context.Context, s *server) (hooks, error) {
	if !t.on {
		return hooks{}, nil
	}
	tp, err := newTracerProvider(ctx, s.lookupEnv)
	if err != nil {
		return hooks{}, err
	}
	s.stack.main = newTracedBackend(s.stack.main, tp, s.stack.kind)
	s.log.Info("tracing on: exporting spans as the OTEL_* variables say")
	return hooks{
		grpcOptions: tracingServerOptions(tp),
		close: func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tp.Shutdown(sctx); err != nil {
				s.log.Warn("tracing: spans not flushed at exit", "error", err)
			}
		},
	}, nil
}

// newTracerProvider returns a tracer provider that exports spans as the
// standard OpenTelemetry variables say: OTEL_TRACES_EXPORTER (otlp, the
// default; console, to stdout; none), OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or
// OTEL_EXPORTER_OTLP_PROTOCOL (http/protobuf, the default, or grpc), the
// OTLP endpoint, headers and TLS variables the exporters read themselves,
// OTEL_TRACES_SAMPLER and its argument, OTEL_SERVICE_NAME (default
// ratelimitd) and OTEL_RESOURCE_ATTRIBUTES.
func newTracerProvider(ctx context.Context, lookupEnv func(string) (string, bool)) (*sdktrace.TracerProvider, error) {
	env := func(names ...string) string {
		for _, n := range names {
			if v, ok := lookupEnv(n); ok && v != "" {
				return v
			}
		}
		return ""
	}
	var exp sdktrace.SpanExporter
	var err error
	switch e := env("OTEL_TRACES_EXPORTER"); e {
	case "", "otlp":
		switch p := env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"); p {
		case "", "http/protobuf":
			exp, err = otlptracehttp.New(ctx)
		case "grpc":
			exp, err = otlptracegrpc.New(ctx)
		default:
			return nil, fmt.Errorf("tracing: OTLP protocol %q is not supported; accepted: http/protobuf, grpc", p)
		}
	case "console":
		exp, err = stdouttrace.New(stdouttrace.WithWriter(os.Stdout))
	case "none":
	default:
		return nil, fmt.Errorf("tracing: OTEL_TRACES_EXPORTER %q is not supported; accepted: otlp, console, none", e)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "ratelimitd")),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
		resource.WithTelemetrySDK(),
	)
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if exp != nil {
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	return sdktrace.NewTracerProvider(opts...), nil
}

// tracingServerOptions trace every gRPC call the server handles.
func tracingServerOptions(tp trace.TracerProvider) []grpc.ServerOption {
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tp)))}
}

// tracedBackend makes a span of every backend call, a child of the gRPC
// call's span.
type tracedBackend struct {
	inner  algo.Backend
	tracer trace.Tracer
	name   string // "redis" or "memory"
}

func newTracedBackend(inner algo.Backend, tp trace.TracerProvider, name string) tracedBackend {
	return tracedBackend{inner: inner, tracer: tp.Tracer(tracerName), name: name}
}

// Reset implements algo.Resetter when the traced backend does.
func (b tracedBackend) Reset(ctx context.Context, reqs []algo.Request) error {
	r, ok := b.inner.(algo.Resetter)
	if !ok {
		return errors.New("the backend cannot reset keys")
	}
	return r.Reset(ctx, reqs)
}

// Decide implements algo.Backend.
func (b tracedBackend) Decide(ctx context.Context, reqs []algo.Request, out []algo.Decision) error {
	ctx, span := b.tracer.Start(ctx, "ratelimitd.backend.decide", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("ratelimitd.backend", b.name), attribute.Int("ratelimitd.requests", len(reqs))))
	defer span.End()
	err := b.inner.Decide(ctx, reqs, out)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}
