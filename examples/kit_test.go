// Package examples holds the example rule files and the tests that keep the
// integration kit true to them: the Envoy bootstrap in envoy/, the Istio,
// Kubernetes and compose files in ../deploy, and the Dockerfile. The tests
// parse every file the way its consumer would (Envoy's own protos, with their
// validation rules), work out the descriptors each route sends, and check
// that every one of them matches a rule. A change that breaks an example
// breaks a test.
package examples

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/ratelimitd/ratelimitd/pkg/config"

	// The types the examples name in "@type", so that protojson can resolve
	// them.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// repoRoot is the repository, seen from this package's directory.
const repoRoot = ".."

// loadExampleRules loads the example rule files, this directory's *.yaml.
func loadExampleRules(t *testing.T) *config.Rules {
	t.Helper()
	rules, err := config.Load(".")
	if err != nil {
		t.Fatalf("loading the example rules: %v", err)
	}
	return rules
}

// yamlDocs reads every document of the YAML file at path.
func yamlDocs(t *testing.T, path string) []*yaml.Node {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []*yaml.Node
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(doc.Content) == 0 || doc.Content[0].Tag == "!!null" {
			continue // an empty document, such as after a trailing "---"
		}
		docs = append(docs, &doc)
	}
	if len(docs) == 0 {
		t.Fatalf("%s holds no YAML document", path)
	}
	return docs
}

// yamlToJSON converts a decoded YAML value to JSON.
func yamlToJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("converting YAML to JSON: %v", err)
	}
	return data
}

// protoFromYAML fills m from v, a decoded YAML value, as Envoy reads its YAML
// configuration: through JSON, with every field known and every "@type"
// resolvable.
func protoFromYAML(t *testing.T, where string, v any, m proto.Message) {
	t.Helper()
	if err := protojson.Unmarshal(yamlToJSON(t, v), m); err != nil {
		t.Fatalf("%s is not a valid %s (positions are in its JSON form): %v", where, m.ProtoReflect().Descriptor().FullName(), err)
	}
}

// validateDeep runs the protoc-gen-validate rules of m and of every message
// packed in an Any inside it (which the generated ValidateAll does not open),
// as Envoy does when it loads a configuration.
func validateDeep(t *testing.T, where string, m proto.Message) {
	t.Helper()
	type validator interface{ ValidateAll() error }
	v, ok := m.(validator)
	if !ok {
		t.Fatalf("%s: %T has no validation rules", where, m)
	}
	if err := v.ValidateAll(); err != nil {
		t.Errorf("%s: %v", where, err)
	}
	forEachAny(m.ProtoReflect(), func(a *anypb.Any) {
		inner, err := a.UnmarshalNew()
		if err != nil {
			t.Errorf("%s: %s: %v", where, a.GetTypeUrl(), err)
			return
		}
		validateDeep(t, where+" > "+string(inner.ProtoReflect().Descriptor().Name()), inner)
	})
}

// forEachAny calls f with every Any directly inside m (not those packed in
// another Any).
func forEachAny(m protoreflect.Message, f func(*anypb.Any)) {
	visit := func(m protoreflect.Message) {
		if a, ok := m.Interface().(*anypb.Any); ok {
			f(a)
			return
		}
		forEachAny(m, f)
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i, l := 0, v.List(); i < l.Len(); i++ {
				visit(l.Get(i).Message())
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				visit(mv.Message())
				return true
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			visit(v.Message())
		}
		return true
	})
}

// unpack returns the message packed in a, which must be a T.
func unpack[T proto.Message](t *testing.T, where string, a *anypb.Any) T {
	t.Helper()
	m, err := a.UnmarshalNew()
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	typed, ok := m.(T)
	if !ok {
		var want T
		t.Fatalf("%s holds a %s; want %T", where, m.ProtoReflect().Descriptor().FullName(), want)
	}
	return typed
}

