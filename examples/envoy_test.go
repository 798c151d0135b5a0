package examples

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

var envoyBootstrapPath = filepath.Join("envoy", "envoy.yaml")

// envoyBootstrap is examples/envoy/envoy.yaml, parsed and validated.
func envoyBootstrap(t *testing.T) *bootstrapv3.Bootstrap {
	t.Helper()
	docs := yamlDocs(t, envoyBootstrapPath)
	if len(docs) != 1 {
		t.Fatalf("%s holds %d documents; Envoy reads one", envoyBootstrapPath, len(docs))
	}
	var v any
	if err := docs[0].Decode(&v); err != nil {
		t.Fatal(err)
	}
	b := &bootstrapv3.Bootstrap{}
	protoFromYAML(t, envoyBootstrapPath, v, b)
	validateDeep(t, envoyBootstrapPath, b)
	return b
}

// envoyGateway is the HTTP side of the example bootstrap: its route table
// and its ratelimit filter.
type envoyGateway struct {
	hcm    *hcmv3.HttpConnectionManager
	filter rateLimitFilter
}

func exampleGateway(t *testing.T, b *bootstrapv3.Bootstrap) envoyGateway {
	t.Helper()
	listeners := b.GetStaticResources().GetListeners()
	if len(listeners) != 1 {
		t.Fatalf("%s has %d listeners; the test expects one", envoyBootstrapPath, len(listeners))
	}
	l := listeners[0]
	if sa := l.GetAddress().GetSocketAddress(); sa.GetAddress() != "0.0.0.0" || sa.GetPortValue() != 10000 {
		t.Errorf("listener %s listens on %s:%d; the README says 0.0.0.0:10000", l.GetName(), sa.GetAddress(), sa.GetPortValue())
	}
	var g envoyGateway
	for _, fc := range l.GetFilterChains() {
		for _, f := range fc.GetFilters() {
			if f.GetTypedConfig() != nil && strings.HasSuffix(f.GetTypedConfig().GetTypeUrl(), "HttpConnectionManager") {
				g.hcm = unpack[*hcmv3.HttpConnectionManager](t, "listener "+l.GetName()+" filter "+f.GetName(), f.GetTypedConfig())
			}
		}
	}
	if g.hcm == nil {
		t.Fatalf("listener %s has no HTTP connection manager", l.GetName())
	}
	if g.hcm.GetRouteConfig() == nil {
		t.Fatalf("the HTTP connection manager has no inline route_config; the test reads the routes from it")
	}
	filters := g.hcm.GetHttpFilters()
	for i, f := range filters {
		if !strings.HasSuffix(f.GetTypedConfig().GetTypeUrl(), "filters.http.ratelimit.v3.RateLimit") {
			continue
		}
		if g.filter.Config != nil {
			t.Fatalf("two ratelimit filters; the test models one")
		}
		g.filter = rateLimitFilter{Name: f.GetName(), Config: unpack[*ratelimitv3.RateLimit](t, "http filter "+f.GetName(), f.GetTypedConfig())}
		if i == len(filters)-1 || !strings.HasSuffix(filters[len(filters)-1].GetTypedConfig().GetTypeUrl(), "router.v3.Router") {
			t.Errorf("the ratelimit filter must come before the router, which must be the last filter")
		}
	}
	if g.filter.Config == nil {
		t.Fatalf("no envoy.filters.http.ratelimit filter in the HTTP connection manager")
	}
	return g
}

// TestEnvoyBootstrap parses examples/envoy/envoy.yaml into go-control-plane's
// Bootstrap, strictly (unknown fields and unresolvable "@type"s fail), runs
// the protos' validation rules, and checks how it reaches ratelimitd.
func TestEnvoyBootstrap(t *testing.T) {
	b := envoyBootstrap(t)
	g := exampleGateway(t, b)
	rl := g.filter.Config

	if g.filter.Name != "envoy.filters.http.ratelimit" {
		t.Errorf("the ratelimit filter is named %q; per-route configs are keyed by envoy.filters.http.ratelimit", g.filter.Name)
	}
	if rl.GetDomain() != "api" {
		t.Errorf("filter domain %q; want api", rl.GetDomain())
	}
	if rl.GetFailureModeDeny() {
		t.Errorf("failure_mode_deny is true; the example fails open")
	}
	if rl.GetEnableXRatelimitHeaders() != ratelimitv3.RateLimit_DRAFT_VERSION_03 {
		t.Errorf("enable_x_ratelimit_headers is %v; want DRAFT_VERSION_03", rl.GetEnableXRatelimitHeaders())
	}
	if d := rl.GetTimeout().AsDuration(); d < 20*time.Millisecond || d > time.Second {
		t.Errorf("the filter's timeout is %v; want 20ms to 1s (ratelimitd's own backend deadline is 50ms)", d)
	}
	svc := rl.GetRateLimitService()
	if svc.GetTransportApiVersion() != corev3.ApiVersion_V3 {
		t.Errorf("rate_limit_service transport_api_version %v; want V3", svc.GetTransportApiVersion())
	}
	clusterName := svc.GetGrpcService().GetEnvoyGrpc().GetClusterName()
	var rlCluster *clusterv3.Cluster
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() == clusterName {
			rlCluster = c
		}
	}
	if rlCluster == nil {
		t.Fatalf("rate_limit_service names cluster %q, which is not defined", clusterName)
	}
	opts, ok := rlCluster.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	if !ok {
		t.Fatalf("cluster %s has no HttpProtocolOptions; gRPC needs HTTP/2", clusterName)
	}
	hpo := unpack[*upstreamhttpv3.HttpProtocolOptions](t, "cluster "+clusterName+" HttpProtocolOptions", opts)
	if hpo.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Errorf("cluster %s does not speak HTTP/2 explicitly; gRPC needs it", clusterName)
	}
	if port := clusterPort(rlCluster); port != 8081 {
		t.Errorf("cluster %s points at port %d; ratelimitd serves gRPC on 8081", clusterName, port)
	}
	for _, hc := range rlCluster.GetHealthChecks() {
		if s := hc.GetGrpcHealthCheck().GetServiceName(); s != "" && s != "envoy.service.ratelimit.v3.RateLimitService" {
			t.Errorf("cluster %s health-checks gRPC service %q; ratelimitd reports \"\" and envoy.service.ratelimit.v3.RateLimitService", clusterName, s)
		}
	}

	// Every route's clusters exist.
	clusters := map[string]bool{}
	for _, c := range b.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = true
	}
	for _, vh := range g.hcm.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			if c := r.GetRoute().GetCluster(); !clusters[c] {
				t.Errorf("route %s sends to cluster %q, which is not defined", r.GetName(), c)
			}
		}
	}
}

