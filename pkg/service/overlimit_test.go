package service

import (
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/wrapperspb"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// tokenRules limit an AI gateway's tokens per user: 1,000 a minute, with
// over_limit_hits as the case says (nothing: the server's default).
func tokenRules(overLimitHits string) string {
	field := ""
	if overLimitHits != "" {
		field = ", over_limit_hits: " + overLimitHits
	}
	return `
domain: ai
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000` + field + `}
  - key: model
    rate_limit: {unit: minute, requests_per_unit: 5000` + field + `}
`
}

// tokenCall is one call of issue 27's table: hits tokens of user u, and
// the answer wanted.
type tokenCall struct {
	hits      uint64
	code      rlsv3.RateLimitResponse_Code
	remaining uint32
}

// dropTable is what ratelimitd answered to issue 27's calls with
// over_limit_hits: drop: the two calls of 900 are refused and counted for
// nothing, so 2,600 tokens pass under a limit of 1,000 and the calls
// after them are admitted, the last a request-time check of zero tokens
// (AI Gateway's request cost).
var dropTable = []tokenCall{{800, ok, 200}, {1, ok, 199}, {900, over, 199}, {1, ok, 198}, {900, over, 198}, {0, ok, 198}}

// countTable is the same calls with over_limit_hits: count: the first 900
// is counted (1,701 of 1,000), and every call after it is refused, the
// check of zero tokens too, as envoyproxy/ratelimit answers (fixture
// testdata/reference/costs.json).
var countTable = []tokenCall{{800, ok, 200}, {1, ok, 199}, {900, over, 0}, {1, over, 0}, {900, over, 0}, {0, over, 0}}

// TestTokenCostsTable replays issue 27's calls (800, 1, 900, 1, 900 under
// 1,000 per minute) with the server's default and the rule's field in
// both orders, on the memory backend and on Redis.
func TestTokenCostsTable(t *testing.T) {
	cases := []struct {
		name   string
		server config.OverLimitHits
		field  string
		want   []tokenCall
	}{
		{"native default drops", config.OverLimitDefault, "", dropTable},
		{"server count", config.OverLimitCount, "", countTable},
		{"rule count under a dropping server", config.OverLimitDrop, "count", countTable},
		{"rule drop under a counting server", config.OverLimitCount, "drop", dropTable},
	}
	for _, backend := range []string{"memory", "redis"} {
		for _, c := range cases {
			t.Run(backend+"/"+c.name, func(t *testing.T) {
				f := costFixture(t, backend, tokenRules(c.field), Options{OverLimitHits: c.server})
				u := desc("user", "u1")
				for i, call := range c.want {
					f.clock.Advance(time.Second)
					u.HitsAddend = wrapperspb.UInt64(call.hits)
					s := f.call(t, request("ai", u)).Statuses[0]
					if s.Code != call.code || s.LimitRemaining != call.remaining {
						t.Fatalf("call %d (%d tokens): %v with %d remaining; want %v with %d", i, call.hits, s.Code, s.LimitRemaining, call.code, call.remaining)
					}
				}
			})
		}
	}
}

// costFixture is newFixtureOpts on the named backend: memory, or a real
// Redis deciding by the test's clock.
func costFixture(t *testing.T, backend, rules string, opts Options) *fixture {
	t.Helper()
	clk := clocktest.New(start)
	opts.Now = clk.Now
	var be algo.Backend
	switch backend {
	case "memory":
		m := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
		t.Cleanup(func() { m.Close() })
		be = m
	case "redis":
		srv := redistest.Start(t)
		rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
		t.Cleanup(func() { rdb.Close() })
		be = redis.New(rdb, redis.Options{Prefix: fmt.Sprintf("cost%d:", time.Now().UnixNano()), Now: clk.Now})
	}
	return newFixtureOpts(t, rules, be, clk, opts)
}

// TestCountEveryDescriptor decides a call of two descriptors, one of them
// over its limit: with count both are counted, as envoyproxy/ratelimit
// counts every descriptor of a call; with drop neither is.
func TestCountEveryDescriptor(t *testing.T) {
	for _, c := range []struct {
		server    config.OverLimitHits
		userLeft  uint32
		modelLeft uint32
	}{
		{config.OverLimitDrop, 100, 4100},
		{config.OverLimitCount, 0, 3600},
	} {
		t.Run(c.server.String(), func(t *testing.T) {
			f := costFixture(t, "memory", tokenRules(""), Options{OverLimitHits: c.server})
			user, model := desc("user", "u1"), desc("model", "m1")
			user.HitsAddend, model.HitsAddend = wrapperspb.UInt64(900), wrapperspb.UInt64(900)
			if resp := f.call(t, request("ai", user, model)); resp.OverallCode != ok {
				t.Fatalf("first call: %v", resp.OverallCode)
			}
			user.HitsAddend, model.HitsAddend = wrapperspb.UInt64(500), wrapperspb.UInt64(500)
			resp := f.call(t, request("ai", user, model))
			if resp.OverallCode != over || resp.Statuses[0].Code != over || resp.Statuses[1].Code != ok {
				t.Fatalf("500 tokens with 100 left for the user: %v, %v, %v; want OVER_LIMIT, OVER_LIMIT, OK",
					resp.OverallCode, resp.Statuses[0].Code, resp.Statuses[1].Code)
			}
			user.HitsAddend, model.HitsAddend = wrapperspb.UInt64(0), wrapperspb.UInt64(0)
			resp = f.call(t, request("ai", user, model))
			if got := [2]uint32{resp.Statuses[0].LimitRemaining, resp.Statuses[1].LimitRemaining}; got != [2]uint32{c.userLeft, c.modelLeft} {
				t.Errorf("left for user and model: %v, want [%d %d]", got, c.userLeft, c.modelLeft)
			}
		})
	}
}

// TestOverrideCountsByServerDefault decides a descriptor carrying its own
// limit (an override, with no rule to say): the server's over_limit_hits
// decides what becomes of its refused hits.
func TestOverrideCountsByServerDefault(t *testing.T) {
	for _, c := range []struct {
		server config.OverLimitHits
		left   uint32
	}{{config.OverLimitDrop, 2}, {config.OverLimitCount, 0}} {
		t.Run(c.server.String(), func(t *testing.T) {
			f := costFixture(t, "memory", tokenRules(""), Options{OverLimitHits: c.server})
			d := desc("tenant", "t1")
			d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 10, Unit: typev3.RateLimitUnit_MINUTE}
			d.HitsAddend = wrapperspb.UInt64(8)
			f.call(t, request("ai", d))
			d.HitsAddend = wrapperspb.UInt64(5)
			if s := f.call(t, request("ai", d)).Statuses[0]; s.Code != over {
				t.Fatalf("5 with 2 left: %v", s.Code)
			}
			d.HitsAddend = wrapperspb.UInt64(0)
			if s := f.call(t, request("ai", d)).Statuses[0]; s.LimitRemaining != c.left {
				t.Errorf("left %d, want %d", s.LimitRemaining, c.left)
			}
		})
	}
}

