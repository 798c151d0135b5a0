package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// testRules: "api" admits everything the tests send (a limit far above
// it); "tight" admits 5 per user per minute, on a clock that stands still.
const testRules = `
domain: api
descriptors:
  - key: user_id
    rate_limit: {unit: second, requests_per_unit: 1000000}
`

const tightRules = `
domain: tight
descriptors:
  - key: user_id
    rate_limit: {unit: minute, requests_per_unit: 5}
`

// nestedRules admits 1 per minute of user u1 below each route, for
// -nested.
const nestedRules = `
domain: nested
descriptors:
  - key: route
    descriptors:
      - key: user
        value: u1
        rate_limit: {unit: minute, requests_per_unit: 1}
`

// startServer serves the test rules from pkg/service on the memory
// backend on a free port of 127.0.0.1, until the test ends.
func startServer(t *testing.T) string {
	t.Helper()
	rules, err := config.Parse(
		config.File{Name: "api.yaml", Data: []byte(testRules)},
		config.File{Name: "tight.yaml", Data: []byte(tightRules)},
		config.File{Name: "nested.yaml", Data: []byte(nestedRules)},
	)
	if err != nil {
		t.Fatal(err)
	}
	epoch := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	be := memory.New(memory.Options{Now: func() time.Time { return epoch }, SweepInterval: -1})
	svc, err := service.New(be, rules, service.Options{})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	svc.RegisterGRPC(gs)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}

// smallConfig returns a small valid run against addr.
func smallConfig(addr string) *benchConfig {
	return &benchConfig{
		Addr: addr, Workers: 4, Conns: 2, Keys: 100, Dist: "uniform", ZipfS: 1.1,
		Descriptors: 1, Domain: "api", Key: "user_id", ValuePrefix: "user-",
		Timeout: 5 * time.Second, Seed: 1,
	}
}

// checkCounts asserts that a report's counts add up: every completed call
// is an answer or an error, every answer has a status per descriptor,
// and every answer has a latency.
func checkCounts(t *testing.T, r *report, descriptors int) {
	t.Helper()
	var errs uint64
	for _, n := range r.Errors {
		errs += n
	}
	answers := r.RequestCodes.OK + r.RequestCodes.OverLimit + r.RequestCodes.Unknown
	if answers+errs != r.Requests {
		t.Errorf("%d answers + %d errors != %d requests", answers, errs, r.Requests)
	}
	if r.DescriptorsDecided != answers*uint64(descriptors) {
		t.Errorf("%d descriptor statuses for %d answers of %d descriptors", r.DescriptorsDecided, answers, descriptors)
	}
	if r.Latency.Count != answers {
		t.Errorf("%d latencies for %d answers", r.Latency.Count, answers)
	}
	if answers > 0 && !(r.Latency.P50 <= r.Latency.P99 && r.Latency.P99 <= r.Latency.P999 && r.Latency.P999 <= r.Latency.Max) {
		t.Errorf("percentiles out of order: %+v", r.Latency)
	}
	if r.cpuOf("ratelimit-bench") == nil || r.cpuOf("ratelimit-bench").PID != os.Getpid() {
		t.Errorf("no CPU figure for the generator itself: %+v", r.CPU)
	}
	var text, js bytes.Buffer
	if err := r.writeText(&text); err != nil {
		t.Fatal(err)
	}
	if err := r.writeJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Requests != r.Requests {
		t.Errorf("JSON report does not read back (%v): %s", err, js.String())
	}
	if t.Failed() {
		t.Logf("report:\n%s", text.String())
	}
}

