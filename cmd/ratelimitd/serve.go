package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/ratelimitd/ratelimitd/pkg/rlqs"
	"github.com/ratelimitd/ratelimitd/pkg/service"
	"github.com/ratelimitd/ratelimitd/pkg/wire"
)

// serve runs the servers until ctx is done, then drains them.
func serve(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stderr io.Writer) int {
	c, log, code := configure(args, lookupEnv, stderr)
	if c == nil {
		return code
	}
	if err := run(ctx, c, log); err != nil {
		log.Error("ratelimitd stopped", "error", err)
		return exitError
	}
	return exitOK
}

// configure reads serve's configuration from args and the environment,
// compatibility mode's included, and validates it. It returns the
// configuration and the logger it asks for, or nil and the exit code once
// it has written why to stderr (exitOK for -help).
func configure(args []string, lookupEnv func(string) (string, bool), stderr io.Writer) (*serveConfig, *slog.Logger, int) {
	compat, err := compatMode(lookupEnv)
	if err != nil {
		fmt.Fprintf(stderr, "ratelimitd: %v\n", err)
		return nil, nil, exitUsage
	}
	var compatFlags, notHonoured []string
	var compatFrom map[string]string
	if compat {
		if compatFlags, notHonoured, compatFrom, err = compatArgs(lookupEnv); err != nil {
			fmt.Fprintf(stderr, "ratelimitd: %v\n", err)
			return nil, nil, exitUsage
		}
		args = append(slices.Clip(compatFlags), args...)
		lookupEnv = compatEnvironment(lookupEnv)
	}
	c := newServeConfig()
	fs := c.flags
	fs.Usage = func() { usage(stderr) }
	if c.fromEnv, err = parseFlags(fs, args, lookupEnv, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, nil, exitOK
		}
		fmt.Fprintf(stderr, "ratelimitd: %v%s\n", err, compatSource(err, compatFrom))
		return nil, nil, exitUsage
	}
	if compat {
		// Errors about a flag the reference's settings gave name them.
		own := commandLineFlags(args[len(compatFlags):])
		for name, from := range compatFrom {
			if !own[name] {
				c.fromEnv[name] = from
			}
		}
	}
	c.lookupEnv = lookupEnv
	if err := c.validate(); err != nil {
		fmt.Fprintf(stderr, "ratelimitd: %v\n", err)
		return nil, nil, exitUsage
	}
	log := newLogger(&c.serving, stderr)
	if compat {
		log.Info("envoyproxy/ratelimit compatibility mode: configured from its environment", "flags", redactArgs(compatFlags))
		if len(notHonoured) > 0 {
			log.Warn("envoyproxy/ratelimit settings not honoured (docs/migrating.md)", "settings", notHonoured)
		}
	}
	return c, log, exitOK
}

// run builds the components of c in order, wires their hooks into the
// gRPC, HTTP and debug servers, serves until ctx is done, then drains and
// closes the components in the reverse order.
func run(ctx context.Context, c *serveConfig, log *slog.Logger) error {
	ctx, cancel := context.WithCancel(ctx) // ends the components' background work on every return
	defer cancel()
	s := &server{log: log, reg: newRegistry(), lookupEnv: c.lookupEnv, flagName: c.source, now: c.serving.clock(log),
		recovery: wire.NewRecovery(log)}
	var built []hooks
	defer func() {
		for i := len(built) - 1; i >= 0; i-- {
			if built[i].close != nil {
				built[i].close()
			}
		}
	}()
	for _, comp := range c.components {
		h, err := comp.build(ctx, s)
		if errors.Is(err, errStoppedEarly) {
			return nil
		}
		if err != nil {
			return err
		}
		built = append(built, h)
	}
	listeners, err := c.serving.wire(ctx, s, built)
	if err != nil {
		return err
	}
	return c.serving.serve(ctx, s, built, listeners)
}

