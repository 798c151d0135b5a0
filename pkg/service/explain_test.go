package service

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// explainTestRules has a rule for every result and every way to match.
const explainTestRules = `
domain: shop
failure_mode: closed
descriptors:
  - key: user_id
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: user_id
    value: admin
    rate_limit: {unlimited: true}
  - key: user_id
    value: vip
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /files/*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 7}
  - key: tenant
    descriptors:
      - key: plan
        value: free
        rate_limits:
          - {name: free_per_second, unit: second, requests_per_unit: 1}
          - {name: free_per_hour, unit: hour, requests_per_unit: 100, algorithm: token_bucket, burst: 20}
  - key: region
    value: eu
    descriptors:
      - key: user
        rate_limit: {name: eu_user, unit: second, requests_per_unit: 3}
  - key: region
    value: eu-premium
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 30, replaces: [{name: eu_user}]}
`

// explainOtherRules is a domain without a failure_mode of its own.
const explainOtherRules = `
domain: other
descriptors:
  - {key: k, rate_limit: {unit: second, requests_per_unit: 1}}
`

// forbiddenBackend fails the test when it is asked to decide anything.
type forbiddenBackend struct{ t *testing.T }

func (b forbiddenBackend) Decide(context.Context, []algo.Request, []algo.Decision) error {
	b.t.Error("the backend was called")
	return nil
}

// forbiddenObserver fails the test when it is told of anything.
type forbiddenObserver struct{ t *testing.T }

func (o forbiddenObserver) Decided(string, *config.Rule, *rlv3.RateLimitDescriptor, Outcome, uint64) {
	o.t.Error("the observer was told of a decision")
}

func (o forbiddenObserver) BackendCall(time.Duration, error) {
	o.t.Error("the observer was told of a backend call")
}

func (o forbiddenObserver) FailureMode(string, config.FailureMode) {
	o.t.Error("the observer was told of a failure mode decision")
}

// newExplainService returns a service on the explain test rules whose
// backend and observer fail the test when called.
func newExplainService(t *testing.T, opts Options) *Service {
	t.Helper()
	return newExplainServiceWith(t, forbiddenBackend{t}, opts)
}

func newExplainServiceWith(t *testing.T, be algo.Backend, opts Options) *Service {
	t.Helper()
	rules, err := config.Parse(
		config.File{Name: "shop.yaml", Data: []byte(explainTestRules)},
		config.File{Name: "other.yaml", Data: []byte(explainOtherRules)})
	if err != nil {
		t.Fatal(err)
	}
	if opts.Observer == nil {
		opts.Observer = forbiddenObserver{t}
	}
	svc, err := New(be, rules, opts)
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// postExplain calls serveExplain with body; the route is registered by
// HTTPHandler.
func postExplain(t *testing.T, svc *Service, body string) (int, http.Header, string) {
	t.Helper()
	req := httptest.NewRequest("POST", "/explain", strings.NewReader(body))
	rec := httptest.NewRecorder()
	svc.serveExplain(rec, req)
	res := rec.Result()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, string(b)
}

// explainOK explains req and decodes the 200 answer.
func explainOK(t *testing.T, svc *Service, req *rlsv3.RateLimitRequest) *ExplainResponse {
	t.Helper()
	body, err := protojson.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	code, hdr, got := postExplain(t, svc, string(body))
	if code != http.StatusOK || hdr.Get("Content-Type") != "application/json" {
		t.Fatalf("explain %s: %d %s\n%s", body, code, hdr.Get("Content-Type"), got)
	}
	var resp ExplainResponse
	dec := json.NewDecoder(strings.NewReader(got))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&resp); err != nil {
		t.Fatalf("answer is not an ExplainResponse: %v\n%s", err, got)
	}
	if len(resp.Descriptors) != len(req.Descriptors) {
		t.Fatalf("%d descriptors explained for %d sent:\n%s", len(resp.Descriptors), len(req.Descriptors), got)
	}
	return &resp
}

