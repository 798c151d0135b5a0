package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/xdstest"
)

// TestRulesOverXDS runs the real binary against a control plane in this
// process that requires mutual TLS: decisions follow the rules it serves,
// /rlconfig and /metrics show the xDS version, a new snapshot takes
// effect, and a control plane restart is survived.
func TestRulesOverXDS(t *testing.T) {
	t.Parallel()
	certs := redistest.WriteCerts(t)
	cp := xdstest.Start(t, certs.MutualServer())
	login := func(n uint32) *rlsconfv3.RateLimitConfig {
		return xdstest.Limit("login", "auth", "auth_type", "basic", n, rlsconfv3.RateLimitUnit_HOUR)
	}
	cp.Set(t, "it-node", "v1", login(3))

	// startServer passes -config ../examples too: with -xds-server the
	// files are not read.
	s := startServer(t, "-xds-server", cp.Addr, "-xds-node-id", "it-node", "-xds-node-metadata", "zone=a",
		"-xds-tls-ca", certs.CA, "-xds-tls-cert", certs.Cert, "-xds-tls-key", certs.Key,
		"-xds-backoff-initial", "50ms", "-xds-backoff-max", "200ms")
	cp.WaitRequest(t, 10*time.Second, "ACK of v1", xdstest.ACK("v1"))
	if md := cp.Node().GetMetadata().GetFields()["zone"].GetStringValue(); md != "a" {
		t.Fatalf("node metadata zone=%q", md)
	}

	rls := rlsv3.NewRateLimitServiceClient(s.dial(t))
	decide := func() *rlsv3.RateLimitResponse {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "auth", Descriptors: []*rlv3.RateLimitDescriptor{
			{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "auth_type", Value: "basic"}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// 3 per hour: the fourth is refused (an hour boundary between the
	// calls is too unlikely to guard against).
	for i := 1; i <= 4; i++ {
		resp := decide()
		want := rlsv3.RateLimitResponse_OK
		if i == 4 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if resp.OverallCode != want || resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() != 3 {
			t.Fatalf("call %d: %v", i, resp)
		}
	}
	rc := httpGet(t, "http://"+s.httpAddr+"/rlconfig")
	if !strings.HasPrefix(rc, `# source xds `+cp.Addr+` version "v1" connected true`) ||
		!strings.Contains(rc, "auth.auth_type_basic: unit=HOUR requests_per_unit=3") {
		t.Fatalf("/rlconfig:\n%s", rc)
	}
	if m := httpGet(t, "http://"+s.httpAddr+"/metrics"); !strings.Contains(m, `ratelimitd_config_source_info{source="xds",version="v1"} 1`) {
		t.Fatal("/metrics lacks ratelimitd_config_source_info for v1")
	}
	// The example rules of -config are not in force.
	if strings.Contains(rc, "../examples") {
		t.Fatalf("/rlconfig shows the files of -config:\n%s", rc)
	}

	// A new snapshot: a higher limit, in force without a restart.
	cp.Set(t, "it-node", "v2", login(10))
	eventually(t, "v2 in force", func() bool { return decide().Statuses[0].GetCurrentLimit().GetRequestsPerUnit() == 10 })

	// The control plane restarts with v3; the server reconnects.
	cp.Stop()
	cp.Set(t, "it-node", "v3", login(20))
	time.Sleep(300 * time.Millisecond) // a few failed attempts
	cp.Restart(t)
	eventually(t, "v3 in force after the restart", func() bool {
		return strings.HasPrefix(httpGet(t, "http://"+s.httpAddr+"/rlconfig"), `# source xds `+cp.Addr+` version "v3" connected true`)
	})
	if n := decide().Statuses[0].GetCurrentLimit().GetRequestsPerUnit(); n != 20 {
		t.Fatalf("limit %d after the restart, want 20", n)
	}
	if code := s.stop(t); code != 0 {
		t.Fatalf("exit %d", code)
	}
}
