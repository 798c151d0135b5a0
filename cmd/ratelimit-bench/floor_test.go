package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The floor server answers every descriptor OK with a limit, what remains
// and a reset, as ratelimitd answers an admitted request, and a run of the
// generator against it counts every call.
func TestFloorServer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	exited := make(chan int, 1)
	go func() {
		exited <- floorMain(ctx, []string{"-addr", "127.0.0.1:0"}, pw)
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-exited; code != exitOK {
			t.Errorf("floor-server exited %d after its context ended, want %d", code, exitOK)
		}
	})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var rec struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "serving gRPC" {
				addr <- rec.Addr
			}
		}
	}()
	var a string
	select {
	case a = <-addr:
	case <-time.After(10 * time.Second):
		t.Fatal("floor-server logged no \"serving gRPC\" within 10s")
	}

	conn, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	entry := func(k, v string) *ratelimitv3.RateLimitDescriptor {
		return &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: k, Value: v}}}
	}
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain: "any", Descriptors: []*ratelimitv3.RateLimitDescriptor{entry("user_id", "a"), entry("path", "/b")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.Statuses) != 2 {
		t.Fatalf("answer %v, want OK with 2 statuses", resp)
	}
	for i, st := range resp.Statuses {
		if st.Code != rlsv3.RateLimitResponse_OK || st.CurrentLimit == nil || st.LimitRemaining == 0 || st.DurationUntilReset == nil {
			t.Errorf("status %d: %v, want OK with a limit, what remains and a reset", i, st)
		}
	}

	r, err := runBench(ctx, &benchConfig{
		Addr: a, Workers: 4, Conns: 2, Count: 400, Keys: 10, Dist: "uniform", Descriptors: 2,
		Domain: "any", Key: "user_id", ValuePrefix: "u-", Timeout: 5 * time.Second, Seed: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests != 400 || r.RequestCodes.OK != 400 || len(r.Errors) != 0 {
		t.Errorf("generator against the floor: %d calls, %d OK, errors %v; want 400 OK", r.Requests, r.RequestCodes.OK, r.Errors)
	}
}

func TestFloorServerListensOnLoopbackOnly(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", "10.1.2.3:0", ":0", "localhost:0", "nonsense"} {
		var stderr strings.Builder
		if code := floorMain(context.Background(), []string{"-addr", addr}, &stderr); code != exitUsage {
			t.Errorf("-addr %s: exit %d, want %d", addr, code, exitUsage)
		}
		if !strings.Contains(stderr.String(), "loopback") {
			t.Errorf("-addr %s: %q does not say the address must be on loopback", addr, stderr.String())
		}
	}
}