// entriesOf builds a descriptor from key, value pairs.
func entriesOf(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// containsInOrder reports whether each of subs is in its own sentence of
// why, in order.
func containsInOrder(why []string, subs ...string) bool {
	j := 0
	for _, s := range subs {
		for j < len(why) && !strings.Contains(why[j], s) {
			j++
		}
		if j == len(why) {
			return false
		}
		j++
	}
	return true
}

func TestExplainResults(t *testing.T) {
	svc := newExplainService(t, Options{})
	type level struct{ match, rule string }
	cases := []struct {
		name   string
		d      *rlv3.RateLimitDescriptor
		result string
		reason string // NoMatchReason
		rule   string // rule ID
		levels []level
		shadow bool
		keys   []string
		why    []string
	}{
		{"exact value", entriesOf("user_id", "vip"), ExplainMatched, "", "shop.user_id_vip",
			[]level{{"value", "shop.user_id_vip"}}, true,
			[]string{"4:shop=7:user_id3:vip|fixed_window/60s"},
			[]string{`level 1: entry "user_id"="vip" matched the descriptor with key "user_id" and value "vip" exactly; it holds rule shop.user_id_vip (shop.yaml:10); it outranks "user_id" (any value), which matches too`,
				"result: rule shop.user_id_vip (shop.yaml:10) matches",
				"the descriptor is counted under 2 per minute (fixed_window)",
				"rule shop.user_id_vip is in shadow mode: decided and counted like any other, but it never causes a refusal"}},
		{"key default", entriesOf("user_id", "42"), ExplainMatched, "", "shop.user_id",
			[]level{{"key_default", "shop.user_id"}}, false,
			[]string{"4:shop=7:user_id2:42|fixed_window/60s"},
			[]string{`level 1: entry "user_id"="42" matched the key-only descriptor "user_id" (any value)`,
				"result: rule shop.user_id (shop.yaml:5) matches",
				"the descriptor is counted under 10 per minute (fixed_window)"}},
		{"wildcard with share_threshold", entriesOf("path", "/files/a.pdf"), ExplainMatched, "", "shop.path_/files/*",
			[]level{{"wildcard", "shop.path_/files/*"}}, false,
			[]string{"4:shop*4:path8:/files/*|fixed_window/1s"}, // the pattern, shared by every file
			[]string{`matched the wildcard "path"="/files/*" (wildcard), the first wildcard of key "path" in file order whose prefix starts the value (no descriptor has the exact value); with share_threshold, every value matching it shares one counter`}},
		{"wildcard without share_threshold", entriesOf("path", "/api/users"), ExplainMatched, "", "shop.path_/api/*",
			[]level{{"wildcard", "shop.path_/api/*"}}, false,
			[]string{"4:shop=4:path10:/api/users|fixed_window/1s"}, // the value: one counter per path
			[]string{`matched the wildcard "path"="/api/*" (wildcard), the first wildcard of key "path" in file order whose prefix starts the value (no descriptor has the exact value); without share_threshold, each value has its own counter`}},
		{"nested levels, several limits", entriesOf("tenant", "acme", "plan", "free"), ExplainMatched, "", "shop.tenant.plan_free",
			[]level{{"key_default", ""}, {"value", "shop.tenant.plan_free"}}, false,
			[]string{"4:shop=6:tenant4:acme=4:plan4:free|fixed_window/1s", "4:shop=6:tenant4:acme=4:plan4:free|token_bucket/3600s"},
			[]string{`level 1: entry "tenant"="acme" matched the key-only descriptor "tenant" (any value)`,
				`level 2: entry "plan"="free" matched the descriptor with key "plan" and value "free" exactly; it holds rule shop.tenant.plan_free (shop.yaml:23)`,
				`the descriptor is counted under 1 per second (fixed_window) named "free_per_second" and 100 per hour (token_bucket, burst 20) named "free_per_hour", decided together`}},
		{"no match: an entry matches nothing", entriesOf("tenant", "acme", "plan", "pro"), ExplainNoMatch, "entry_unmatched", "",
			[]level{{"key_default", ""}, {"no_match", ""}}, false, nil,
			[]string{`level 2: entry "plan"="pro" matches nothing at this level: key "plan" is here only as "plan"="free", and there is no key-only descriptor "plan" for any value`,
				"result: no rule, level 2 matched nothing",
				"the descriptor is answered OK without a limit and is not counted"}},
		{"no match: an unknown key", entriesOf("color", "red"), ExplainNoMatch, "entry_unmatched", "",
			[]level{{"no_match", ""}}, false, nil,
			[]string{`level 1: entry "color"="red" matches nothing at this level: no descriptor has key "color"; the level offers "path"="/files/*" (wildcard)`}},
		{"no match: the descriptor stops short", entriesOf("tenant", "acme"), ExplainNoMatch, "no_rate_limit", "",
			[]level{{"key_default", ""}}, false, nil,
			[]string{`result: no rule, the descriptor ends at level 1 on a descriptor without a rate_limit of its own; the rules below it need more entries: "plan"="free"`}},
		{"unlimited", entriesOf("user_id", "admin"), ExplainUnlimited, "", "shop.user_id_admin",
			[]level{{"value", "shop.user_id_admin"}}, false, nil,
			[]string{"result: rule shop.user_id_admin (shop.yaml:7) matches",
				"rule shop.user_id_admin is unlimited: the descriptor is admitted without being counted"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp := explainOK(t, svc, &rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*rlv3.RateLimitDescriptor{c.d}})
			if !resp.DomainKnown || resp.DomainFile != "shop.yaml" || resp.RulesHash != svc.Rules().Hash() {
				t.Errorf("domain %+v", resp)
			}
			ed := resp.Descriptors[0]
			ruleID := ""
			if ed.Rule != nil {
				ruleID = ed.Rule.ID
			}
			if ed.Result != c.result || ed.NoMatchReason != c.reason || ruleID != c.rule || ed.Shadow != c.shadow || ed.Hits != 1 {
				t.Errorf("result %q reason %q rule %q shadow %t hits %d, want %q %q %q %t 1",
					ed.Result, ed.NoMatchReason, ruleID, ed.Shadow, ed.Hits, c.result, c.reason, c.rule, c.shadow)
			}
			var levels []level
			for _, l := range ed.Levels {
				levels = append(levels, level{l.Match, l.Rule})
			}
			if !reflect.DeepEqual(levels, c.levels) {
				t.Errorf("levels %v, want %v", levels, c.levels)
			}
			if !slices.Equal(ed.Keys, c.keys) {
				t.Errorf("keys %q, want %q", ed.Keys, c.keys)
			}
			if !containsInOrder(ed.Why, c.why...) {
				t.Errorf("why lacks (in order) %q:\n%s", c.why, strings.Join(ed.Why, "\n"))
			}
			if len(ed.Entries) != len(c.d.Entries) || ed.Entries[0].Key != c.d.Entries[0].Key {
				t.Errorf("entries %+v", ed.Entries)
			}
		})
	}
}

