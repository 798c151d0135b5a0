package client_test

import (
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// testRules are the rules of the tests' and examples' servers. Their
// clock stands still unless a test moves it, so that every figure is
// exact.
const testRules = `
domain: api
descriptors:
  # 3 per minute, a token back every 20s.
  - key: user_id
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: token_bucket}
  # 5 per minute in fixed windows, starting at whole minutes.
  - key: path
    rate_limit: {name: per_path, unit: minute, requests_per_unit: 5}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: internal
    rate_limit: {unlimited: true}
  # 4 per second, a token back every 250ms: for tests in real time.
  - key: pace
    rate_limit: {unit: second, requests_per_unit: 4, algorithm: token_bucket}
  # A queue of 3 draining 1 per second: each admitted hit waits 1s for
  # each hit ahead of it.
  - key: queue
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: leaky_bucket, burst: 3}
  # Concurrency limits: 2 in flight, each slot held until released or
  # for 30s unless renewed; ...
  - key: export
    concurrency: {max_in_flight: 2, lease_ttl: 30s}
  # ... beside a rate limit of 3 per minute; ...
  - key: report
    rate_limit: {unit: minute, requests_per_unit: 3}
    concurrency: {max_in_flight: 2, lease_ttl: 10s}
  # ... 5 in flight, for many requests at once; ...
  - key: pool
    concurrency: {max_in_flight: 5, lease_ttl: 30s}
  # ... and 1 in flight held for 1s unless renewed, for tests in real
  # time.
  - key: long
    concurrency: {max_in_flight: 1, lease_ttl: 1s}
`

// epoch is a whole minute, where the servers' clocks start.
var epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// server is a ratelimitd engine served on 127.0.0.1.
type server struct {
	addr  string
	clock *clocktest.Clock // the server's clock, moved by hand
	svc   *service.Service
	stop  func()
}

// serve starts a ratelimitd engine deciding testRules on the memory
// backend, its gRPC API on a free port of 127.0.0.1.
func serve(opts service.Options) (*server, error) {
	return serveOn(opts, false)
}

// serveOn is serve, with the server's clock the real one when realTime
// is true: for tests of waiting, which wait.
func serveOn(opts service.Options, realTime bool) (*server, error) {
	rules, err := config.Parse(config.File{Name: "rules.yaml", Data: []byte(testRules)})
	if err != nil {
		return nil, err
	}
	clk := clocktest.New(epoch)
	now := clk.Now
	if realTime {
		clk, now = nil, time.Now
	}
	be := memory.New(memory.Options{Now: now, SweepInterval: -1})
	svc, err := service.New(be, rules, opts)
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	gs := grpc.NewServer()
	svc.RegisterGRPC(gs)
	go gs.Serve(lis)
	return &server{addr: lis.Addr().String(), clock: clk, svc: svc, stop: gs.Stop}, nil
}

// startServer is serve for a test, stopped when it ends.
func startServer(t testing.TB, opts service.Options) *server {
	t.Helper()
	s, err := serve(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.stop)
	return s
}

// startRealTimeServer is startServer with the real clock: its clock is
// nil.
func startRealTimeServer(t testing.TB) *server {
	t.Helper()
	s, err := serveOn(service.Options{}, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.stop)
	return s
}

// closedAddr returns an address of 127.0.0.1 nothing listens on.
func closedAddr(t testing.TB) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}