// onlyFields fails the test when m sets a field not in known: the
// descriptor computation below models those fields only, and a field it
// ignored could change what Envoy sends.
func onlyFields(t *testing.T, where string, m proto.Message, known ...string) {
	t.Helper()
	m.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		if !slices.Contains(known, string(fd.Name())) {
			t.Fatalf("%s sets %s, which this test does not model (it knows %s): teach examples/kit_test.go what Envoy does with it",
				where, fd.Name(), strings.Join(known, ", "))
		}
		return true
	})
}

// httpRequest is a request as the route match and the rate-limit actions see
// it.
type httpRequest struct {
	Method, Path string
	Headers      map[string]string // names in lower case
	RemoteIP     string            // the downstream peer's address
}

func (r httpRequest) header(name string) (string, bool) {
	switch name = strings.ToLower(name); name {
	case ":method":
		return r.Method, true
	case ":path":
		return r.Path, true
	}
	v, ok := r.Headers[name]
	return v, ok
}

// pathOnly is the path without its query string.
func (r httpRequest) pathOnly() string {
	p, _, _ := strings.Cut(r.Path, "?")
	return p
}

// entry and descriptor are what Envoy sends ratelimitd; descriptor
// implements config.Descriptor.
type entry struct{ Key, Value string }

type descriptor []entry

func (d descriptor) Len() int                        { return len(d) }
func (d descriptor) Entry(i int) (key, value string) { return d[i].Key, d[i].Value }

func (d descriptor) String() string {
	var b strings.Builder
	for _, e := range d {
		fmt.Fprintf(&b, "(%s=%s)", e.Key, e.Value)
	}
	return b.String()
}

// rlsCall is what the ratelimit filter sends for one request.
type rlsCall struct {
	Route       string
	Domain      string
	Descriptors []descriptor
	// Sources names, for each descriptor, the rate limit that produced it,
	// as "route#index" (or "vhost:name#index").
	Sources []string
}

// rateLimitFilter models Envoy's HTTP ratelimit filter
// (envoy.filters.http.ratelimit) over a route table: which domain and which
// descriptors it sends ratelimitd for a request.
type rateLimitFilter struct {
	Name   string // the HTTP filter's name: the key of its per-route configs
	Config *ratelimitv3.RateLimit
}

// call returns what the filter sends for req, and false when it does not
// call ratelimitd (no route, or no descriptor).
func (f rateLimitFilter) call(t *testing.T, vhosts []*routev3.VirtualHost, req httpRequest) (rlsCall, bool) {
	t.Helper()
	vh := selectVirtualHost(t, vhosts, req)
	if vh == nil {
		return rlsCall{}, false
	}
	onlyFields(t, "virtual host "+vh.GetName(), vh, "name", "domains", "routes", "rate_limits", "typed_per_filter_config")
	var route *routev3.Route
	for _, r := range vh.GetRoutes() {
		if routeMatches(t, r, req) {
			route = r
			break
		}
	}
	if route == nil || route.GetRoute() == nil {
		return rlsCall{}, false // no route entry (no match, a redirect or a direct response): no rate limit
	}
	where := "route " + route.GetName()
	onlyFields(t, where, route, "name", "match", "route", "typed_per_filter_config")
	onlyFields(t, where+" action", route.GetRoute(), "cluster", "rate_limits", "prefix_rewrite", "timeout")

	perRoute := f.perRoute(t, route.GetTypedPerFilterConfig(), where)
	if perRoute == nil {
		perRoute = f.perRoute(t, vh.GetTypedPerFilterConfig(), "virtual host "+vh.GetName())
	}
	if f.Config.GetStage() != 0 {
		t.Fatalf("the ratelimit filter has stage %d; this test models stage 0 only", f.Config.GetStage())
	}

	type source struct {
		name   string
		limits []*routev3.RateLimit
	}
	var sources []source
	switch {
	case len(perRoute.GetRateLimits()) > 0:
		sources = append(sources, source{where + " per-filter config", perRoute.GetRateLimits()})
	case len(f.Config.GetRateLimits()) > 0:
		sources = append(sources, source{"filter " + f.Name, f.Config.GetRateLimits()})
	default:
		var stage0 []*routev3.RateLimit
		for _, rl := range route.GetRoute().GetRateLimits() {
			if rl.GetStage().GetValue() == f.Config.GetStage() {
				stage0 = append(stage0, rl)
			}
		}
		sources = append(sources, source{route.GetName(), stage0})
		vhOption := perRoute.GetVhRateLimits() // OVERRIDE when unset
		vhLimits := source{"vhost:" + vh.GetName(), vh.GetRateLimits()}
		switch vhOption {
		case ratelimitv3.RateLimitPerRoute_INCLUDE:
			sources = append(sources, vhLimits)
		case ratelimitv3.RateLimitPerRoute_OVERRIDE:
			if len(route.GetRoute().GetRateLimits()) == 0 {
				sources = append(sources, vhLimits)
			}
		}
	}

	c := rlsCall{Route: route.GetName(), Domain: f.Config.GetDomain()}
	if d := perRoute.GetDomain(); d != "" {
		c.Domain = d
	}
	for _, s := range sources {
		for i, rl := range s.limits {
			if d, ok := descriptorFor(t, fmt.Sprintf("%s#%d", s.name, i), rl, route.GetRoute().GetCluster(), req); ok {
				c.Descriptors = append(c.Descriptors, d)
				c.Sources = append(c.Sources, fmt.Sprintf("%s#%d", s.name, i))
			}
		}
	}
	return c, len(c.Descriptors) > 0
}