func TestExplainRuleFields(t *testing.T) {
	svc := newExplainService(t, Options{})
	resp := explainOK(t, svc, &rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*rlv3.RateLimitDescriptor{
		entriesOf("tenant", "acme", "plan", "free"),
		entriesOf("path", "/files/x"),
	}})
	want := &ExplainRule{
		ID: "shop.tenant.plan_free", Name: "free_per_second", File: "shop.yaml", Line: 23,
		Limits: []ExplainLimit{
			{Name: "free_per_second", RequestsPerUnit: 1, Unit: "SECOND", UnitMultiplier: 1, Algorithm: "fixed_window", Consistency: "exact", OverLimitHits: "drop"},
			{Name: "free_per_hour", RequestsPerUnit: 100, Unit: "HOUR", UnitMultiplier: 1, Algorithm: "token_bucket", Burst: 20, Consistency: "exact", OverLimitHits: "drop"},
		},
	}
	if got := resp.Descriptors[0].Rule; !reflect.DeepEqual(got, want) {
		t.Errorf("rule %+v,\nwant %+v", got, want)
	}
	wantLevel := ExplainLevel{Key: "path", Value: "/files/x", Match: "wildcard", Rule: "shop.path_/files/*",
		Descriptor: &ExplainRuleDescriptor{Key: "path", Value: "/files/*", Wildcard: true, ShareThreshold: true}}
	if got := resp.Descriptors[1].Levels; len(got) != 1 || !reflect.DeepEqual(got[0], wantLevel) {
		t.Errorf("levels %+v, want [%+v]", got, wantLevel)
	}
}