// TestOverLimitHitsShown lists the limits whose hits count in /rlconfig,
// with the server's default for those that do not say, and in explain.
func TestOverLimitHitsShown(t *testing.T) {
	rules := `
domain: ai
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: model
    rate_limit: {unit: minute, requests_per_unit: 5000, over_limit_hits: drop}
`
	for _, c := range []struct {
		server     config.OverLimitHits
		user, mode string
	}{{config.OverLimitDefault, "", "drop"}, {config.OverLimitCount, ", over_limit_hits: count", "count"}} {
		f := costFixture(t, "memory", rules, Options{OverLimitHits: c.server})
		rec := httptest.NewRecorder()
		f.svc.serveRLConfig(rec, httptest.NewRequest("GET", "/rlconfig", nil))
		body, _ := io.ReadAll(rec.Result().Body)
		lines := strings.Split(string(body), "\n")
		var user, model string
		for _, l := range lines {
			switch {
			case strings.HasPrefix(l, "ai.user:"):
				user = l
			case strings.HasPrefix(l, "ai.model:"):
				model = l
			}
		}
		if !strings.Contains(user, "algorithm: fixed_window"+c.user+" (") || strings.Contains(model, "over_limit_hits") {
			t.Errorf("server %q: /rlconfig lines\n%s\n%s", c.server, user, model)
		}
		er := ruleExplained(f.svc.Rules().Domain("ai").Rule("ai.user"), f.svc.overLimit)
		if er.Limits[0].OverLimitHits != c.mode {
			t.Errorf("server %q: explain says %q, want %q", c.server, er.Limits[0].OverLimitHits, c.mode)
		}
	}
}
