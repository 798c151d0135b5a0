package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
)

// tokenRules is a rule file in the shape Envoy Gateway generates for a
// BackendTrafficPolicy rule with a client selector on a distinct header
// and a response cost (internal/xds/translator/testdata/out/ratelimit-config/
// distinct-match.yaml, at envoyproxy/gateway d32f282): the route's
// descriptor, then the header's, holding the limit. The intermediate
// level's rate_limit: null and the top-level name: are left out here.
// over is the rate_limit's over_limit_hits line, empty for none.
func tokenRules(over string) string {
	return `domain: default/ai-gateway/http
descriptors:
  - key: httproute/default/llm/rule/0/match/0/llm-example-com
    value: httproute/default/llm/rule/0/match/0/llm-example-com
    descriptors:
      - key: rule-0-match-0
        value: ""
        rate_limit:
          requests_per_unit: 1000
          unit: MINUTE
          unlimited: false
          name: ""
          replaces: []
` + over + `        descriptors: []
        shadow_mode: false
        quota_mode: false
        detailed_metric: false
        value_to_metric: false
        share_threshold: false
    shadow_mode: false
    quota_mode: false
    detailed_metric: false
    value_to_metric: false
    share_threshold: false
`
}

// tokenCall sends the descriptor Envoy builds for user's request on the
// route: the route's generic key, then the x-user-id header's value, with
// hits as the descriptor's hits_addend (Envoy Gateway's cost).
func tokenCall(t *testing.T, c rlsv3.RateLimitServiceClient, user string, hits uint64) *rlsv3.RateLimitResponse_DescriptorStatus {
	t.Helper()
	route := "httproute/default/llm/rule/0/match/0/llm-example-com"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "default/ai-gateway/http", Descriptors: []*rlv3.RateLimitDescriptor{{
		Entries:    []*rlv3.RateLimitDescriptor_Entry{{Key: route, Value: route}, {Key: "rule-0-match-0", Value: user}},
		HitsAddend: wrapperspb.UInt64(hits),
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.OverallCode != resp.Statuses[0].Code {
		t.Fatalf("overall %v, descriptor %v", resp.OverallCode, resp.Statuses[0].Code)
	}
	return resp.Statuses[0]
}

// TestTokenCosts runs the token-limit pattern of Envoy AI Gateway and
// Envoy Gateway's response cost end to end, on the real binary and a real
// Redis: Envoy checks each request before it is sent upstream with a cost
// of 0 (BackendTrafficPolicy cost.request number 0), then, once the
// response is done, reports the tokens it used on the same descriptor
// (cost.response from metadata: a rate limit with apply_on_stream_done
// and hits_addend), whose answer it ignores. In compatibility mode, as
// Envoy Gateway runs ratelimitd, the reported cost is counted even when
// it exceeds what remains, and the next request is refused; issue 27's
// calls (800, 1, 900, 1, 900 under 1,000 per minute) get the reference's
// answers. Natively, a rule says over_limit_hits: count for the same
// answers; without it the refused cost counts nothing.
func TestTokenCosts(t *testing.T) {
	t.Parallel()
	type call struct {
		hits      uint64
		code      rlsv3.RateLimitResponse_Code
		remaining uint32
	}
	const ok, over = rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	counted := []call{{800, ok, 200}, {1, ok, 199}, {900, over, 0}, {1, over, 0}, {900, over, 0}, {0, over, 0}}
	dropped := []call{{800, ok, 200}, {1, ok, 199}, {900, over, 199}, {1, ok, 198}, {900, over, 198}, {0, ok, 198}}
	for _, c := range []struct {
		name   string
		compat bool
		over   string
		want   []call
		cost   bool // the stream-done cost past what remains is counted
	}{
		{"compatibility mode", true, "", counted, true},
		{"native, rule says count", false, "          over_limit_hits: count\n", counted, true},
		{"native default", false, "", dropped, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			redis := redistest.Start(t)
			admin := goredis.NewClient(&goredis.Options{Addr: redis.Addr})
			t.Cleanup(func() { admin.Close() })
			root := t.TempDir()
			dir := filepath.Join(root, "ratelimit", "config")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "ai.yaml"), []byte(tokenRules(c.over)), 0o644); err != nil {
				t.Fatal(err)
			}
			var s *server
			if c.compat {
				cmd := exec.Command(asReference(t))
				cmd.Env = referenceEnv(root, redis.Addr)
				s = startProcess(t, cmd)
			} else {
				s = startServer(t, redisArgs(t, redis.URL, "standalone", "-config", dir)...)
			}
			rls := rlsv3.NewRateLimitServiceClient(s.dial(t))
			if left := time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)); left < 10*time.Second {
				time.Sleep(left + 100*time.Millisecond)
			}

			// Issue 27's table.
			for i, w := range c.want {
				st := tokenCall(t, rls, "alice", w.hits)
				if st.Code != w.code || st.LimitRemaining != w.remaining {
					t.Fatalf("call %d (%d tokens): %v with %d remaining; want %v with %d", i, w.hits, st.Code, st.LimitRemaining, w.code, w.remaining)
				}
			}

			// The pattern: a request-time check, then a stream-done cost
			// larger than what remains.
			if st := tokenCall(t, rls, "bob", 0); st.Code != ok || st.LimitRemaining != 1000 {
				t.Fatalf("bob's first check: %v with %d remaining", st.Code, st.LimitRemaining)
			}
			if st := tokenCall(t, rls, "bob", 1200); st.Code != over {
				t.Fatalf("bob's stream-done cost of 1200: %v, want OVER_LIMIT (Envoy ignores it)", st.Code)
			}
			next := tokenCall(t, rls, "bob", 0)
			if c.cost && next.Code != over || !c.cost && (next.Code != ok || next.LimitRemaining != 1000) {
				t.Fatalf("bob's next check: %v with %d remaining; want refused %v", next.Code, next.LimitRemaining, c.cost)
			}
			if c.compat {
				// Counted in the reference's key, where reference pods read it.
				k := "default/ai-gateway/http_httproute/default/llm/rule/0/match/0/llm-example-com_httproute/default/llm/rule/0/match/0/llm-example-com_rule-0-match-0_bob_" +
					strconv.FormatInt(time.Now().Unix()/60*60, 10)
				if n, err := admin.Get(context.Background(), k).Int(); err != nil || n != 1200 {
					t.Fatalf("GET %s = %d, %v; want the 1200 tokens counted", k, n, err)
				}
			}
		})
	}
}