func TestExplainReplaced(t *testing.T) {
	svc := newExplainService(t, Options{})
	resp := explainOK(t, svc, &rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*rlv3.RateLimitDescriptor{
		entriesOf("region", "eu", "user", "u1"),
		entriesOf("region", "eu-premium", "user", "u1"),
	}})
	dropped, replacer := resp.Descriptors[0], resp.Descriptors[1]
	if dropped.Result != ExplainReplaced || dropped.Rule == nil || dropped.Rule.ID != "shop.region_eu.user" ||
		dropped.ReplacedBy != "shop.region_eu-premium.user" || dropped.ReplacedName != "eu_user" || len(dropped.Keys) != 0 || dropped.Shadow {
		t.Errorf("replaced descriptor %+v", dropped)
	}
	if !containsInOrder(dropped.Why, "result: rule shop.region_eu.user (shop.yaml:31) matches",
		`rule shop.region_eu.user is replaced by rule shop.region_eu-premium.user (shop.yaml:36), matched by descriptors[1] of this request, which replaces "eu_user": the descriptor is answered OK without a limit and is not counted`) {
		t.Errorf("why:\n%s", strings.Join(dropped.Why, "\n"))
	}
	if replacer.Result != ExplainMatched || replacer.Rule == nil || !slices.Equal(replacer.Rule.Replaces, []string{"eu_user"}) || len(replacer.Keys) != 1 {
		t.Errorf("replacing descriptor %+v", replacer)
	}

	// Alone, the rule is not replaced.
	resp = explainOK(t, svc, &rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*rlv3.RateLimitDescriptor{entriesOf("region", "eu", "user", "u1")}})
	if d := resp.Descriptors[0]; d.Result != ExplainMatched || d.ReplacedBy != "" {
		t.Errorf("descriptor alone %+v", d)
	}
}

func TestExplainOverride(t *testing.T) {
	svc := newExplainService(t, Options{})
	d := entriesOf("user_id", "42")
	d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_HOUR, UnitMultiplier: wrapperspb.UInt32(2)}
	d.HitsAddend = wrapperspb.UInt64(4)
	resp := explainOK(t, svc, &rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*rlv3.RateLimitDescriptor{d}})
	ed := resp.Descriptors[0]
	wantLimit := &ExplainLimit{RequestsPerUnit: 3, Unit: "HOUR", UnitMultiplier: 2, Algorithm: "fixed_window", Consistency: "exact", OverLimitHits: "drop"}
	if ed.Result != ExplainOverride || ed.Rule != nil || len(ed.Levels) != 0 || ed.Hits != 4 ||
		!reflect.DeepEqual(ed.Override, wantLimit) || !slices.Equal(ed.Keys, []string{"4:shop=7:user_id2:42|fixed_window/7200s"}) {
		t.Errorf("override %+v", ed)
	}
	if !containsInOrder(ed.Why, "the descriptor carries its own limit (3 per 2 hours (fixed_window)): it is counted under it, in a counter of its own, and the rules are not consulted") {
		t.Errorf("why:\n%s", strings.Join(ed.Why, "\n"))
	}
}

func TestExplainUnknownDomain(t *testing.T) {
	svc := newExplainService(t, Options{})
	d := entriesOf("user_id", "42")
	d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_HOUR}
	resp := explainOK(t, svc, &rlsv3.RateLimitRequest{Domain: "shops", Descriptors: []*rlv3.RateLimitDescriptor{entriesOf("user_id", "42"), d}})
	if resp.DomainKnown || resp.DomainFile != "" || resp.FailureMode != "" || resp.Domain != "shops" {
		t.Errorf("response %+v", resp)
	}
	for i, ed := range resp.Descriptors {
		if ed.Result != ExplainNoMatch || ed.NoMatchReason != "unknown_domain" || ed.Rule != nil || len(ed.Keys) != 0 || len(ed.Levels) != 0 {
			t.Errorf("descriptor %d: %+v", i, ed)
		}
		if !containsInOrder(ed.Why, `domain "shops" is not defined by any rule file (defined: "other", "shop"): the descriptor is answered OK without a limit and is not counted`) {
			t.Errorf("descriptor %d: why:\n%s", i, strings.Join(ed.Why, "\n"))
		}
	}
	if !containsInOrder(resp.Descriptors[1].Why, "domain", "its limit override does not apply either") {
		t.Errorf("why:\n%s", strings.Join(resp.Descriptors[1].Why, "\n"))
	}
}

