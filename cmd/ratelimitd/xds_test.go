package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimitd/ratelimitd/internal/xdstest"
)

func TestXDSUsageErrors(t *testing.T) {
	for _, c := range []struct {
		env  env
		args []string
		want string
	}{
		{nil, []string{"-xds-tls-ca", "ca.pem"}, `-xds-tls-ca needs -xds-server`},
		{env{"RATELIMITD_XDS_FORCE_START": "true"}, nil, `RATELIMITD_XDS_FORCE_START needs -xds-server`},
		{nil, []string{"-xds-server", "cp:18000", "-xds-node-metadata", "region"}, `invalid -xds-node-metadata: "region" is not key=value`},
		{nil, []string{"-xds-server", "cp:18000", "-xds-headers", "authorization=Bearer hunter2,authorization=x"}, `invalid -xds-headers: key "authorization" given twice`},
		{nil, []string{"-xds-server", "cp:18000", "-xds-tls-cert", "c.pem"}, `-xds-tls-cert and -xds-tls-key go together`},
		{nil, []string{"-xds-server", "cp:18000", "-xds-backoff-initial", "0s"}, `invalid -xds-backoff-initial 0s; it must be positive`},
		{env{"RATELIMITD_XDS_BACKOFF_MAX": "1s"}, []string{"-xds-server", "cp:18000", "-xds-backoff-initial", "2s"}, `invalid RATELIMITD_XDS_BACKOFF_MAX 1s; it must be at least -xds-backoff-initial (2s)`},
	} {
		code, _, errOut := runMain(t, c.env, c.args...)
		if code != exitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("%v %v: exit %d, stderr %q; want exit 2 and %q", c.env, c.args, code, errOut, c.want)
		}
		if strings.Contains(errOut, "hunter2") {
			t.Errorf("%v %v: stderr shows a header value: %q", c.env, c.args, errOut)
		}
	}
	code, _, errOut := runMain(t, nil, "-xds-server", "127.0.0.1:1", "-xds-tls-ca", "/nonexistent/ca.pem",
		"-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0")
	if code != exitError || !strings.Contains(errOut, "xDS CA file") {
		t.Errorf("a missing CA file: exit %d, %q", code, errOut)
	}
}

func (p *inProcess) get(t *testing.T, path string) string {
	t.Helper()
	resp, err := http.Get("http://" + p.httpAddr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func (p *inProcess) rls(t *testing.T) rlsv3.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
	}
}

func limitOf(t *testing.T, rls rlsv3.RateLimitServiceClient, domain, key, value string) uint32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit()
}

// TestServeFromXDS: without force start, serve opens no port before the
// first snapshot; then it decides by the served rules, shows the source
// and version on /rlconfig and /metrics, follows a new snapshot, and keeps
// the last good rules when one is rejected.
func TestServeFromXDS(t *testing.T) {
	srv := xdstest.Start(t, nil)
	p := startServe(t, false, "-config", "/nonexistent", "-xds-server", srv.Addr, "-xds-node-id", "rl-test",
		"-xds-backoff-initial", "50ms", "-xds-backoff-max", "200ms")
	if p.serving(t, 500*time.Millisecond) {
		t.Fatal("serving before the first snapshot without -xds-force-start")
	}
	srv.Set(t, "rl-test", "v1", xdstest.Limit("api", "api", "path", "/login", 2, rlsconfv3.RateLimitUnit_MINUTE))
	p.waitServing(t, 30*time.Second)
	rls := p.rls(t)
	if n := limitOf(t, rls, "api", "path", "/login"); n != 2 {
		t.Fatalf("limit %d, want 2", n)
	}
	srv.WaitRequest(t, 10*time.Second, "ACK of v1", xdstest.ACK("v1"))
	if rc := p.get(t, "/rlconfig"); !strings.HasPrefix(rc, `# source xds `+srv.Addr+` version "v1" connected true`) ||
		!strings.Contains(rc, "api.path_/login: unit=MINUTE requests_per_unit=2") || !strings.Contains(rc, "from xds:api") {
		t.Fatalf("/rlconfig:\n%s", rc)
	}
	if m := p.get(t, "/metrics"); !strings.Contains(m, `ratelimitd_config_source_info{source="xds",version="v1"} 1`) ||
		!strings.Contains(m, "ratelimitd_xds_connected 1") || !strings.Contains(m, "ratelimitd_config_reloads_total 1") {
		t.Fatalf("/metrics lacks the xDS series:\n%s", m)
	}

	srv.Set(t, "rl-test", "v2", xdstest.Limit("api", "api", "path", "/login", 4, rlsconfv3.RateLimitUnit_MINUTE))
	waitFor(t, "v2 in force", func() bool { return limitOf(t, rls, "api", "path", "/login") == 4 })

	srv.Set(t, "rl-test", "v3", xdstest.Limit("api", "api", "path", "/login", 6, rlsconfv3.RateLimitUnit_UNKNOWN))
	srv.WaitRequest(t, 10*time.Second, "NACK of v3", xdstest.NACK("v2", "unit"))
	if n := limitOf(t, rls, "api", "path", "/login"); n != 4 {
		t.Fatalf("limit %d after a rejected snapshot, want v2's 4", n)
	}
	if rc := p.get(t, "/rlconfig"); !strings.HasPrefix(rc, `# source xds `+srv.Addr+` version "v2"`) || !strings.Contains(rc, "rejected (NACK)") ||
		!strings.Contains(rc, "xds:api:") {
		t.Fatalf("/rlconfig after a NACK:\n%s", rc)
	}
	if m := p.get(t, "/metrics"); !strings.Contains(m, `ratelimitd_config_source_info{source="xds",version="v2"} 1`) ||
		strings.Contains(m, "ratelimitd_config_reload_rejections_total 0") {
		t.Fatalf("/metrics after a NACK:\n%s", m)
	}
}