// clusterPort is the port of a cluster's only endpoint, or 0.
func clusterPort(c *clusterv3.Cluster) uint32 {
	for _, le := range c.GetLoadAssignment().GetEndpoints() {
		for _, e := range le.GetLbEndpoints() {
			return e.GetEndpoint().GetAddress().GetSocketAddress().GetPortValue()
		}
	}
	return 0
}

// TestEnvoyDescriptorsMatchExampleRules sends example requests through the
// bootstrap's routes and rate_limits actions, computes the domain and
// descriptors Envoy would send ratelimitd, and checks each against the
// example rules: it must match a rule, and the one this table expects. Every
// rate limit of the bootstrap must produce a descriptor for some request.
func TestEnvoyDescriptorsMatchExampleRules(t *testing.T) {
	rules := loadExampleRules(t)
	g := exampleGateway(t, envoyBootstrap(t))
	vhosts := g.hcm.GetRouteConfig().GetVirtualHosts()

	const client = "203.0.113.7"
	h := func(kv ...string) map[string]string {
		m := map[string]string{"host": "localhost:10000"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	tests := []requestCase{
		{"login with basic auth", httpRequest{"POST", "/login", h("authorization", "Basic YWxpY2U6c2VjcmV0"), client},
			"auth", []string{"(auth_type=basic) basic_auth_logins"}},
		{"login, scheme in another case", httpRequest{"POST", "/login/form?next=/", h("authorization", "BASIC YWxpY2U6c2VjcmV0"), client},
			"auth", []string{"(auth_type=basic) basic_auth_logins"}},
		{"login with a bearer token", httpRequest{"POST", "/login", h("authorization", "Bearer abc"), client}, "", nil},
		{"login without credentials", httpRequest{"GET", "/login", h(), client}, "", nil},
		{"signup", httpRequest{"POST", "/signup", h(), client},
			"accounts", []string{"(remote_address=203.0.113.7) signups_per_ip"}},
		{"signup page", httpRequest{"GET", "/signup", h("x-user-id", "alice"), client},
			"api", []string{"(user_id=alice) requests_per_user_per_second"}},
		{"publish a post", httpRequest{"POST", "/posts", h("x-user-id", "alice"), client},
			"posts", []string{"(user_id=alice) posts_per_user"}},
		{"read posts", httpRequest{"GET", "/posts/42", h("x-user-id", "alice"), client},
			"api", []string{"(user_id=alice) requests_per_user_per_second"}},
		{"marketing message", httpRequest{"POST", "/messages", h("x-message-type", "marketing", "x-to-number", "2061111111"), client},
			"messaging", []string{
				"(message_type=marketing)(to_number=2061111111) marketing_per_number",
				"(to_number=2061111111) messages_per_number",
			}},
		{"other message", httpRequest{"POST", "/messages", h("x-message-type", "receipt", "x-to-number", "2061111111"), client},
			"messaging", []string{"(to_number=2061111111) messages_per_number"}},
		{"message without a number", httpRequest{"POST", "/messages", h("x-message-type", "marketing"), client}, "", nil},
		{"claim a reward", httpRequest{"POST", "/rewards/claim", h("x-device-id", "d-1"), client},
			"rewards", []string{"(device_id=d-1) rewards_per_device"}},
		{"search", httpRequest{"GET", "/search?q=envoy", h("x-user-id", "alice"), client},
			"algorithms", []string{"(search_user=alice) searches_per_user"}},
		{"anything else", httpRequest{"GET", "/anything", h("x-user-id", "alice"), client},
			"api", []string{"(user_id=alice) requests_per_user_per_second"}},
		{"anonymous", httpRequest{"GET", "/", h(), client}, "", nil},
	}
	produced := checkRequests(t, g.filter, vhosts, rules, tests)

	// Each rate limit of the bootstrap is exercised above: a new route
	// needs a request in the table.
	for _, vh := range vhosts {
		for _, r := range vh.GetRoutes() {
			for i := range r.GetRoute().GetRateLimits() {
				if s := r.GetName() + "#" + strconv.Itoa(i); !produced[s] {
					t.Errorf("rate limit %s produced no descriptor for any request of the table; add a request for it", s)
				}
			}
			if r.GetName() == "" {
				t.Errorf("a route has no name; name every route (the test reports by name)")
			}
		}
		for i := range vh.GetRateLimits() {
			if s := "vhost:" + vh.GetName() + "#" + strconv.Itoa(i); !produced[s] {
				t.Errorf("rate limit %s produced no descriptor for any request of the table; add a request for it", s)
			}
		}
	}
}
