package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/service"
	"github.com/ratelimitd/ratelimitd/pkg/wire"
)

// A component is one part of the server: the rule source, a layer of the
// backend stack, a front end (RLS, RLQS), region sync, the console, a
// kind of statistics. It declares and checks its own flags, builds its
// part from what the components before it built, and returns hooks that
// run wires into the running server. serveComponents lists them; adding
// a part is one new component and one line in that list.
type component interface {
	// addFlags declares the component's flags on fs; each is also read
	// from its RATELIMITD_ variable.
	addFlags(fs *flag.FlagSet)
	// check checks what the flags cannot check themselves once every
	// flag is read; flagName names a flag as the user set it (its
	// variable, or -name), for errors.
	check(flagName func(string) string) error
	// build makes the component's part of s, reading what the
	// components before it in the list made, and returns its hooks.
	build(ctx context.Context, s *server) (hooks, error)
}

// hooks are what a built component adds to the running server. Any may
// be empty. The functions run once every component is built, so they may
// read anything s holds.
type hooks struct {
	// grpcOptions are options of the gRPC server: interceptors and stats
	// handlers, applied in the order of the components.
	grpcOptions []grpc.ServerOption
	// grpc registers the component's services on the gRPC port.
	grpc func(*grpc.Server)
	// http adds the component's routes to the HTTP port's mux.
	http func(*http.ServeMux)
	// rules is told of each rule set put in force after the first
	// (a reload, an xDS update), in the order of the components.
	rules func(*config.Rules)
	// rejected is told of each rule set rejected as invalid; the rules
	// in force stay.
	rejected func(error)
	// health is called once, before any port opens, with the function
	// that marks a part of the server unhealthy for a reason, or healthy
	// again (service.Service.SetUnhealthy); it may go on marking until
	// ctx is done.
	health func(ctx context.Context, mark func(part, reason string, bad bool))
	// start starts the component's background work once every hook is
	// wired, before any port opens.
	start func(ctx context.Context)
	// listeners returns the component's servers on addresses of their
	// own.
	listeners func() []listener
	// drain is called as shutdown begins, before the servers finish
	// their calls in flight: what never ends by itself (a stream) ends.
	drain func()
	// close releases what the component holds once the servers have
	// stopped, or when a later component fails to build: in the reverse
	// order of the components.
	close func()
}

// server is what the components build, each reading what those before it
// made, and what run serves.
type server struct {
	log *slog.Logger
	// reg is the registry GET /metrics serves.
	reg *prometheus.Registry
	// lookupEnv reads the environment (GOGC, the OTEL_* variables).
	lookupEnv func(string) (string, bool)
	// flagName names a flag as the user set it (its variable, or
	// -name), for errors.
	flagName func(string) string
	// now is the clock every component decides and keeps time by.
	now func() time.Time
	// recovery recovers the panics of every server's handlers, answering
	// Internal (or 500) and logging; Service.Panics counts them all.
	recovery *wire.Recovery

	// source is the rule source, first of the components: the rules at
	// start, where they come from and when they were loaded.
	source *ruleSource
	// stack is the backend stack, which its layers build bottom up.
	stack *stack
	// observers are told of every decision (metrics, statistics,
	// console): the service is built with them.
	observers []service.Observer
	// svc is the rate limit service (RLS v3 and the own API): the health
	// checks and the HTTP endpoints are its.
	svc *service.Service

	// onRules and onReject are the components' rules and rejected hooks,
	// once wired.
	onRules  []func(*config.Rules)
	onReject []func(error)
}

// putInForce puts the rule set r in force: every component's rules hook,
// in the order of the components. The rule source calls it.
func (s *server) putInForce(r *config.Rules) {
	for _, f := range s.onRules {
		f(r)
	}
	releaseMemory() // the load's garbage, and the rules replaced
}

// reject tells every component of a rule set rejected as invalid. The
// rule source calls it.
func (s *server) reject(err error) {
	for _, f := range s.onReject {
		f(err)
	}
}

// errStoppedEarly is returned by a build stopped by ctx before the server
// could serve (waiting for the first rules from xDS): run then returns
// nil.
var errStoppedEarly = errors.New("stopped before serving")

// A listener is a server on an address of its own.
type listener struct {
	// name names it in errors: "<name> listener: …", "<name> server: …".
	name string
	addr string
	// listen opens addr; nil listens on TCP.
	listen func(addr string) (net.Listener, error)
	// serve serves lis until the server stops.
	serve func(lis net.Listener) error
	// opened logs where it serves.
	opened func(addr net.Addr)
	// shutdown stops taking calls and finishes those in flight, cutting
	// them short once ctx is done.
	shutdown func(ctx context.Context)
}

// httpListener serves hs on addr, logging opened and, if cut short, a
// warning.
func httpListener(name, addr string, hs *http.Server, log *slog.Logger, opened func(net.Addr)) listener {
	return listener{
		name: name, addr: addr, opened: opened,
		serve: func(lis net.Listener) error {
			if hs.TLSConfig != nil {
				// No file names: the config supplies the certificate and
				// rotates it.
				return hs.ServeTLS(lis, "", "")
			}
			return hs.Serve(lis)
		},
		shutdown: func(ctx context.Context) {
			if err := hs.Shutdown(ctx); err != nil {
				log.Warn("HTTP calls cut short", "error", err)
			}
		},
	}
}

// grpcListener serves gs on addr, logging opened and, if cut short, a
// warning.
func grpcListener(name, addr string, gs *grpc.Server, log *slog.Logger, opened func(net.Addr)) listener {
	return listener{
		name: name, addr: addr, opened: opened, serve: gs.Serve,
		shutdown: func(ctx context.Context) {
			stopped := make(chan struct{})
			go func() {
				gs.GracefulStop()
				close(stopped)
			}()
			select {
			case <-stopped:
			case <-ctx.Done():
				log.Warn("gRPC calls cut short: shutdown timeout reached")
				gs.Stop()
			}
		},
	}
}