// TestServeXDSForceStart: with -xds-force-start, serve starts with no
// rules while the control plane has nothing, then takes its first
// snapshot.
func TestServeXDSForceStart(t *testing.T) {
	srv := xdstest.Start(t, nil)
	p := startServe(t, true, "-xds-server", srv.Addr, "-xds-force-start")
	rls := p.rls(t)
	if n := limitOf(t, rls, "api", "path", "/login"); n != 0 {
		t.Fatalf("a limit of %d before any snapshot", n)
	}
	if rc := p.get(t, "/rlconfig"); !strings.HasPrefix(rc, `# source xds `+srv.Addr+` version ""`) {
		t.Fatalf("/rlconfig before any snapshot:\n%s", rc)
	}
	srv.Set(t, "default", "1", xdstest.Limit("api", "api", "path", "/login", 3, rlsconfv3.RateLimitUnit_SECOND))
	waitFor(t, "the first snapshot in force", func() bool { return limitOf(t, rls, "api", "path", "/login") == 3 })
}

// TestServeXDSReadyWithRules: with -xds-force-start and
// -xds-ready-with-rules, calls are answered at once but the health checks
// report not serving until the first snapshot is in force.
func TestServeXDSReadyWithRules(t *testing.T) {
	srv := xdstest.Start(t, nil)
	p := startServe(t, true, "-xds-server", srv.Addr, "-xds-force-start", "-xds-ready-with-rules")
	health := func() int {
		resp, err := http.Get("http://" + p.httpAddr + "/healthcheck")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := health(); code != http.StatusServiceUnavailable {
		t.Fatalf("/healthcheck before any snapshot: %d, want 503", code)
	}
	rls := p.rls(t)
	if n := limitOf(t, rls, "api", "path", "/login"); n != 0 {
		t.Fatalf("a limit of %d before any snapshot", n)
	}
	srv.Set(t, "default", "1", xdstest.Limit("api", "api", "path", "/login", 3, rlsconfv3.RateLimitUnit_SECOND))
	waitFor(t, "the first snapshot in force", func() bool { return limitOf(t, rls, "api", "path", "/login") == 3 })
	waitFor(t, "health serving", func() bool { return health() == http.StatusOK })
}

// TestServeWaitingForXDSStops: a signal while waiting for the first
// snapshot stops serve cleanly.
func TestServeWaitingForXDSStops(t *testing.T) {
	srv := xdstest.Start(t, nil)
	p := startServe(t, false, "-xds-server", srv.Addr)
	srv.WaitRequest(t, 10*time.Second, "the subscription", func(r *discoveryv3.DiscoveryRequest) bool { return r.GetTypeUrl() != "" })
	p.cancel()
	select {
	case code := <-p.exit:
		p.exit <- code // for the cleanup
		if code != exitOK {
			t.Fatalf("exit %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop while waiting for xDS")
	}
}

// TestRLConfigNamesTheFiles: from files, /rlconfig says so.
func TestRLConfigNamesTheFiles(t *testing.T) {
	p := startServe(t, true, "-config", "../../examples/auth.yaml")
	if rc := p.get(t, "/rlconfig"); !strings.HasPrefix(rc, "# source file ../../examples/auth.yaml\n# rules ") {
		t.Fatalf("/rlconfig:\n%s", rc)
	}
	if m := p.get(t, "/metrics"); !strings.Contains(m, `ratelimitd_config_source_info{source="file",version=""} 1`) {
		t.Fatal("/metrics lacks ratelimitd_config_source_info for files")
	}
}

// TestServeXDSCountsReferenceStats: from xDS, every rule set taken counts
// in the reference's config_load_success, and every one rejected in
// config_load_error, as the reference's SetConfig counts its xDS updates
// (src/service/ratelimit.go at f2fb157). Served without counting them, the
// statistics showed one load for ever.
func TestServeXDSCountsReferenceStats(t *testing.T) {
	srv := xdstest.Start(t, nil)
	srv.Set(t, "rl-test", "v1", xdstest.Limit("api", "api", "path", "/login", 2, rlsconfv3.RateLimitUnit_MINUTE))
	p := startServe(t, true, "-config", "/nonexistent", "-xds-server", srv.Addr, "-xds-node-id", "rl-test",
		"-xds-backoff-initial", "50ms", "-xds-backoff-max", "200ms",
		"-reference-metrics-addr", "127.0.0.1:0", "-statsd-flush-interval", "50ms")
	ref := "http://" + p.addr(t, "serving reference metrics") + "/metrics"
	refStat := func(name string) string {
		resp, err := http.Get(ref)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, name+" "); ok {
				return v
			}
		}
		return ""
	}
	srv.Set(t, "rl-test", "v2", xdstest.Limit("api", "api", "path", "/login", 4, rlsconfv3.RateLimitUnit_MINUTE))
	waitFor(t, "v2 counted", func() bool { return refStat("ratelimit_service_config_load_success") == "2" })
	srv.Set(t, "rl-test", "v3", xdstest.Limit("api", "api", "path", "/login", 6, rlsconfv3.RateLimitUnit_UNKNOWN))
	srv.WaitRequest(t, 10*time.Second, "NACK of v3", xdstest.NACK("v2", "unit"))
	waitFor(t, "v3's rejection counted", func() bool { return refStat("ratelimit_service_config_load_error") >= "1" })
	if n := refStat("ratelimit_service_config_load_success"); n != "2" {
		t.Fatalf("config_load_success %s after a rejection, want 2 (v1 and v2)", n)
	}
}
