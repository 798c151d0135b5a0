package service_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/ratelimitd/ratelimitd/internal/footprint"
	"github.com/ratelimitd/ratelimitd/internal/rulegen"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/console"
	"github.com/ratelimitd/ratelimitd/pkg/metrics"
	"github.com/ratelimitd/ratelimitd/pkg/service"
	"github.com/ratelimitd/ratelimitd/pkg/wire"
)

// scaleKeys is about how many (route, user) pairs BenchmarkShouldRateLimitRules
// decides at every rule count: ceil(scaleKeys/rules) users per route, so
// that the backend holds as many keys whatever the rules, and only the
// rules differ.
const scaleKeys = 1 << 17

// BenchmarkShouldRateLimitRules decides requests of one descriptor,
// route=rN and user=uM, N drawn at random from a domain of 100 to 100,000
// routes (rulegen.Routes), on the memory backend, with the observers the
// server runs (metrics, and the ops console's), called directly and over
// gRPC (in memory, bufconn, client and server in this process): what a
// decision costs should not grow with the rules. ns/op is wall time per
// decision with GOMAXPROCS callers; CPU-ns/op the process's CPU time (user
// and system, the collector's included) per decision. docs/performance.md
// ("Rule sets at scale") gives the numbers and this command:
//
//	go test -run '^$' -bench ShouldRateLimitRules -benchmem -count 5 ./pkg/service
func BenchmarkShouldRateLimitRules(b *testing.B) {
	for _, call := range []string{"direct", "grpc"} {
		for _, n := range []int{100, 1_000, 10_000, 100_000} {
			b.Run(fmt.Sprintf("%s/rules=%d", call, n), func(b *testing.B) {
				benchmarkRules(b, call, n)
			})
		}
	}
}

func benchmarkRules(b *testing.B, call string, n int) {
	rules, err := config.Parse(config.File{Name: "scale.yaml", Data: rulegen.Routes("scale", n)})
	if err != nil {
		b.Fatal(err)
	}
	be := memory.New(memory.Options{})
	defer be.Close()
	s := newScaleServer(b, be, rules)
	decide := decideFunc(s.svc.ShouldRateLimit)
	if call == "grpc" {
		client := grpcClient(b, s.svc)
		decide = func(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
			return client.ShouldRateLimit(ctx, req)
		}
	}
	routes := make([]string, n)
	for i := range routes {
		routes[i] = rulegen.Value(i)
	}
	users := make([]string, (scaleKeys+n-1)/n)
	for i := range users {
		users[i] = fmt.Sprintf("u%d", i)
	}
	// Every key once, so that the measured decisions find the backend,
	// the metrics and the console as they stay.
	req := scaleRequest()
	for _, r := range routes {
		for _, u := range users {
			check(b, req, r, u, s.svc.ShouldRateLimit)
		}
	}
	var seed atomic.Uint64
	b.ReportAllocs()
	cpu := cpuTime()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(seed.Add(1), uint64(n)))
		req := scaleRequest()
		for pb.Next() {
			check(b, req, routes[rng.IntN(len(routes))], users[rng.IntN(len(users))], decide)
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "CPU-ns/op")
}

// decideFunc is ShouldRateLimit, of the service or of a client.
type decideFunc func(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error)

// grpcClient serves svc over gRPC on an in-memory listener, as the server
// does (its decoding options and interceptors), and returns a client.
func grpcClient(b *testing.B, svc *service.Service) rlsv3.RateLimitServiceClient {
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(append(wire.DecodeOptions(service.Tolerance()),
		grpc.ChainUnaryInterceptor(svc.UnaryInterceptor()), grpc.ChainStreamInterceptor(svc.StreamInterceptor()))...)
	svc.RegisterGRPC(gs)
	go gs.Serve(lis)
	b.Cleanup(gs.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// scaleRequest is a request of domain "scale" with one descriptor
// route=?, user=?, whose values decide sets.
func scaleRequest() *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "scale", Descriptors: []*rlv3.RateLimitDescriptor{{
		Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: rulegen.Key}, {Key: rulegen.Nested}},
	}}}
}

// check decides req for route and user with decide: it must be admitted.
func check(b *testing.B, req *rlsv3.RateLimitRequest, route, user string, decide decideFunc) {
	e := req.Descriptors[0].Entries
	e[0].Value, e[1].Value = route, user
	resp, err := decide(context.Background(), req)
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit == nil {
		b.Fatalf("%s/%s: %v, %v", route, user, resp, err)
	}
}

// cpuTime is the process's CPU time so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// admitAll is a backend that admits everything and keeps nothing, so
// that what the footprint benchmarks measure is the rules' memory and
// not the counters'.
type admitAll struct{}

func (admitAll) Decide(_ context.Context, reqs []algo.Request, out []algo.Decision) error {
	for i := range reqs {
		out[i] = algo.Decision{Allowed: true, Remaining: reqs[i].Limit.Requests - 1, ResetAfter: time.Second}
	}
	return nil
}

// scaleServer is a service on rules with the observers the server runs
// (metrics, the ops console's), on backend.
type scaleServer struct {
	svc  *service.Service
	mets *metrics.Metrics
	cons *console.Console
}

