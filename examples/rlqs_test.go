package examples

import (
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	xdsmatcherv3 "github.com/cncf/xds/go/xds/type/matcher/v3"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/ratelimitd/ratelimitd/pkg/config"
)

var rlqsBootstrapPath = filepath.Join("envoy", "rlqs.yaml")

// sampleHeader is the value the test gives every header a bucket id reads.
const sampleHeader = "U"

// TestEnvoyRLQS parses examples/envoy/rlqs.yaml into go-control-plane's
// Bootstrap (Envoy v1.40's protos), strictly, runs the protos' validation
// rules, and checks the rate_limit_quota filter: its RLQS server is the
// ratelimitd cluster, over HTTP/2 on ratelimitd's gRPC port; its domain has
// rules; every bucket id its matchers build, its entries sorted by key as
// ratelimitd reads it, matches a rule with a rate limit in that domain; and
// every bucket says what to do before an assignment and after one expires
// in a way Envoy's filter applies, reports at the interval Envoy really
// reports at, and refuses with 429 (RESOURCE_EXHAUSTED for gRPC).
func TestEnvoyRLQS(t *testing.T) {
	docs := yamlDocs(t, rlqsBootstrapPath)
	if len(docs) != 1 {
		t.Fatalf("%s holds %d documents; Envoy reads one", rlqsBootstrapPath, len(docs))
	}
	var v any
	if err := docs[0].Decode(&v); err != nil {
		t.Fatal(err)
	}
	b := &bootstrapv3.Bootstrap{}
	protoFromYAML(t, rlqsBootstrapPath, v, b)
	validateDeep(t, rlqsBootstrapPath, b)

	var filter *rlqsv3.RateLimitQuotaFilterConfig
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				if !strings.HasSuffix(f.GetTypedConfig().GetTypeUrl(), "HttpConnectionManager") {
					continue
				}
				hcm := unpack[*hcmv3.HttpConnectionManager](t, "filter "+f.GetName(), f.GetTypedConfig())
				filters := hcm.GetHttpFilters()
				for i, hf := range filters {
					if strings.HasSuffix(hf.GetTypedConfig().GetTypeUrl(), "rate_limit_quota.v3.RateLimitQuotaFilterConfig") {
						filter = unpack[*rlqsv3.RateLimitQuotaFilterConfig](t, "http filter "+hf.GetName(), hf.GetTypedConfig())
						if i == len(filters)-1 || !strings.HasSuffix(filters[len(filters)-1].GetTypedConfig().GetTypeUrl(), "router.v3.Router") {
							t.Error("the rate_limit_quota filter must come before the router, which must be the last filter")
						}
					}
				}
			}
		}
	}
	if filter == nil {
		t.Fatalf("%s has no envoy.filters.http.rate_limit_quota filter", rlqsBootstrapPath)
	}

	// The RLQS server: ratelimitd's gRPC port, over HTTP/2.
	name := filter.GetRlqsServer().GetEnvoyGrpc().GetClusterName()
	var cluster bool
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() != name {
			continue
		}
		cluster = true
		opts := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
		if opts == nil || unpack[*upstreamhttpv3.HttpProtocolOptions](t, "cluster "+name, opts).GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
			t.Errorf("cluster %s does not speak HTTP/2, which gRPC needs", name)
		}
		for _, e := range c.GetLoadAssignment().GetEndpoints() {
			for _, le := range e.GetLbEndpoints() {
				if p := le.GetEndpoint().GetAddress().GetSocketAddress().GetPortValue(); p != 8081 {
					t.Errorf("cluster %s reaches port %d; ratelimitd serves gRPC on 8081", name, p)
				}
			}
		}
	}
	if !cluster {
		t.Fatalf("rlqs_server names cluster %q, which is not defined", name)
	}

	// Every bucket id is decided by a rate limit of the filter's domain.
	rules := loadExampleRules(t)
	dom := rules.Domain(filter.GetDomain())
	if dom == nil {
		t.Fatalf("the filter's domain %q has no example rules", filter.GetDomain())
	}
	buckets := bucketSettings(t, filter.GetBucketMatchers())
	if len(buckets) == 0 {
		t.Fatal("the bucket matchers build no bucket")
	}
	for _, s := range buckets {
		id := bucketID(t, s)
		d := sortedDescriptor(id)
		r := dom.Match(d)
		if r == nil || r.Unlimited || len(r.Limits) == 0 {
			t.Errorf("bucket id %v, descriptor %v in domain %s, matches no rule with a rate limit (got %v)", id, d, filter.GetDomain(), r)
			continue
		}
		t.Logf("bucket id %v → descriptor %v → rule %s", id, d, r.ID)
		// Envoy reports every 5 s whatever reporting_interval says
		// (initTlsStore in filter_persistence.cc): the file says so.
		if got := s.GetReportingInterval().AsDuration(); got != 5*time.Second {
			t.Errorf("bucket %v: reporting_interval %v; Envoy reports every 5s whatever it says", id, got)
		}
		if s.GetNoAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule() != typev3.RateLimitStrategy_ALLOW_ALL {
			t.Errorf("bucket %v: no_assignment_behavior %v; a blanket ALLOW_ALL admits a new bucket's first requests, as the ratelimit filter fails open (a token bucket there crashes Envoy: no limiter is made for it)", id, s.GetNoAssignmentBehavior())
		}
		// recordBucketUsage in filter.cc reads fallback_rate_limit and the
		// timeout's seconds only: reuse_last_assignment does nothing.
		eab := s.GetExpiredAssignmentBehavior()
		if eab.GetFallbackRateLimit() == nil || eab.GetExpiredAssignmentBehaviorTimeout().AsDuration() < time.Second {
			t.Errorf("bucket %v: expired_assignment_behavior %v; Envoy applies only a fallback_rate_limit, for whole seconds", id, eab)
		}
		if d := s.GetDenyResponseSettings(); d.GetHttpStatus().GetCode() != 429 || d.GetGrpcStatus().GetCode() != 8 {
			t.Errorf("bucket %v: deny_response_settings %v; want 429, and RESOURCE_EXHAUSTED for gRPC callers", id, d)
		}
	}
}

