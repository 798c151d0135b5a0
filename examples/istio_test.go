package examples

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
)

var istioPath = filepath.Join(repoRoot, "deploy", "istio", "envoyfilter.yaml")

type envoyFilter struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name      string `yaml:"name"`
		Namespace string `yaml:"namespace"`
	} `yaml:"metadata"`
	Spec struct {
		WorkloadSelector struct {
			Labels map[string]string `yaml:"labels"`
		} `yaml:"workloadSelector"`
		ConfigPatches []struct {
			ApplyTo string `yaml:"applyTo"`
			Match   struct {
				Context  string `yaml:"context"`
				Listener *struct {
					FilterChain struct {
						Filter struct {
							Name      string `yaml:"name"`
							SubFilter struct {
								Name string `yaml:"name"`
							} `yaml:"subFilter"`
						} `yaml:"filter"`
					} `yaml:"filterChain"`
				} `yaml:"listener"`
				RouteConfiguration *struct {
					Vhost struct {
						Name  *string `yaml:"name"`
						Route struct {
							Name   string `yaml:"name"`
							Action string `yaml:"action"`
						} `yaml:"route"`
					} `yaml:"vhost"`
				} `yaml:"routeConfiguration"`
			} `yaml:"match"`
			Patch struct {
				Operation string         `yaml:"operation"`
				Value     map[string]any `yaml:"value"`
			} `yaml:"patch"`
		} `yaml:"configPatches"`
	} `yaml:"spec"`
}