// wire hands each component's hooks to the server: health, the rules put
// in force, background work; then it builds the gRPC and HTTP servers with
// the components' options, services and routes, and returns them with the
// components' own listeners and the debug listener.
func (c *servingConfig) wire(ctx context.Context, s *server, built []hooks) ([]listener, error) {
	for _, h := range built {
		if h.rules != nil {
			s.onRules = append(s.onRules, h.rules)
		}
		if h.rejected != nil {
			s.onReject = append(s.onReject, h.rejected)
		}
	}
	for _, h := range built {
		if h.health != nil {
			h.health(ctx, s.svc.SetUnhealthy)
		}
	}
	for _, h := range built {
		if h.start != nil {
			h.start(ctx)
		}
	}
	// TLS files are checked before any port is opened.
	grpcTLS, err := listenerTLS("gRPC", c.grpcTLS, s.log)
	if err != nil {
		return nil, err
	}
	httpTLS, err := listenerTLS("HTTP", c.httpTLS, s.log)
	if err != nil {
		return nil, err
	}
	gs := grpc.NewServer(c.grpcServerOptions(s, built, grpcTLS)...)
	mux := http.NewServeMux()
	for _, h := range built {
		if h.grpc != nil {
			h.grpc(gs)
		}
		if h.http != nil {
			h.http(mux)
		}
	}
	app := s.recovery.WrapHTTP(mux) // a panicking handler is answered 500 and logged
	hs := newHTTPServer(app, s.log)
	hs.TLSConfig = httpTLS
	gl := grpcListener("gRPC", c.grpcAddr, gs, s.log, logServing(s.log, "serving gRPC", "tls", grpcTLS != nil, "mtls", c.grpcTLS.ClientCA != ""))
	gl.listen = listenGRPC
	listeners := []listener{gl, httpListener("HTTP", c.httpAddr, hs, s.log, logServing(s.log, "serving HTTP", "tls", httpTLS != nil, "mtls", c.httpTLS.ClientCA != ""))}
	for _, h := range built {
		if h.listeners != nil {
			listeners = append(listeners, h.listeners()...)
		}
	}
	if c.debugAddr != "" {
		ds := newHTTPServer(debugHandler(app), s.log)
		ds.WriteTimeout = 0 // profiles and traces stream for as long as asked
		listeners = append(listeners, httpListener("debug", c.debugAddr, ds, s.log, func(addr net.Addr) {
			s.log.Warn("serving profiles (pprof): keep this address private", "addr", addr.String())
		}))
	}
	return listeners, nil
}

// grpcServerOptions are the gRPC server's options: requests are decoded
// first (descriptor bytes that are not UTF-8 are decided, other requests
// that do not decode are refused naming the field: wire.DecodeOptions),
// so its interceptors are the outermost; then the components'; then panic
// recovery (a panicking handler is answered Internal and logged, the
// process stays); then the server's own.
func (c *servingConfig) grpcServerOptions(s *server, built []hooks, cfg *tls.Config) []grpc.ServerOption {
	opts := wire.DecodeOptions(service.Tolerance(), rlqs.Tolerance())
	for _, h := range built {
		opts = append(opts, h.grpcOptions...)
	}
	opts = append(opts, s.recovery.ServerOptions()...)
	return append(opts, c.grpcOptions(cfg)...)
}

// serve opens every listener and serves on it until ctx is done or one
// fails; then health checks turn to not serving, and, after the shutdown
// delay, the servers stop taking calls and finish those in flight within
// the shutdown timeout.
func (c *servingConfig) serve(ctx context.Context, s *server, built []hooks, listeners []listener) error {
	opened, err := listen(listeners)
	if err != nil {
		return err
	}
	failed := make(chan error, len(listeners))
	for i, l := range listeners {
		go func() { failed <- fmt.Errorf("%s server: %w", l.name, l.serve(opened[i])) }()
		l.opened(opened[i].Addr())
	}
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-failed:
	}

	// Health checks turn to not serving first. While load balancers and
	// Envoy's health checks notice, for the shutdown delay, every call is
	// still served; then the servers stop taking new calls and finish the
	// ones in flight, within the timeout. A server that failed skips the
	// delay: it is not serving anyway.
	s.svc.Drain()
	if serveErr == nil && c.shutdownDelay > 0 {
		s.log.Info("shutting down: health checks report not serving; still serving calls", "delay", c.shutdownDelay)
		select {
		case <-time.After(c.shutdownDelay):
		case serveErr = <-failed:
		}
	}
	s.log.Info("shutting down: draining in-flight calls", "timeout", c.shutdownTimeout)
	for _, h := range built {
		if h.drain != nil {
			h.drain()
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer cancel()
	var stopping sync.WaitGroup
	for _, l := range listeners {
		stopping.Go(func() { l.shutdown(sctx) })
	}
	stopping.Wait()
	if serveErr != nil {
		return serveErr
	}
	s.log.Info("stopped")
	return nil
}

// listen opens every listener's address, or none: on an error it closes
// those it opened.
func listen(listeners []listener) ([]net.Listener, error) {
	var opened []net.Listener
	for _, l := range listeners {
		open := l.listen
		if open == nil {
			open = func(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }
		}
		lis, err := open(l.addr)
		if err != nil {
			for _, o := range opened {
				o.Close()
			}
			return nil, fmt.Errorf("%s listener: %w", l.name, err)
		}
		opened = append(opened, lis)
	}
	return opened, nil
}

// newHTTPServer returns an HTTP server for handler with timeouts fit for
// short calls.
func newHTTPServer(handler http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}