// bucketSettings returns the bucket settings every action of m, and of the
// matchers nested in it, holds.
func bucketSettings(t *testing.T, m *xdsmatcherv3.Matcher) []*rlqsv3.RateLimitQuotaBucketSettings {
	t.Helper()
	var out []*rlqsv3.RateLimitQuotaBucketSettings
	var visit func(*xdsmatcherv3.Matcher_OnMatch)
	walk := func(m *xdsmatcherv3.Matcher) {
		for _, fm := range m.GetMatcherList().GetMatchers() {
			visit(fm.GetOnMatch())
		}
		for _, fm := range m.GetMatcherTree().GetExactMatchMap().GetMap() {
			visit(fm)
		}
		if m.GetOnNoMatch() != nil {
			visit(m.GetOnNoMatch())
		}
	}
	visit = func(om *xdsmatcherv3.Matcher_OnMatch) {
		if a := om.GetAction(); a != nil {
			out = append(out, unpack[*rlqsv3.RateLimitQuotaBucketSettings](t, "bucket action "+a.GetName(), a.GetTypedConfig()))
		}
		if nested := om.GetMatcher(); nested != nil {
			walk(nested)
		}
	}
	walk(m)
	return out
}

// bucketID is the bucket id the settings build for a request whose every
// header holds sampleHeader.
func bucketID(t *testing.T, s *rlqsv3.RateLimitQuotaBucketSettings) map[string]string {
	t.Helper()
	id := map[string]string{}
	for k, vb := range s.GetBucketIdBuilder().GetBucketIdBuilder() {
		switch {
		case vb.GetCustomValue() != nil:
			in := vb.GetCustomValue().GetTypedConfig()
			if !strings.HasSuffix(in.GetTypeUrl(), "HttpRequestHeaderMatchInput") {
				t.Fatalf("bucket id entry %s reads %s; the test models header inputs", k, in.GetTypeUrl())
			}
			unpack[*matcherv3.HttpRequestHeaderMatchInput](t, "bucket id entry "+k, in)
			id[k] = sampleHeader
		default:
			id[k] = vb.GetStringValue()
		}
	}
	return id
}

// bucketDescriptor is a bucket id as ratelimitd decides it: its entries
// sorted by key.
type bucketDescriptor [][2]string

func sortedDescriptor(id map[string]string) bucketDescriptor {
	var d bucketDescriptor
	for _, k := range slices.Sorted(maps.Keys(id)) {
		d = append(d, [2]string{k, id[k]})
	}
	return d
}

func (d bucketDescriptor) Len() int                     { return len(d) }
func (d bucketDescriptor) Entry(i int) (string, string) { return d[i][0], d[i][1] }

var _ config.Descriptor = bucketDescriptor(nil)