// perRoute returns the filter's per-route configuration in configs, or nil.
func (f rateLimitFilter) perRoute(t *testing.T, configs map[string]*anypb.Any, where string) *ratelimitv3.RateLimitPerRoute {
	t.Helper()
	a, ok := configs[f.Name]
	if !ok {
		return nil
	}
	pr := unpack[*ratelimitv3.RateLimitPerRoute](t, where+" typed_per_filter_config "+f.Name, a)
	onlyFields(t, where+" RateLimitPerRoute", pr, "domain", "rate_limits", "vh_rate_limits")
	return pr
}

// selectVirtualHost returns the virtual host serving req's Host: an exact
// domain, else "*".
func selectVirtualHost(t *testing.T, vhosts []*routev3.VirtualHost, req httpRequest) *routev3.VirtualHost {
	t.Helper()
	host, _ := req.header("host")
	var star *routev3.VirtualHost
	for _, vh := range vhosts {
		for _, d := range vh.GetDomains() {
			switch {
			case d == "*":
				if star == nil {
					star = vh
				}
			case strings.Contains(d, "*"):
				t.Fatalf("virtual host %s: domain %q: this test models exact domains and \"*\" only", vh.GetName(), d)
			case strings.EqualFold(d, host):
				return vh
			}
		}
	}
	return star
}

// routeMatches reports whether route r matches req.
func routeMatches(t *testing.T, r *routev3.Route, req httpRequest) bool {
	t.Helper()
	m := r.GetMatch()
	where := "route " + r.GetName() + " match"
	onlyFields(t, where, m, "prefix", "path", "path_separated_prefix", "headers")
	var ok bool
	switch ps := m.GetPathSpecifier().(type) {
	case *routev3.RouteMatch_Prefix:
		ok = strings.HasPrefix(req.Path, ps.Prefix) // the whole :path, query included
	case *routev3.RouteMatch_Path:
		ok = req.pathOnly() == ps.Path
	case *routev3.RouteMatch_PathSeparatedPrefix:
		p := req.pathOnly()
		ok = p == ps.PathSeparatedPrefix || strings.HasPrefix(p, ps.PathSeparatedPrefix+"/")
	}
	for _, h := range m.GetHeaders() {
		ok = ok && headerMatches(t, where, h, req)
	}
	return ok
}

