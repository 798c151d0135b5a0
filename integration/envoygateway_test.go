package integration

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/xdstest"
)

// statsdMapping is a statsd_exporter mapping of the shape Envoy Gateway
// mounts for PROMETHEUS_MAPPER_YAML: one series per statistic, labelled
// by domain and first descriptor key.
const statsdMapping = `mappings:
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: "ratelimit_service_rate_limit_total_hits"
    timer_type: "histogram"
    labels: {domain: "$1", key1: "$2"}
  - match: "ratelimit.service.rate_limit.*.*.over_limit"
    name: "ratelimit_service_rate_limit_over_limit"
    timer_type: "histogram"
    labels: {domain: "$1", key1: "$2"}
  - match: "ratelimit.service.rate_limit.*.*.within_limit"
    name: "ratelimit_service_rate_limit_within_limit"
    timer_type: "histogram"
    labels: {domain: "$1", key1: "$2"}
`

// TestEnvoyGateway runs the binary as Envoy Gateway runs the reference's
// container: /bin/ratelimit, no flag, and exactly the environment Envoy
// Gateway gives it (its file paths, ports and addresses adapted to the
// test), against a control plane in this process that requires mutual
// TLS and a real Redis. Decisions over TLS follow the served rules; a new
// snapshot takes effect within seconds; an invalid one is NACKed and the
// old rules stay; /healthcheck answers; the Prometheus address shows the
// reference's series; the counts are in the reference's Redis keys.
func TestEnvoyGateway(t *testing.T) {
	t.Parallel()
	certs := redistest.WriteCerts(t)
	cp := xdstest.Start(t, certs.MutualServer())
	redis := redistest.Start(t)
	dir := t.TempDir()
	mapping := filepath.Join(dir, "conf.yaml")
	if err := os.WriteFile(mapping, []byte(statsdMapping), 0o644); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(asReference(t))
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		// Envoy Gateway's environment for the ratelimit container.
		"REDIS_SOCKET_TYPE=tcp",
		"REDIS_URL=" + redis.Addr,
		"RUNTIME_ROOT=" + filepath.Join(dir, "data"), // /data
		"RUNTIME_SUBDIRECTORY=ratelimit",
		"RUNTIME_IGNOREDOTFILES=true",
		"RUNTIME_WATCH_ROOT=false",
		"LOG_LEVEL=info",
		"USE_STATSD=false",
		"CONFIG_TYPE=GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL=" + cp.Addr, // envoy-gateway:18001
		"CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit",
		"GRPC_SERVER_USE_TLS=true",
		"GRPC_SERVER_TLS_CERT=" + certs.Cert,  // /certs/tls.crt
		"GRPC_SERVER_TLS_KEY=" + certs.Key,    // /certs/tls.key
		"GRPC_SERVER_TLS_CA_CERT=" + certs.CA, // /certs/ca.crt
		"CONFIG_GRPC_XDS_SERVER_USE_TLS=true",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT=" + certs.Cert,
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY=" + certs.Key,
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT=" + certs.CA,
		"FORCE_START_WITHOUT_INITIAL_CONFIG=true",
		"USE_PROMETHEUS=true",
		"PROMETHEUS_ADDR=127.0.0.1:0", // :19001
		"PROMETHEUS_MAPPER_YAML=" + mapping,
		// The reference's ports (8080, 8081, 6070), on free loopback ones.
		"HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0",
	}
	s := startProcess(t, cmd)

	// Decisions over TLS, the gateway's client certificate presented.
	conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(certs.MutualClient())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	rls := rlsv3.NewRateLimitServiceClient(conn)
	decide := func(value string) *rlsv3.RateLimitResponse {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "gateway", Descriptors: []*rlv3.RateLimitDescriptor{
			{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "client", Value: value}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	limitOf := func(value string) uint32 { return decide(value).Statuses[0].GetCurrentLimit().GetRequestsPerUnit() }

	// Started before any rules (FORCE_START_WITHOUT_INITIAL_CONFIG).
	if resp := decide("probe"); resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].GetCurrentLimit() != nil {
		t.Fatalf("before any snapshot: %v", resp)
	}
	if code := httpStatus(t, "http://"+s.httpAddr+"/healthcheck"); code != 200 {
		t.Fatalf("/healthcheck before any snapshot: %d", code)
	}

	rule := func(n uint32) *rlsconfv3.RateLimitConfig {
		return xdstest.Limit("gateway", "gateway", "client", "", n, rlsconfv3.RateLimitUnit_HOUR)
	}
	cp.Set(t, "envoy-ratelimit", "v1", rule(2))
	cp.WaitRequest(t, 20*time.Second, "ACK of v1", xdstest.ACK("v1"))
	eventually(t, "v1 in force", func() bool { return limitOf("probe") == 2 })
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := decide("alice").OverallCode; got != want {
			t.Fatalf("call %d under v1 (2 per hour): %v, want %v", i+1, got, want)
		}
	}

	// A new snapshot, in force within seconds.
	sent := time.Now()
	cp.Set(t, "envoy-ratelimit", "v2", rule(5))
	eventually(t, "v2 in force", func() bool { return limitOf("probe") == 5 })
	if took := time.Since(sent); took > 5*time.Second {
		t.Errorf("v2 took %v to take effect", took)
	}

	// An invalid snapshot is NACKed with the reason; v2 stays.
	bad := rule(7)
	bad.Descriptors[0].RateLimit.Unit = 99
	cp.Set(t, "envoy-ratelimit", "v3", bad)
	cp.WaitRequest(t, 20*time.Second, "NACK of v3", xdstest.NACK("v2", `unknown unit "99"`))
	if n := limitOf("bob"); n != 5 {
		t.Fatalf("limit %d after the NACK, want v2's 5", n)
	}
	if code := httpStatus(t, "http://"+s.httpAddr+"/healthcheck"); code != 200 {
		t.Fatalf("/healthcheck: %d", code)
	}

	// The reference's series on PROMETHEUS_ADDR, as the mapping names
	// them, once the statistics are flushed (every 10s by default).
	promURL := "http://" + s.addr(t, "serving reference metrics") + "/metrics"
	want := []string{
		`ratelimit_service_rate_limit_over_limit{domain="gateway",key1="client"} 1`,
		`ratelimit_service_rate_limit_within_limit{domain="gateway",key1="client"}`,
		`ratelimit_service_rate_limit_total_hits{domain="gateway",key1="client"}`,
	}
	var page string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		page = httpGet(t, promURL)
		missing := false
		for _, w := range want {
			missing = missing || !strings.Contains(page, w)
		}
		if !missing {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s lacks the reference's series %q within 30s:\n%s", promURL, want, page)
		}
	}

	// The counts are in the reference's keys (domain_key_value_window), so
	// reference pods on the same Redis share them; every hit is counted,
	// the refused third one too, as the reference counts them (rules over
	// xDS cannot say over_limit_hits: compatibility mode's count applies).
	admin := goredis.NewClient(&goredis.Options{Addr: redis.Addr})
	defer admin.Close()
	keys, err := admin.Keys(context.Background(), "gateway_client_alice_*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("reference keys of (client, alice): %q, %v", keys, err)
	}
	if n, err := admin.Get(context.Background(), keys[0]).Int(); err != nil || n != 3 {
		t.Fatalf("%s = %d, %v; want the 3 hits, the refused one included", keys[0], n, err)
	}
	logs := strings.Join(s.logLines(), "\n")
	for _, w := range []string{"compatibility mode", "GRPC_SERVER_TLS_CA_CERT", "collision"} {
		if !strings.Contains(logs, w) {
			t.Errorf("the logs do not say %q:\n%s", w, logs)
		}
	}
}

// httpStatus returns the status code of a GET of url.
func httpStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
