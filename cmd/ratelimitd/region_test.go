package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

func TestRegionUsageErrors(t *testing.T) {
	for _, c := range []struct {
		env  env
		args []string
		want string
	}{
		{nil, []string{"-region-peers", "us=us.example:8081"}, `-region-peers needs -region: name this region first`},
		{env{"RATELIMITD_REGION_PEERS": "us=us.example:8081"}, nil, `RATELIMITD_REGION_PEERS needs -region`},
		{nil, []string{"-region", "eu west"}, `invalid -region: region name "eu west": want 1 to 63 letters, digits, '.', '_' or '-'`},
		{env{"RATELIMITD_REGION": "-eu"}, nil, `invalid RATELIMITD_REGION: region name "-eu"`},
		{nil, []string{"-region", "eu", "-region-peers", "us"}, `invalid -region-peers "us": "us" is not name=host:port`},
		{nil, []string{"-region", "eu", "-region-peers", "us=a:1,us=b:1"}, `invalid -region-peers: region "us" is given twice`},
		{nil, []string{"-region", "eu", "-region-peers", "eu=a:1"}, `invalid -region-peers: "eu" is this region (-region); list the other regions`},
		{nil, []string{"-region", "eu", "-region-sync-interval", "1ms"}, `invalid -region-sync-interval 1ms; want 10ms to 1m`},
		{env{"RATELIMITD_REGION_WEIGHT": "0"}, []string{"-region", "eu"}, `invalid RATELIMITD_REGION_WEIGHT 0; want a positive number`},
	} {
		code, _, errOut := runMain(t, c.env, c.args...)
		if code != exitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("%v %v: exit %d, stderr %q; want exit 2 and %q", c.env, c.args, code, errOut, c.want)
		}
	}
}

// relay is a link on a free loopback port (toxiproxy, in this process)
// whose upstream is set later: a region's peers are named at its start,
// before they listen.
type relay struct{ p *toxiproxy.Proxy }

func newRelay(t *testing.T, tp *toxiproxy.ApiServer, name string) *relay {
	t.Helper()
	p := toxiproxy.NewProxy(tp, name, "127.0.0.1:0", "127.0.0.1:1")
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return &relay{p}
}

func (r *relay) addr() string { return r.p.Listen }

func (r *relay) to(t *testing.T, upstream string) {
	t.Helper()
	if err := r.p.Update(&toxiproxy.Proxy{Listen: r.p.Listen, Upstream: upstream, Enabled: true}); err != nil {
		t.Fatal(err)
	}
}

// TestRegionsOverMutualTLS runs two regions, eu and us, in this process on
// the memory backend, with gRPC over mutual TLS: they dial each other with
// the listener's certificate and verify each other against its client
// CAs. A global limit admitted in eu is counted by us; the explanation and
// the metrics show it. A third server that calls itself us but holds a
// certificate of another CA is refused by eu's listener: what it admits
// never reaches eu.
func TestRegionsOverMutualTLS(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "global.yaml")
	if err := os.WriteFile(rules, []byte("domain: global\ndescriptors:\n  - key: tenant\n    rate_limit: {requests_per_unit: 100, unit: hour, scope: global}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	certs := redistest.WriteCerts(t)
	tp := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	toEU, toUS := newRelay(t, tp, "to-eu"), newRelay(t, tp, "to-us")
	start := func(name, peers string, c redistest.CertFiles) *inProcess {
		return startServe(t, true, "-config", rules, "-watch-config=false",
			"-grpc-tls-cert", c.Cert, "-grpc-tls-key", c.Key, "-grpc-tls-client-ca", c.CA,
			"-region", name, "-region-peers", peers, "-region-sync-interval", "50ms")
	}
	eu := start("eu", "us="+toUS.addr(), certs)
	us := start("us", "eu="+toEU.addr(), certs)
	toEU.to(t, eu.grpcAddr)
	toUS.to(t, us.grpcAddr)

	admit := func(p *inProcess, c redistest.CertFiles, n int) int {
		t.Helper()
		cfg := c.MutualClient()
		conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		cl := rlsv3.NewRateLimitServiceClient(conn)
		req := &rlsv3.RateLimitRequest{Domain: "global", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}}}}}
		ok := 0
		for range n {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := cl.ShouldRateLimit(ctx, req)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			if resp.OverallCode == rlsv3.RateLimitResponse_OK {
				ok++
			}
		}
		return ok
	}
	// known returns what p knows of each region's count of tenant=acme.
	known := func(p *inProcess) map[string]uint64 {
		t.Helper()
		resp, err := http.Post("http://"+p.httpAddr+"/explain", "application/json",
			strings.NewReader(`{"domain": "global", "descriptors": [{"entries": [{"key": "tenant", "value": "acme"}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var x service.ExplainResponse
		if err := json.NewDecoder(resp.Body).Decode(&x); err != nil || len(x.Descriptors) != 1 || len(x.Descriptors[0].Global) != 1 || x.Descriptors[0].Global[0] == nil {
			t.Fatalf("explain: %v %+v", err, x)
		}
		out := map[string]uint64{}
		for _, r := range x.Descriptors[0].Global[0].Regions {
			out[r.Region] = r.Count
		}
		return out
	}
	waitKnown := func(p *inProcess, region string, want uint64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for known(p)[region] != want {
			if time.Now().After(deadline) {
				t.Fatalf("after 10s the server knows %v, want %s %d", known(p), region, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// A peer never heard counts as cut off: each region reserves its
	// share for the other until the first push arrives.
	heard := func(p *inProcess, peer string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(p.get(t, "/metrics"), `ratelimitd_region_peer_cut_off{peer="`+peer+`"} 0`) {
			if time.Now().After(deadline) {
				t.Fatalf("after 10s %s is still cut off", peer)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	heard(eu, "us")
	heard(us, "eu")
	if n := admit(eu, certs, 60); n != 60 {
		t.Fatalf("eu admitted %d of 60 under a global limit of 100", n)
	}
	waitKnown(us, "eu", 60)
	if n := admit(us, certs, 60); n != 40 {
		t.Fatalf("us admitted %d, want the 40 eu left", n)
	}
	waitKnown(eu, "us", 40)
	m := us.get(t, "/metrics")
	for _, want := range []string{`ratelimitd_region_known_count{region="eu"} 60`, `ratelimitd_region_known_count{region="us"} 40`, `ratelimitd_region_peer_cut_off{peer="eu"} 0`, `ratelimitd_region_peer_push_seconds{peer="eu"}`} {
		if !strings.Contains(m, want) {
			t.Errorf("us's metrics lack %s", want)
		}
	}

	// An impostor: region us by name, with a certificate of another CA.
	other := redistest.WriteCerts(t)
	toEU2 := newRelay(t, tp, "impostor-to-eu")
	toEU2.to(t, eu.grpcAddr)
	impostor := start("us", "eu="+toEU2.addr(), other)
	if n := admit(impostor, other, 30); n != 30 {
		t.Fatalf("the impostor admitted %d of 30 (it knows no count of eu's)", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(impostor.get(t, "/metrics"), `ratelimitd_region_pushes_total{result="failed"}`) || strings.Contains(impostor.get(t, "/metrics"), `ratelimitd_region_pushes_total{result="failed"} 0`) {
		if time.Now().After(deadline) {
			t.Fatal("the impostor's pushes to eu did not fail within 10s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if k := known(eu); k["us"] != 40 {
		t.Fatalf("eu knows %v: the impostor's count reached it", k)
	}
}
