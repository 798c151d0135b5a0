package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/pki"
	"github.com/ratelimitd/ratelimitd/pkg/service"
	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
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
		{nil, []string{"-region-addr", ":0"}, `-region-addr needs -region: name this region first`},
		{nil, []string{"-region", "eu", "-region-peers", "us=a:1"}, `-region-peers needs mutual TLS between the regions, so that a push is accepted only from the region its certificate names: give -region-tls-cert, -region-tls-key and -region-tls-ca`},
		{nil, []string{"-region", "eu", "-region-addr", ":0", "-region-tls-cert", "c.pem"}, `-region-addr is served over mutual TLS only: give -region-tls-cert, -region-tls-key and -region-tls-ca`},
		{nil, []string{"-region", "eu", "-region-peers", "us=a:1", "-region-tls-cert", "c", "-region-tls-key", "k", "-region-tls-ca", "ca"},
			`-region-peers without -grpc-tls-client-ca: the peers push to the gRPC port, whose listener must then ask for client certificates (-grpc-tls-client-ca); or serve region sync on a listener of its own (-region-addr)`},
		{env{"RATELIMITD_REGION_SAN": "urn:region"}, []string{"-region", "eu"}, `invalid RATELIMITD_REGION_SAN "urn:region"; want a name with {region} once`},
	} {
		code, _, errOut := runMain(t, c.env, c.args...)
		if code != exitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("%v %v: exit %d, stderr %q; want exit 2 and %q", c.env, c.args, code, errOut, c.want)
		}
	}
}