func TestExplainFailureMode(t *testing.T) {
	for _, c := range []struct {
		server       config.FailureMode
		fallback     bool
		domain       string
		mode, source string
	}{
		{config.FailOpen, false, "shop", "closed", "domain"},
		{config.FailError, false, "other", "error", "server"},
		{config.FailLocal, true, "other", "local", "server"},
		{config.FailLocal, false, "other", "open", "server"}, // no fallback: local decides as open
	} {
		opts := Options{FailureMode: c.server}
		if c.fallback {
			opts.Fallback = forbiddenBackend{t}
		}
		svc := newExplainService(t, opts)
		resp := explainOK(t, svc, &rlsv3.RateLimitRequest{Domain: c.domain, Descriptors: []*rlv3.RateLimitDescriptor{entriesOf("k", "v")}})
		if resp.FailureMode != c.mode || resp.FailureModeFrom != c.source {
			t.Errorf("server %s (fallback %t), domain %s: failure mode %q from %q, want %q from %q",
				c.server, c.fallback, c.domain, resp.FailureMode, resp.FailureModeFrom, c.mode, c.source)
		}
	}
}

func TestExplainBadInput(t *testing.T) {
	svc := newExplainService(t, Options{Bounds: Bounds{MaxEntries: 2}})
	long := strings.Repeat("k", DefaultMaxKeyLen+1)
	for _, c := range []struct{ name, body, want string }{
		{"empty domain", `{"domain": "", "descriptors": [{"entries": [{"key": "user_id", "value": "1"}]}]}`, "domain: must not be empty"},
		{"no descriptors", `{"domain": "shop"}`, "descriptors: none given; a request carries 1 to 64"},
		{"too many entries", `{"domain": "shop", "descriptors": [{"entries": [{"key": "a"}, {"key": "b"}, {"key": "c"}]}]}`,
			"descriptors[0].entries: 3 given; at most 2 are accepted"},
		{"key too long", `{"domain": "shop", "descriptors": [{"entries": [{"key": "` + long + `"}]}]}`,
			"descriptors[0].entries[0].key: is 1025 bytes long; at most 1024 are accepted"},
		{"override with unit UNKNOWN", `{"domain": "shop", "descriptors": [{"entries": [{"key": "user_id", "value": "1"}], "limit": {"requestsPerUnit": 1, "unit": "UNKNOWN"}}]}`,
			"descriptors[0].limit.unit: is UNKNOWN; accepted"},
		{"malformed JSON", `{"domain": "shop", "descriptors": [`, "the body is not a RateLimitRequest in JSON"},
		{"unknown field", `{"domain": "shop", "descriptor": []}`, "the body is not a RateLimitRequest in JSON"},
		{"not JSON", `domain=shop`, "the body is not a RateLimitRequest in JSON"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, hdr, got := postExplain(t, svc, c.body)
			var e struct {
				Error string `json:"error"`
			}
			if code != http.StatusBadRequest || hdr.Get("Content-Type") != "application/json" ||
				json.Unmarshal([]byte(got), &e) != nil || !strings.HasPrefix(e.Error, c.want) {
				t.Errorf("%d %s %s, want 400 with an error starting %q", code, hdr.Get("Content-Type"), got, c.want)
			}
		})
	}

	t.Run("too large", func(t *testing.T) {
		body := `{"domain": "` + strings.Repeat("d", MaxJSONBody) + `"}`
		if code, _, got := postExplain(t, svc, body); code != http.StatusRequestEntityTooLarge {
			t.Errorf("%d %s, want 413", code, got)
		}
	})
}

// recordingBackend decides with a memory backend and records the keys it
// was asked about.
type recordingBackend struct {
	*memory.Backend
	mu   sync.Mutex
	keys []string
}

func (b *recordingBackend) Decide(ctx context.Context, reqs []algo.Request, out []algo.Decision) error {
	b.mu.Lock()
	for _, r := range reqs {
		b.keys = append(b.keys, printableKey(r.Key))
	}
	b.mu.Unlock()
	return b.Backend.Decide(ctx, reqs, out)
}