// headerMatches reports whether req matches header matcher h.
func headerMatches(t *testing.T, where string, h *routev3.HeaderMatcher, req httpRequest) bool {
	t.Helper()
	onlyFields(t, where+" header "+h.GetName(), h, "name", "string_match", "present_match")
	v, present := req.header(h.GetName())
	switch spec := h.GetHeaderMatchSpecifier().(type) {
	case nil:
		return present
	case *routev3.HeaderMatcher_PresentMatch:
		return present == spec.PresentMatch
	case *routev3.HeaderMatcher_StringMatch:
		return present && stringMatches(t, where+" header "+h.GetName(), spec.StringMatch, v)
	}
	panic("unreachable: onlyFields admitted another specifier")
}

// stringMatches reports whether v matches m.
func stringMatches(t *testing.T, where string, m *matcherv3.StringMatcher, v string) bool {
	t.Helper()
	onlyFields(t, where+" string_match", m, "exact", "prefix", "suffix", "contains", "safe_regex", "ignore_case")
	fold := func(s string) string {
		if m.GetIgnoreCase() {
			return strings.ToLower(s)
		}
		return s
	}
	switch p := m.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		return fold(v) == fold(p.Exact)
	case *matcherv3.StringMatcher_Prefix:
		return strings.HasPrefix(fold(v), fold(p.Prefix))
	case *matcherv3.StringMatcher_Suffix:
		return strings.HasSuffix(fold(v), fold(p.Suffix))
	case *matcherv3.StringMatcher_Contains:
		return strings.Contains(fold(v), fold(p.Contains))
	case *matcherv3.StringMatcher_SafeRegex:
		re, err := regexp.Compile(`^(?:` + p.SafeRegex.GetRegex() + `)$`) // RE2, whole value, as Envoy
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		return re.MatchString(v)
	}
	t.Fatalf("%s: no match pattern", where)
	return false
}

// descriptorFor returns the descriptor rate limit rl produces for req, as
// Envoy's RateLimitPolicyEntry does: the actions' entries in order; when an
// action cannot produce its entry, no descriptor at all.
func descriptorFor(t *testing.T, where string, rl *routev3.RateLimit, cluster string, req httpRequest) (descriptor, bool) {
	t.Helper()
	onlyFields(t, where, rl, "actions", "stage")
	var d descriptor
	for i, a := range rl.GetActions() {
		w := fmt.Sprintf("%s action %d", where, i)
		switch a := a.GetActionSpecifier().(type) {
		case *routev3.RateLimit_Action_RequestHeaders_:
			onlyFields(t, w, a.RequestHeaders, "header_name", "descriptor_key", "skip_if_absent")
			v, ok := req.header(a.RequestHeaders.GetHeaderName())
			switch {
			case ok:
				d = append(d, entry{a.RequestHeaders.GetDescriptorKey(), v})
			case !a.RequestHeaders.GetSkipIfAbsent():
				return nil, false
			}
		case *routev3.RateLimit_Action_RemoteAddress_:
			if req.RemoteIP == "" {
				return nil, false
			}
			d = append(d, entry{"remote_address", req.RemoteIP})
		case *routev3.RateLimit_Action_DestinationCluster_:
			d = append(d, entry{"destination_cluster", cluster})
		case *routev3.RateLimit_Action_GenericKey_:
			onlyFields(t, w, a.GenericKey, "descriptor_key", "descriptor_value")
			d = append(d, entry{cmpOr(a.GenericKey.GetDescriptorKey(), "generic_key"), literal(t, w, a.GenericKey.GetDescriptorValue())})
		case *routev3.RateLimit_Action_HeaderValueMatch_:
			hvm := a.HeaderValueMatch
			onlyFields(t, w, hvm, "descriptor_key", "descriptor_value", "expect_match", "headers")
			matched := true
			for _, h := range hvm.GetHeaders() {
				matched = matched && headerMatches(t, w, h, req)
			}
			expect := hvm.GetExpectMatch() == nil || hvm.GetExpectMatch().GetValue()
			if matched != expect {
				return nil, false
			}
			d = append(d, entry{cmpOr(hvm.GetDescriptorKey(), "header_match"), literal(t, w, hvm.GetDescriptorValue())})
		default:
			t.Fatalf("%s: action %T: this test does not model it; teach examples/kit_test.go what Envoy sends for it", w, a)
		}
	}
	return d, len(d) > 0
}