func TestClosedLoopForADuration(t *testing.T) {
	addr := startServer(t)
	c := smallConfig(addr)
	c.Duration = time.Second
	c.Descriptors = 2
	c.Warmup = 100 * time.Millisecond
	c.Procs = []proc{{Name: "server", PID: os.Getpid()}} // the server runs in this process
	r, err := runBench(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	checkCounts(t, r, 2)
	if r.Requests == 0 || r.RequestCodes.OK != r.Requests || len(r.Errors) != 0 {
		t.Errorf("want only OK answers: %d requests, codes %+v, errors %v", r.Requests, r.RequestCodes, r.Errors)
	}
	if r.Mode != "closed" || r.SendLag != nil || r.cpuOf("server") == nil {
		t.Errorf("mode %s, send lag %v, CPU %+v", r.Mode, r.SendLag, r.CPU)
	}
}

func TestClosedLoopForACount(t *testing.T) {
	addr := startServer(t)
	c := smallConfig(addr)
	c.Count = 500
	c.Dist = "zipf"
	r, err := runBench(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	checkCounts(t, r, 1)
	if r.Requests != 500 || r.RequestCodes.OK != 500 {
		t.Errorf("%d requests, %d OK; want 500 each", r.Requests, r.RequestCodes.OK)
	}
}

// TestBackendCallsAreCountedOverTheMeasurement checks that the backend's
// count is read once before and once after the measured interval (none
// during the warm-up's calls), and that the report divides the calls made
// by the calls the backend ran.
func TestBackendCallsAreCountedOverTheMeasurement(t *testing.T) {
	addr := startServer(t)
	c := smallConfig(addr)
	c.Count = 200
	c.Warmup = 50 * time.Millisecond
	var reads []uint64
	c.BackendCalls = func(context.Context) (uint64, error) {
		reads = append(reads, uint64(1000+10*len(reads))) // 1000, then 1010
		return reads[len(reads)-1], nil
	}
	r, err := runBench(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	checkCounts(t, r, 1)
	if len(reads) != 2 {
		t.Fatalf("the backend's count was read %d times, want 2 (before and after measuring)", len(reads))
	}
	if bc := r.BackendCalls; bc == nil || bc.Calls != 10 || bc.DecisionsPerCall != 20 {
		t.Fatalf("backend calls %+v: want 10 calls, 20 decisions per call (200 requests)", bc)
	}
	var js bytes.Buffer
	if err := r.writeJSON(&js); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(js.String(), `"backend_calls": {`) || !strings.Contains(js.String(), `"decisions_per_call": 20`) {
		t.Errorf("the JSON report lacks the backend's calls:\n%s", js.String())
	}

	// A count that cannot be read fails the run: a row without it would
	// read as a server that needs no backend.
	c.BackendCalls = func(context.Context) (uint64, error) { return 0, errors.New("INFO refused") }
	if _, err := runBench(context.Background(), c); err == nil || !strings.Contains(err.Error(), "INFO refused") {
		t.Fatalf("err %v: want the count's error", err)
	}
}

func TestOverLimitIsCountedAllOrNothing(t *testing.T) {
	// Two keys, each request carrying both: the first 5 requests take
	// the 5 per minute of both; every later one is refused whole, both
	// descriptors over the limit.
	addr := startServer(t)
	c := smallConfig(addr)
	c.Domain, c.Keys, c.Descriptors, c.Count, c.Workers, c.Conns = "tight", 2, 2, 40, 3, 1
	r, err := runBench(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	checkCounts(t, r, 2)
	if r.RequestCodes != (codeCounts{OK: 5, OverLimit: 35}) {
		t.Errorf("request codes %+v, want 5 OK and 35 OVER_LIMIT", r.RequestCodes)
	}
	if r.DescriptorCodes != (codeCounts{OK: 10, OverLimit: 70}) {
		t.Errorf("descriptor codes %+v, want 10 OK and 70 OVER_LIMIT", r.DescriptorCodes)
	}
}

// TestNested sends a nested entry after -key's with -nested: each of 2
// routes has its 1 a minute of user u1, and no more; without it, nothing
// matches, and everything is OK.
func TestNested(t *testing.T) {
	addr := startServer(t)
	for nested, want := range map[string]codeCounts{"user=u1": {OK: 2, OverLimit: 18}, "": {OK: 20}} {
		c := smallConfig(addr)
		c.Domain, c.Key, c.ValuePrefix, c.Nested, c.Keys, c.Count, c.Workers, c.Conns = "nested", "route", "r", nested, 2, 20, 2, 1
		r, err := runBench(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		checkCounts(t, r, 1)
		if r.RequestCodes != want {
			t.Errorf("-nested %q: request codes %+v, want %+v", nested, r.RequestCodes, want)
		}
	}
}

func TestOpenLoopAtALowRate(t *testing.T) {
	addr := startServer(t)
	t.Run("duration", func(t *testing.T) {
		c := smallConfig(addr)
		c.Rate, c.Duration = 200, time.Second
		r, err := runBench(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		checkCounts(t, r, 1)
		// 200/s for 1s schedules exactly 200 calls.
		if r.Requests+r.Unsent != 200 {
			t.Errorf("%d sent + %d unsent, want 200 scheduled", r.Requests, r.Unsent)
		}
		if r.Mode != "open" || r.SendLag == nil || r.SendLag.Count != r.Requests {
			t.Errorf("mode %s, send lag %+v", r.Mode, r.SendLag)
		}
	})
	t.Run("count", func(t *testing.T) {
		c := smallConfig(addr)
		c.Rate, c.Count, c.Descriptors = 500, 150, 3
		r, err := runBench(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		checkCounts(t, r, 3)
		if r.Requests+r.Unsent != 150 {
			t.Errorf("%d sent + %d unsent, want 150", r.Requests, r.Unsent)
		}
	})
}

func TestErrorsAreCountedByCode(t *testing.T) {
	// A domain of 300 bytes breaks the server's bound (255): every call
	// is refused InvalidArgument.
	addr := startServer(t)
	c := smallConfig(addr)
	c.Domain, c.Count = strings.Repeat("d", 300), 20
	r, err := runBench(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	checkCounts(t, r, 1)
	if r.Errors["InvalidArgument"] != 20 || r.Requests != 20 {
		t.Errorf("errors %v of %d requests, want 20 InvalidArgument", r.Errors, r.Requests)
	}
}

func TestNoServer(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	c := smallConfig(addr)
	c.Count = 1
	if _, err := runBench(context.Background(), c); err == nil || !strings.Contains(err.Error(), "no gRPC server") {
		t.Fatalf("want a clear error without a server, got %v", err)
	}
}

func TestReplyParserAgreesWithProto(t *testing.T) {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 10, Name: "x"}, LimitRemaining: 3, DurationUntilReset: durationpb.New(time.Second)},
			{Code: rlsv3.RateLimitResponse_OVER_LIMIT},
			{},
			{Code: rlsv3.RateLimitResponse_OVER_LIMIT, LimitRemaining: 0},
		},
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "x-ratelimit-limit", Value: "10"}},
		RawBody:              []byte("body"),
	}
	b, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	var r reply
	if err := r.parse(b); err != nil {
		t.Fatal(err)
	}
	if r.overall != rlsv3.RateLimitResponse_OVER_LIMIT || r.statuses != 4 || r.ok != 1 || r.overLimit != 2 || r.unknown != 1 {
		t.Fatalf("parsed %+v", r)
	}
	if err := r.parse(b[:len(b)-2]); err == nil {
		t.Fatal("a truncated reply parsed")
	}
	// The codec joins a reply split over several buffers.
	var split reply
	if err := (rawCodec{}).Unmarshal(splitBuffers(b, 3), &split); err != nil || split.overLimit != 2 || split.ok != 1 {
		t.Fatalf("split reply: %+v, %v", split, err)
	}
}

func TestFlagsAreBoundedAndLoopbackOnly(t *testing.T) {
	ok := []string{"-addr", "127.0.0.1:8081", "-duration", "1s"}
	if _, _, err := parseFlags(ok, &bytes.Buffer{}); err != nil {
		t.Fatalf("%v: %v", ok, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-addr", "10.0.0.1:8081", "-duration", "1s"}, "not a loopback address"},
		{[]string{"-addr", "example.com:8081", "-duration", "1s"}, "not a loopback address"},
		{[]string{"-addr", "[2001:db8::1]:8081", "-duration", "1s"}, "not a loopback address"},
		{[]string{"-addr", "0.0.0.0:8081", "-duration", "1s"}, "not a loopback address"},
		{[]string{"-addr", "127.0.0.1", "-duration", "1s"}, "want host:port"},
		{[]string{"-addr", "127.0.0.1:0", "-duration", "1s"}, "port"},
		{[]string{}, "exactly one of -duration and -count"},
		{[]string{"-duration", "1s", "-count", "10"}, "exactly one of -duration and -count"},
		{[]string{"-duration", "11m"}, "at most 10m0s"},
		{[]string{"-count", "100000001"}, "at most 100000000"},
		{[]string{"-count", "100000000", "-rate", "1000"}, "want at most 10m0s"},
		{[]string{"-duration", "1s", "-descriptors", "4"}, "-descriptors 4"},
		{[]string{"-duration", "1s", "-keys", "0"}, "-keys 0"},
		{[]string{"-duration", "1s", "-dist", "pareto"}, "uniform or zipf"},
		{[]string{"-duration", "1s", "-dist", "zipf", "-zipf-s", "0"}, "-zipf-s"},
		{[]string{"-duration", "1s", "-workers", "2", "-conns", "3"}, "more connections"},
		{[]string{"-duration", "1s", "-pids", "ratelimitd"}, "name=PID"},
		{[]string{"-duration", "1s", "-nested", "user"}, "want key=value"},
		{[]string{"-duration", "1s", "-nested", "=u1"}, "want key=value"},
		{[]string{"-duration", "1s", "extra"}, "unexpected argument"},
	} {
		_, _, err := parseFlags(tc.args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an error with %q", tc.args, err, tc.want)
		}
	}
	for _, addr := range []string{"127.0.0.1:1", "127.9.9.9:8081", "[::1]:8081", "localhost:8081"} {
		if err := checkLoopback(addr); err != nil {
			t.Errorf("%s: %v", addr, err)
		}
	}
}

func TestMainRefusesBeforeConnecting(t *testing.T) {
	var out, errOut bytes.Buffer
	code := Main(context.Background(), []string{"-addr", "192.0.2.1:8081", "-duration", "1s"}, &out, &errOut)
	if code != exitUsage || !strings.Contains(errOut.String(), "not a loopback address") {
		t.Fatalf("exit %d, stderr %q", code, errOut.String())
	}
}

func TestMainPrintsJSON(t *testing.T) {
	addr := startServer(t)
	var out, errOut bytes.Buffer
	code := Main(context.Background(), []string{"-addr", addr, "-count", "50", "-workers", "2", "-warmup", "0", "-json"}, &out, &errOut)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var r report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil || r.Requests != 50 || r.RequestCodes.OK != 50 {
		t.Fatalf("report %+v (%v): %s", r, err, out.String())
	}
}

// splitBuffers cuts b into n buffers, as a reply read in pieces arrives.
func splitBuffers(b []byte, n int) mem.BufferSlice {
	var s mem.BufferSlice
	step := (len(b) + n - 1) / n
	for len(b) > 0 {
		k := min(step, len(b))
		s = append(s, mem.SliceBuffer(b[:k]))
		b = b[k:]
	}
	return s
}
