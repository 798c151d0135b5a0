package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func TestRefStatsUsageErrors(t *testing.T) {
	for _, c := range []struct {
		env  env
		args []string
		want string
	}{
		{nil, []string{"-statsd-addr", "localhost"}, `invalid -statsd-addr "localhost"; want host:port`},
		{nil, []string{"-statsd-dogstatsd"}, `-statsd-dogstatsd needs -statsd-addr`},
		{env{"RATELIMITD_STATSD_TAGS": "env=prod"}, nil, `invalid RATELIMITD_STATSD_TAGS: "env=prod" is not key:value`},
		{nil, []string{"-statsd-flush-interval", "0s"}, `invalid -statsd-flush-interval 0s; it must be positive`},
		{nil, []string{"-reference-stats-max-keys", "0"}, `invalid -reference-stats-max-keys 0; it must be at least 1`},
		{nil, []string{"-reference-metrics-path", "metrics"}, `invalid -reference-metrics-path "metrics"; it must start with /`},
		{nil, []string{"-reference-metrics-mapping", "m.yaml"}, `-reference-metrics-mapping needs -reference-metrics-addr`},
	} {
		code, _, errOut := runMain(t, c.env, c.args...)
		if code != exitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("%v %v: exit %d, stderr %q; want exit 2 and %q", c.env, c.args, code, errOut, c.want)
		}
	}
}

func TestRefStatsBadMappingFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "mapping.yaml")
	if err := os.WriteFile(file, []byte("mappings:\n  - match: a.b\n    nmae: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runMain(t, nil, "-config", "../../examples", "-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0",
		"-reference-metrics-addr", "127.0.0.1:0", "-reference-metrics-mapping", file)
	if code != exitError || !strings.Contains(errOut, "-reference-metrics-mapping "+file) || !strings.Contains(errOut, "nmae") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
}

// TestServeRefStats runs serve with statsd and the reference's Prometheus
// endpoint on, decides, and finds the reference's statistics on a UDP
// socket, on the reference endpoint, and ratelimitd's own on /metrics.
func TestServeRefStats(t *testing.T) {
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	p := startServeEnv(t, env{"RATELIMITD_STATSD_ADDR": udp.LocalAddr().String(), "RATELIMITD_STATSD_TAGS": "env:test"}, true,
		"-config", "../../examples", "-reference-metrics-addr", "127.0.0.1:0", "-statsd-flush-interval", "50ms")
	ctx := context.Background()
	addrs := map[string]string{"serving gRPC": p.grpcAddr, "serving HTTP": p.httpAddr, "serving reference metrics": p.addr(t, "serving reference metrics")}

	conn, err := grpc.NewClient(addrs["serving gRPC"], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := &rlsv3.RateLimitRequest{Domain: "posts", HitsAddend: 3, Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user_id", Value: "alice"}}}}}
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(cctx, req); err != nil {
		t.Fatal(err)
	}

	// 3 hits of a limit of 2 per second: refused, 1 over the limit and
	// 1 between the near-limit threshold (1) and the limit.
	want := map[string]bool{
		"ratelimit.service.config_load_success.__env=test:1|c":                 false,
		"ratelimit.service.rate_limit.posts.user_id.total_hits.__env=test:3|c": false,
		"ratelimit.service.rate_limit.posts.user_id.over_limit.__env=test:1|c": false,
		"ratelimit.service.rate_limit.posts.user_id.near_limit.__env=test:1|c": false,
		"ratelimit_server.ShouldRateLimit.total_requests.__env=test:1|c":       false,
	}
	buf := make([]byte, 65536)
	udp.SetReadDeadline(time.Now().Add(30 * time.Second))
	for missing := len(want); missing > 0; {
		n, err := udp.Read(buf)
		if err != nil {
			t.Fatalf("statsd lines missing: %v (%v)", want, err)
		}
		for _, l := range strings.Split(string(buf[:n]), "\n") {
			if seen, ok := want[l]; ok && !seen {
				want[l] = true
				missing--
			}
		}
	}

	get := func(url string) string {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s", url, resp.Status)
		}
		return string(b)
	}
	// The flush that sent the lines reaches the Prometheus sink after the
	// statsd one: wait for it.
	wantRef := []string{
		`ratelimit_service_rate_limit_total_hits{domain="posts",env="test",key1="user_id"} 3`,
		`ratelimit_service_rate_limit_over_limit{domain="posts",env="test",key1="user_id"} 1`,
		`ratelimit_service_config_load_success{env="test"} 1`,
		`ratelimit_service_total_requests{env="test",grpc_method="ShouldRateLimit"} 1`,
	}
	var lacking []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ref := get(fmt.Sprintf("http://%s/metrics", addrs["serving reference metrics"]))
		lacking = lacking[:0]
		for _, s := range wantRef {
			if !strings.Contains(ref, s) {
				lacking = append(lacking, s)
			}
		}
		if len(lacking) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, s := range lacking {
		t.Errorf("reference metrics lack %s", s)
	}
	own := get(fmt.Sprintf("http://%s/metrics", addrs["serving HTTP"]))
	for _, s := range []string{
		`ratelimitd_decisions_total{domain="posts",result="over_limit",rule="posts.user_id"} 1`,
		`ratelimitd_reference_stats_keys 1`,
		`ratelimitd_reference_stats_dropped_total 0`,
		`ratelimitd_statsd_send_errors_total 0`,
	} {
		if !strings.Contains(own, s) {
			t.Errorf("/metrics lacks %s", s)
		}
	}
	if strings.Contains(own, "ratelimit_service_") {
		t.Error("/metrics shows the reference's series: they belong on -reference-metrics-addr")
	}

	if code := p.stop(t); code != exitOK {
		t.Fatalf("exit %d after shutdown, want 0", code)
	}
}