// literal returns a descriptor value, which the examples keep free of
// formatter substitutions (%...%, off by default in Envoy).
func literal(t *testing.T, where, v string) string {
	t.Helper()
	if strings.Contains(v, "%") {
		t.Fatalf("%s: descriptor value %q holds %%: this test models literal values only", where, v)
	}
	return v
}

func cmpOr(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// checkCall checks that every descriptor of c matches a rule of rules in
// c's domain, and returns one line per descriptor, "(k=v)... rule-name".
// requestCase is a request and the call to ratelimitd it must cause: the
// domain ("" for no call) and each descriptor with the name of the rule it
// matches.
type requestCase struct {
	name   string
	req    httpRequest
	domain string
	want   []string
}

// checkRequests runs each case through f and vhosts, checks the call it
// causes against rules, and returns the rate limits ("route#i") the cases
// exercised.
func checkRequests(t *testing.T, f rateLimitFilter, vhosts []*routev3.VirtualHost, rules *config.Rules, cases []requestCase) map[string]bool {
	t.Helper()
	produced := map[string]bool{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, called := f.call(t, vhosts, tc.req)
			if !called {
				if tc.domain != "" {
					t.Fatalf("%s %s: the gateway would not call ratelimitd; want domain %s with %q", tc.req.Method, tc.req.Path, tc.domain, tc.want)
				}
				return
			}
			for _, s := range c.Sources {
				produced[s] = true
			}
			got := checkCall(t, rules, c)
			if c.Domain != tc.domain || !slices.Equal(got, tc.want) {
				t.Errorf("%s %s (route %s): domain %q, descriptors %q; want domain %q, %q",
					tc.req.Method, tc.req.Path, c.Route, c.Domain, got, tc.domain, tc.want)
			}
		})
	}
	return produced
}

func checkCall(t *testing.T, rules *config.Rules, c rlsCall) []string {
	t.Helper()
	d := rules.Domain(c.Domain)
	if d == nil {
		t.Errorf("route %s sends domain %q, which no rule file defines: ratelimitd would admit everything", c.Route, c.Domain)
		return nil
	}
	var got []string
	for i, desc := range c.Descriptors {
		r := d.Match(desc)
		if r == nil {
			t.Errorf("route %s (%s) sends %s in domain %q, which matches no rule of %s: ratelimitd would not limit it",
				c.Route, c.Sources[i], desc, c.Domain, d.File)
			got = append(got, desc.String()+" <no rule>")
			continue
		}
		got = append(got, desc.String()+" "+r.Name)
	}
	return got
}

// cmdSource is the text of ratelimitd's command (non-test files), to check
// that the flags the examples pass exist.
func cmdSource(t *testing.T) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot, "cmd", "ratelimitd", "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no source of cmd/ratelimitd: %v", err)
	}
	var b strings.Builder
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(data)
	}
	return b.String()
}

// parseFlags parses ratelimitd's arguments (-name=value or -name value)
// into a map, failing on a flag the command does not define.
func parseFlags(t *testing.T, where string, args []string) map[string]string {
	t.Helper()
	src := cmdSource(t)
	flags := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			t.Fatalf("%s: argument %q is not a flag", where, a)
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !hasValue {
			if i+1 >= len(args) {
				t.Fatalf("%s: flag %s has no value", where, a)
			}
			i++
			value = args[i]
		}
		if !strings.Contains(src, `"`+name+`"`) {
			t.Errorf("%s: flag -%s: cmd/ratelimitd defines no such flag", where, name)
		}
		flags[name] = value
	}
	return flags
}