// TestIstioEnvoyFilter parses each patch of deploy/istio/envoyfilter.yaml
// into the Envoy proto it patches, builds the gateway's routes as Istio
// would patch them, and checks that every descriptor they send matches a
// rule of the Kubernetes ConfigMap (the rules ratelimitd serves there),
// and that the filter calls the Service of deploy/kubernetes.
func TestIstioEnvoyFilter(t *testing.T) {
	docs := yamlDocs(t, istioPath)
	if len(docs) != 1 {
		t.Fatalf("%s holds %d documents; want one EnvoyFilter", istioPath, len(docs))
	}
	var ef envoyFilter
	if err := docs[0].Decode(&ef); err != nil {
		t.Fatal(err)
	}
	if ef.APIVersion != "networking.istio.io/v1alpha3" || ef.Kind != "EnvoyFilter" {
		t.Fatalf("%s is a %s %s; want networking.istio.io/v1alpha3 EnvoyFilter", istioPath, ef.APIVersion, ef.Kind)
	}
	if ef.Metadata.Name == "" || len(ef.Spec.WorkloadSelector.Labels) == 0 {
		t.Errorf("the EnvoyFilter needs a name and a workloadSelector (else it patches every proxy of its namespace)")
	}

	var filter rateLimitFilter
	vhost := &routev3.VirtualHost{Name: "gateway", Domains: []string{"*"}}
	var routes []*routev3.Route
	for i, p := range ef.Spec.ConfigPatches {
		where := fmt.Sprintf("%s configPatches[%d] (%s)", istioPath, i, p.ApplyTo)
		if p.Match.Context != "GATEWAY" {
			t.Errorf("%s: match.context %q; the example patches the ingress gateway (GATEWAY)", where, p.Match.Context)
		}
		switch p.ApplyTo {
		case "HTTP_FILTER":
			l := p.Match.Listener
			if l == nil || l.FilterChain.Filter.Name != "envoy.filters.network.http_connection_manager" ||
				l.FilterChain.Filter.SubFilter.Name != "envoy.filters.http.router" || p.Patch.Operation != "INSERT_BEFORE" {
				t.Errorf("%s: want INSERT_BEFORE the subFilter envoy.filters.http.router of envoy.filters.network.http_connection_manager", where)
			}
			hf := &hcmv3.HttpFilter{}
			protoFromYAML(t, where+" value", p.Patch.Value, hf)
			validateDeep(t, where+" value", hf)
			filter = rateLimitFilter{Name: hf.GetName(), Config: unpack[*ratelimitv3.RateLimit](t, where+" typed_config", hf.GetTypedConfig())}
		case "VIRTUAL_HOST":
			if rc := p.Match.RouteConfiguration; rc == nil || rc.Vhost.Name == nil || *rc.Vhost.Name != "" || p.Patch.Operation != "MERGE" {
				t.Errorf("%s: want a MERGE into every virtual host (vhost name \"\")", where)
			}
			vh := &routev3.VirtualHost{}
			protoFromYAML(t, where+" value", p.Patch.Value, vh)
			proto.Merge(vhost, vh)
		case "HTTP_ROUTE":
			rc := p.Match.RouteConfiguration
			if rc == nil || rc.Vhost.Route.Name == "" || p.Patch.Operation != "MERGE" {
				t.Fatalf("%s: want a MERGE into a route named in match.routeConfiguration.vhost.route.name", where)
			}
			patch := &routev3.Route{}
			protoFromYAML(t, where+" value", p.Patch.Value, patch)
			// The route as the VirtualService in the file's comment makes
			// it, with the patch merged in.
			name := rc.Vhost.Route.Name
			r := &routev3.Route{
				Name:   name,
				Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: "/" + name}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "outbound|80||shop.shop.svc.cluster.local"}}},
			}
			proto.Merge(r, patch)
			routes = append(routes, r)
		default:
			t.Errorf("%s: applyTo %s is not modelled by this test", where, p.ApplyTo)
		}
	}
	if filter.Config == nil {
		t.Fatalf("%s inserts no ratelimit filter", istioPath)
	}
	routes = append(routes, &routev3.Route{
		Name:   "default",
		Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "outbound|80||shop.shop.svc.cluster.local"}}},
	})
	vhost.Routes = routes
	rc := &routev3.RouteConfiguration{Name: "http.8080", VirtualHosts: []*routev3.VirtualHost{vhost}}
	validateDeep(t, istioPath+" patched routes", rc)

	// The filter.
	rl := filter.Config
	if filter.Name != "envoy.filters.http.ratelimit" {
		t.Errorf("the filter is named %q; per-route configs are keyed by envoy.filters.http.ratelimit", filter.Name)
	}
	if rl.GetFailureModeDeny() || rl.GetEnableXRatelimitHeaders() != ratelimitv3.RateLimit_DRAFT_VERSION_03 {
		t.Errorf("want failure_mode_deny false and enable_x_ratelimit_headers DRAFT_VERSION_03")
	}
	if rl.GetRateLimitService().GetTransportApiVersion() != corev3.ApiVersion_V3 {
		t.Errorf("rate_limit_service transport_api_version %v; want V3", rl.GetRateLimitService().GetTransportApiVersion())
	}

	// It calls the Service of deploy/kubernetes, on its gRPC port, through
	// the cluster Istio makes for it.
	objs := k8sManifests(t)
	svcObj := find(t, objs, "Service", "ratelimitd")
	var svc k8sService
	svcObj.decode(t, &svc)
	var grpcPort int
	for _, p := range svc.Spec.Ports {
		if p.Name == "grpc" {
			grpcPort = p.Port
		}
	}
	host := svcObj.Metadata.Name + "." + svcObj.Metadata.Namespace + ".svc.cluster.local"
	eg := rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc()
	if want := fmt.Sprintf("outbound|%d||%s", grpcPort, host); eg.GetClusterName() != want || eg.GetAuthority() != host {
		t.Errorf("the filter calls cluster %q with authority %q; want %q and %q (Service ratelimitd in deploy/kubernetes)",
			eg.GetClusterName(), eg.GetAuthority(), want, host)
	}
	if !strings.Contains(host, ".ratelimit.svc.cluster.local") {
		t.Errorf("ratelimitd's Service is %s; the README says ratelimitd.ratelimit.svc.cluster.local", host)
	}

	// What the gateway sends, against the rules ratelimitd serves there.
	rules, _ := configMapRules(t, objs)
	const client = "198.51.100.4"
	h := func(kv ...string) map[string]string {
		m := map[string]string{"host": "shop.example.com"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	tests := []requestCase{
		{"basic login", httpRequest{"POST", "/login", h("authorization", "Basic YWxpY2U6c2VjcmV0", "x-user-id", "alice"), client},
			"auth", []string{"(auth_type=basic) basic_auth_logins"}},
		{"bearer login", httpRequest{"POST", "/login", h("authorization", "Bearer abc", "x-user-id", "alice"), client}, "", nil},
		{"a user's request", httpRequest{"GET", "/products/7", h("x-user-id", "alice"), client},
			"api", []string{"(user_id=alice) requests_per_user_per_second"}},
		{"anonymous", httpRequest{"GET", "/products/7", h(), client}, "", nil},
	}
	produced := checkRequests(t, filter, rc.GetVirtualHosts(), rules, tests)

	for _, r := range routes {
		for i := range r.GetRoute().GetRateLimits() {
			if s := fmt.Sprintf("%s#%d", r.GetName(), i); !produced[s] {
				t.Errorf("rate limit %s produced no descriptor for any request of the table; add a request for it", s)
			}
		}
	}
	for i := range vhost.GetRateLimits() {
		if s := fmt.Sprintf("vhost:%s#%d", vhost.GetName(), i); !produced[s] {
			t.Errorf("rate limit %s produced no descriptor for any request of the table; add a request for it", s)
		}
	}
}