// TestRegionCertificateNamesTheRegion: a region whose own certificate
// does not name it stops at start, saying so: the peers would refuse every
// push it makes.
func TestRegionCertificateNamesTheRegion(t *testing.T) {
	ca := pki.NewCA(t, "regions")
	us := ca.Region("us")
	code, _, errOut := runMain(t, nil, "-config", globalRules(t), "-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0",
		"-region", "eu", "-region-peers", "us=127.0.0.1:1", "-region-addr", "127.0.0.1:0",
		"-region-tls-cert", us.File, "-region-tls-key", us.KeyFile, "-region-tls-ca", ca.File)
	want := `region eu: its certificate ` + us.File + ` does not name it (want a URI or DNS SAN urn:ratelimitd:region:eu; it names region us): the peers would refuse its pushes`
	if code != 1 || !strings.Contains(errOut, want) {
		t.Errorf("exit %d, stderr %q; want exit 1 and %q", code, errOut, want)
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
// the listener's certificate, which names their region, and verify each
// other against its client CAs. A global limit admitted in eu is counted
// by us; the explanation and the metrics show it. A third server that
// calls itself us but holds a certificate of another CA is refused by
// eu's listener: what it admits never reaches eu.
func TestRegionsOverMutualTLS(t *testing.T) {
	rules := globalRules(t)
	ca := pki.NewCA(t, "regions")
	tp := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	toEU, toUS := newRelay(t, tp, "to-eu"), newRelay(t, tp, "to-us")
	start := func(name, peers string, ca *pki.CA) *inProcess {
		c := ca.Region(name)
		return startServe(t, true, "-config", rules, "-watch-config=false",
			"-grpc-tls-cert", c.File, "-grpc-tls-key", c.KeyFile, "-grpc-tls-client-ca", ca.File,
			"-region", name, "-region-peers", peers, "-region-sync-interval", "50ms")
	}
	eu := start("eu", "us="+toUS.addr(), ca)
	us := start("us", "eu="+toEU.addr(), ca)
	toEU.to(t, eu.grpcAddr)
	toUS.to(t, us.grpcAddr)

	// Envoy: a client certificate of the same CA, naming no region.
	envoy := ca.Issue(pki.Leaf{CN: "envoy"})
	heard(t, eu, "us")
	heard(t, us, "eu")
	if n := admitGlobal(t, eu.grpcAddr, ca.Client(&envoy), 60); n != 60 {
		t.Fatalf("eu admitted %d of 60 under a global limit of 100", n)
	}
	waitKnown(t, us, "eu", 60)
	if n := admitGlobal(t, us.grpcAddr, ca.Client(&envoy), 60); n != 40 {
		t.Fatalf("us admitted %d, want the 40 eu left", n)
	}
	waitKnown(t, eu, "us", 40)
	m := us.get(t, "/metrics")
	for _, want := range []string{`ratelimitd_region_known_count{region="eu"} 60`, `ratelimitd_region_known_count{region="us"} 40`, `ratelimitd_region_peer_cut_off{peer="eu"} 0`, `ratelimitd_region_peer_push_seconds{peer="eu"}`} {
		if !strings.Contains(m, want) {
			t.Errorf("us's metrics lack %s", want)
		}
	}

	// An impostor: region us by name, with a certificate of another CA.
	other := pki.NewCA(t, "another")
	toEU2 := newRelay(t, tp, "impostor-to-eu")
	toEU2.to(t, eu.grpcAddr)
	impostor := start("us", "eu="+toEU2.addr(), other)
	otherEnvoy := other.Issue(pki.Leaf{CN: "envoy"})
	if n := admitGlobal(t, impostor.grpcAddr, other.Client(&otherEnvoy), 30); n != 30 {
		t.Fatalf("the impostor admitted %d of 30 (it knows no count of eu's)", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(impostor.get(t, "/metrics"), `ratelimitd_region_pushes_total{result="failed"}`) || strings.Contains(impostor.get(t, "/metrics"), `ratelimitd_region_pushes_total{result="failed"} 0`) {
		if time.Now().After(deadline) {
			t.Fatal("the impostor's pushes to eu did not fail within 10s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if k := knownCounts(t, eu); k["us"] != 40 {
		t.Fatalf("eu knows %v: the impostor's count reached it", k)
	}
}

// globalRules writes a rule file of domain global: tenant, 100 an hour,
// scope: global.
func globalRules(t *testing.T) string {
	t.Helper()
	rules := filepath.Join(t.TempDir(), "global.yaml")
	if err := os.WriteFile(rules, []byte("domain: global\ndescriptors:\n  - key: tenant\n    rate_limit: {requests_per_unit: 100, unit: hour, scope: global}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return rules
}

// admitGlobal sends n requests for tenant acme of domain global to the
// gRPC address addr, over TLS with cfg (nil: plaintext), and returns how
// many were admitted.
func admitGlobal(t *testing.T, addr string, cfg *tls.Config, n int) int {
	t.Helper()
	creds := insecure.NewCredentials()
	if cfg != nil {
		creds = credentials.NewTLS(cfg)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
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

// explainAcme returns POST /explain of p for tenant acme of domain global.
func explainAcme(t *testing.T, p *inProcess) service.ExplainDescriptor {
	t.Helper()
	resp, err := http.Post("http://"+p.httpAddr+"/explain", "application/json",
		strings.NewReader(`{"domain": "global", "descriptors": [{"entries": [{"key": "tenant", "value": "acme"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var x service.ExplainResponse
	if err := json.NewDecoder(resp.Body).Decode(&x); err != nil || len(x.Descriptors) != 1 {
		t.Fatalf("explain: %v %+v", err, x)
	}
	return x.Descriptors[0]
}

// knownCounts returns what p knows of each region's count of tenant=acme.
func knownCounts(t *testing.T, p *inProcess) map[string]uint64 {
	t.Helper()
	d := explainAcme(t, p)
	if len(d.Global) != 1 || d.Global[0] == nil {
		t.Fatalf("explain: %+v", d)
	}
	out := map[string]uint64{}
	for _, r := range d.Global[0].Regions {
		out[r.Region] = r.Count
	}
	return out
}

// waitKnown waits up to 10s until p knows want as region's count.
func waitKnown(t *testing.T, p *inProcess, region string, want uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for knownCounts(t, p)[region] != want {
		if time.Now().After(deadline) {
			t.Fatalf("after 10s the server knows %v, want %s %d", knownCounts(t, p), region, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// heard waits up to 10s until p has heard peer: a peer never heard counts
// as cut off, and each region reserves its share for the other until the
// first push arrives.
func heard(t *testing.T, p *inProcess, peer string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.get(t, "/metrics"), `ratelimitd_region_peer_cut_off{peer="`+peer+`"} 0`) {
		if time.Now().After(deadline) {
			t.Fatalf("after 10s %s is still cut off", peer)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRegionPushIdentity serves region eu, whose peers are us and ap, with
// region sync on its gRPC port (mutual TLS) and on a listener of its own
// (-region-addr, the gRPC port then plaintext for Envoy). Pushes claiming
// us with a count of 1,000,000 of tenant acme, which would refuse acme for
// the rest of the hour, are refused: signed with ap's certificate, without
// a certificate, with an Envoy's certificate of the same CA; on the gRPC
// port when region sync has its own listener. us's own push is taken, and
// acme is still admitted.
func TestRegionPushIdentity(t *testing.T) {
	rules := globalRules(t)
	ca := pki.NewCA(t, "regions")
	euCert, usCert, apCert := ca.Region("eu"), ca.Region("us"), ca.Region("ap")
	envoy := ca.Issue(pki.Leaf{CN: "envoy"})
	// Peers nobody answers at: eu's own pushes fail, which is not what is
	// tested; a long interval keeps them few. Never heard, the peers count
	// as cut off: eu's weight of 1000 leaves them a share of 1 each, so
	// that eu admits the limit but for the counts pushed.
	peers := "us=127.0.0.1:1,ap=127.0.0.1:1"
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"gRPC port", []string{"-grpc-tls-cert", euCert.File, "-grpc-tls-key", euCert.KeyFile, "-grpc-tls-client-ca", ca.File}},
		{"-region-addr", []string{"-region-addr", "127.0.0.1:0", "-region-tls-cert", euCert.File, "-region-tls-key", euCert.KeyFile, "-region-tls-ca", ca.File}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eu := startServe(t, true, append([]string{"-config", rules, "-watch-config=false",
				"-region", "eu", "-region-peers", peers, "-region-sync-interval", "1m", "-region-weight", "1000"}, tc.args...)...)
			syncAddr := eu.grpcAddr
			var envoyTLS *tls.Config
			if tc.name == "-region-addr" {
				syncAddr = eu.addr(t, "serving region sync")
			} else {
				envoyTLS = ca.Client(&envoy)
			}
			window := time.Now().Truncate(time.Hour).UnixMilli()
			forged := &ratelimitdv1.PushRequest{Region: "us", Weight: 1, Counts: []*ratelimitdv1.RegionCount{{
				Key: globalKey(t, eu), WindowStartMs: window, WindowMs: time.Hour.Milliseconds(), Count: 1_000_000}}}
			for _, c := range []struct {
				name string
				cert *pki.Cert
				want codes.Code
				msg  string
			}{
				{"ap's certificate", &apCert, codes.PermissionDenied, "names region ap"},
				{"an Envoy's certificate of the same CA", &envoy, codes.PermissionDenied, "names no region"},
				{"no certificate", nil, codes.Unavailable, ""}, // the listener asks for one: no handshake
			} {
				if err := pushTo(syncAddr, ca.Client(c.cert), forged); status.Code(err) != c.want || !strings.Contains(err.Error(), c.msg) {
					t.Errorf("%s: %v, want %v saying %q", c.name, err, c.want, c.msg)
				}
			}
			if tc.name == "-region-addr" {
				if err := pushTo(eu.grpcAddr, nil, forged); status.Code(err) != codes.Unimplemented {
					t.Errorf("a push to the gRPC port, with region sync on its own listener: %v, want Unimplemented", err)
				}
			}
			if k := knownCounts(t, eu); k["us"] != 0 {
				t.Fatalf("eu knows %v after forged pushes", k)
			}
			if m := eu.get(t, "/metrics"); !strings.Contains(m, `ratelimitd_region_received_total{what="refused"} 2`) {
				t.Errorf("eu's metrics do not count the 2 pushes refused by their certificate")
			}
			// us itself, with a count of 3.
			legit := &ratelimitdv1.PushRequest{Region: "us", Weight: 1, Counts: []*ratelimitdv1.RegionCount{{
				Key: forged.Counts[0].Key, WindowStartMs: window, WindowMs: time.Hour.Milliseconds(), Count: 3}}}
			if err := pushTo(syncAddr, ca.Client(&usCert), legit); err != nil {
				t.Fatalf("us's own push: %v", err)
			}
			waitKnown(t, eu, "us", 3)
			if n := admitGlobal(t, eu.grpcAddr, envoyTLS, 5); n != 5 {
				t.Fatalf("eu admitted %d of 5 of tenant acme (100 an hour, us 3)", n)
			}
		})
	}
}

// pushTo sends req to addr's region sync over TLS with cfg (nil:
// plaintext) and returns the error.
func pushTo(addr string, cfg *tls.Config, req *ratelimitdv1.PushRequest) error {
	creds := insecure.NewCredentials()
	if cfg != nil {
		creds = credentials.NewTLS(cfg)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = ratelimitdv1.NewRegionSyncClient(conn).Push(ctx, req)
	return err
}

// globalKey returns the counter key of tenant acme in domain global, as
// POST /explain of p gives it (the same in every region).
func globalKey(t *testing.T, p *inProcess) []byte {
	t.Helper()
	d := explainAcme(t, p)
	if len(d.Keys) != 1 {
		t.Fatalf("explain: %+v", d)
	}
	k := d.Keys[0]
	if strings.HasPrefix(k, `"`) { // Go-quoted: not printable
		var err error
		if k, err = strconv.Unquote(k); err != nil {
			t.Fatal(err)
		}
	}
	return []byte(k)
}