func newScaleServer(b *testing.B, backend algo.Backend, rules *config.Rules) *scaleServer {
	mets, err := metrics.New(prometheus.NewRegistry(), metrics.Options{})
	if err != nil {
		b.Fatal(err)
	}
	cons, err := console.New(console.Options{})
	if err != nil {
		b.Fatal(err)
	}
	svc, err := service.New(backend, rules, service.Options{Observer: service.Tee(mets, cons)})
	if err != nil {
		b.Fatal(err)
	}
	s := &scaleServer{svc: svc, mets: mets, cons: cons}
	s.setRules(rules)
	return s
}

// setRules puts rules in force as the server does: the service, then
// every observer.
func (s *scaleServer) setRules(rules *config.Rules) {
	s.svc.SetRules(rules)
	s.mets.Rules(rules)
	s.cons.Rules(rules)
}

// decideEach decides route=rN, user=u0 once for each of n routes.
func (s *scaleServer) decideEach(b *testing.B, n int) {
	req := scaleRequest()
	for i := range n {
		check(b, req, rulegen.Value(i), "u0", s.svc.ShouldRateLimit)
	}
}

// parseScale parses a domain "scale" of rulegen.Routes from data.
func parseScale(b testing.TB, data []byte) *config.Rules {
	rules, err := config.Parse(config.File{Name: "scale.yaml", Data: data})
	if err != nil {
		b.Fatalf("%.500v", err)
	}
	return rules
}

// BenchmarkRulesFootprint loads a domain of 10,000 and 100,000 routes
// into a service with the server's observers and decides each route once
// (on a backend that keeps no counters): B/rule is the live heap each
// rule then holds, the rule set's and every per-rule state's
// (internal/footprint), rules-B/rule the rule set's alone, RSS-B/rule and
// cycled-RSS-B/rule the resident set grown per rule. docs/performance.md
// gives the numbers and this command:
//
//	go test -run '^$' -bench RulesFootprint -benchtime 1x -count 3 ./pkg/service
func BenchmarkRulesFootprint(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			data := rulegen.Routes("scale", n)
			for b.Loop() {
				before := footprint.Baseline()
				rules := parseScale(b, data)
				loaded := footprint.Take()
				s := newScaleServer(b, admitAll{}, rules)
				s.decideEach(b, n)
				filled := footprint.Take()
				footprint.Cycle()
				cycled := footprint.Take()
				footprint.ReportPer(b, before, filled, cycled, n, "rule")
				b.ReportMetric((float64(loaded.Heap)-float64(before.Heap))/float64(n), "rules-B/rule")
				runtime.KeepAlive(s)
			}
		})
	}
}

// BenchmarkReloadRules loads a domain of 100,000 routes into a service
// with the server's observers, decides each route once, then reloads
// the same file as the server does (parse, put in force, give the
// garbage back to the system: debug.FreeOSMemory, as cmd/ratelimitd does
// after each rule set) and decides each route again under the new rules.
// It reports the time of the first load and of the reload (load-s,
// reload-s, parsing and putting in force; release-s, giving memory
// back), and the live heap and resident set (MB) once loaded, at the
// reload's peak (peak-RSS-MB: VmHWM, reset before the reload) and once
// reloaded: the old rules must be freed, not held beside the new ones.
// docs/performance.md gives the numbers and this command:
//
//	go test -run '^$' -bench ReloadRules -benchtime 1x -count 3 ./pkg/service
func BenchmarkReloadRules(b *testing.B) {
	const n = 100_000
	data := rulegen.Routes("scale", n)
	mb := func(v uint64) float64 { return float64(v) / (1 << 20) }
	for b.Loop() {
		footprint.Baseline()
		start := time.Now()
		rules := parseScale(b, data)
		load := time.Since(start)
		debug.FreeOSMemory()
		s := newScaleServer(b, admitAll{}, rules)
		rules = nil
		s.decideEach(b, n)
		loaded := footprint.Take()
		resetPeakRSS(b)
		start = time.Now()
		s.setRules(parseScale(b, data))
		reload := time.Since(start)
		start = time.Now()
		debug.FreeOSMemory()
		release := time.Since(start)
		s.decideEach(b, n)
		peak := peakRSS(b)
		reloaded := footprint.Take()
		b.ReportMetric(load.Seconds(), "load-s")
		b.ReportMetric(reload.Seconds(), "reload-s")
		b.ReportMetric(release.Seconds(), "release-s")
		b.ReportMetric(mb(loaded.Heap), "loaded-heap-MB")
		b.ReportMetric(mb(reloaded.Heap), "reloaded-heap-MB")
		b.ReportMetric(mb(loaded.RSS), "loaded-RSS-MB")
		b.ReportMetric(mb(peak), "peak-RSS-MB")
		b.ReportMetric(mb(reloaded.RSS), "reloaded-RSS-MB")
		runtime.KeepAlive(s)
	}
}

// resetPeakRSS resets the process's peak resident set (VmHWM).
func resetPeakRSS(b *testing.B) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Skipf("cannot reset the peak resident set: %v", err)
	}
}

// peakRSS returns the process's peak resident set since the last
// resetPeakRSS (VmHWM of /proc/self/status), in bytes.
func peakRSS(b *testing.B) uint64 {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Skip(err)
	}
	// VmHWM reads as VmRSS does.
	hwm, err := footprint.ParseVmRSS(bytes.ReplaceAll(status, []byte("VmHWM:"), []byte("VmRSS:")))
	if err != nil {
		b.Fatal(err)
	}
	return hwm
}