// TestExplainConsumesNothing explains a request many times, then decides
// it for real: the decision sees every limit whole, and the backend is
// asked about exactly the keys the explanation named.
func TestExplainConsumesNothing(t *testing.T) {
	clk := clocktest.New(start)
	mem := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { mem.Close() })
	be := &recordingBackend{Backend: mem}
	svc := newExplainServiceWith(t, be, Options{Observer: nopObserver{}})

	override := entriesOf("user_id", "7")
	override.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 4, Unit: typev3.RateLimitUnit_MINUTE}
	req := &rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*rlv3.RateLimitDescriptor{
		entriesOf("user_id", "42"),                     // 10 per minute
		entriesOf("user_id", "vip"),                    // shadow, 2 per minute
		entriesOf("path", "/files/a"),                  // shared, 5 per second
		entriesOf("tenant", "t", "plan", "free"),       // 1 per second and 100 per hour
		entriesOf("user_id", "admin"),                  // unlimited
		entriesOf("region", "eu", "user", "u"),         // replaced
		entriesOf("region", "eu-premium", "user", "u"), // 30 per second
		override,                  // 4 per minute
		entriesOf("color", "red"), // no match
	}}
	var explained *ExplainResponse
	for range 20 {
		explained = explainOK(t, svc, req)
	}
	if n := mem.Len(); n != 0 {
		t.Fatalf("explaining stored %d keys", n)
	}
	be.mu.Lock()
	if len(be.keys) != 0 {
		t.Fatalf("explaining asked the backend about %q", be.keys)
	}
	be.mu.Unlock()

	resp, err := svc.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	// One hit taken from each whole limit.
	want := []uint32{9, 1, 4, 0, 1<<32 - 1, 0, 29, 3, 0}
	for i, st := range resp.Statuses {
		if st.Code != rlsv3.RateLimitResponse_OK || st.LimitRemaining != want[i] {
			t.Errorf("descriptor %d (%s): %v remaining %d, want OK %d", i, explained.Descriptors[i].Result, st.Code, st.LimitRemaining, want[i])
		}
	}
	var keys []string
	for _, d := range explained.Descriptors {
		keys = append(keys, d.Keys...)
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	if !slices.Equal(be.keys, keys) {
		t.Errorf("the decision used keys\n%q\nthe explanation named\n%q", be.keys, keys)
	}
}

type nopObserver struct{}

func (nopObserver) Decided(string, *config.Rule, *rlv3.RateLimitDescriptor, Outcome, uint64) {}
func (nopObserver) BackendCall(time.Duration, error)                                         {}
func (nopObserver) FailureMode(string, config.FailureMode)                                   {}

func TestExplainHits(t *testing.T) {
	svc := newExplainService(t, Options{})
	d := entriesOf("user_id", "1")
	d.HitsAddend = wrapperspb.UInt64(0)
	resp := explainOK(t, svc, &rlsv3.RateLimitRequest{Domain: "shop", HitsAddend: 3, Descriptors: []*rlv3.RateLimitDescriptor{entriesOf("user_id", "1"), d}})
	if resp.Descriptors[0].Hits != 3 || resp.Descriptors[1].Hits != 0 {
		t.Errorf("hits %d and %d, want 3 and 0", resp.Descriptors[0].Hits, resp.Descriptors[1].Hits)
	}
}

func TestPrintableKey(t *testing.T) {
	for in, want := range map[string]string{
		"4:shop=1:k1:v|fixed_window/1s":     "4:shop=1:k1:v|fixed_window/1s",
		"4:shop=1:k5:héllo|fixed_window/1s": "4:shop=1:k5:héllo|fixed_window/1s",
		"4:shop=1:k1:\xff|fixed_window/1s":  `"4:shop=1:k1:\xff|fixed_window/1s"`,
		"4:shop=1:k1:\n|fixed_window/1s":    `"4:shop=1:k1:\n|fixed_window/1s"`,
	} {
		if got := printableKey([]byte(in)); got != want {
			t.Errorf("printableKey(%q) = %s, want %s", in, got, want)
		}
	}
}
