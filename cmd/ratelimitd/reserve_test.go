package main

import (
	"bytes"
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestServeReserve: -reserve auto makes a fixed window whose rule does not
// set reserve hold a reservation at each request-time call, and
// /metrics shows what it learnt and the settles it saw.
func TestServeReserve(t *testing.T) {
	dir := t.TempDir()
	rules := "domain: ai-gateway-quota\ndescriptors:\n  - key: backend_name\n    value: default/llm\n    rate_limit: {requests_per_unit: 1600, unit: hour}\n"
	if err := os.WriteFile(filepath.Join(dir, "quota.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startServe(t, true, "-config", dir, "-reserve", "auto")
	rls := p.rls(t)
	call := func(cost *wrapperspb.UInt64Value) uint32 {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "ai-gateway-quota", Descriptors: []*rlv3.RateLimitDescriptor{{
			Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "backend_name", Value: "default/llm"}}, HitsAddend: cost}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Statuses[0].LimitRemaining
	}
	// Cold: a sixteenth of 1,600 held; then 40 charged, 100 released.
	if got := call(nil); got != 1500 {
		t.Fatalf("request-time call: %d remaining, want 1,500 (100 held)", got)
	}
	if got := call(wrapperspb.UInt64(40)); got != 1560 {
		t.Fatalf("stream-done call: %d remaining, want 1,560 (40 charged, the reservation released)", got)
	}
	m := p.get(t, "/metrics")
	for _, want := range []string{
		`ratelimitd_reserve_hits{domain="ai-gateway-quota",limit="0",rule="ai-gateway-quota.backend_name_default/llm"} 100`,
		`ratelimitd_reserve_ttl_seconds{domain="ai-gateway-quota",limit="0",rule="ai-gateway-quota.backend_name_default/llm"} 30`,
		`ratelimitd_reserve_settles_total{domain="ai-gateway-quota",limit="0",released="true",rule="ai-gateway-quota.backend_name_default/llm"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, grepLines(m, "ratelimitd_reserve_"))
		}
	}
}

// TestCompatReserve: under the reference's entry point,
// RATELIMITD_RESERVE sets -reserve, which none of the reference's settings
// do: an AI Gateway deployment switches by image and one variable. Without
// it, reservations are off and answers stay the reference's.
func TestCompatReserve(t *testing.T) {
	base := env{"RATELIMITD_COMPAT": "envoyproxy", "CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": "xds:18000"}
	for _, c := range []struct {
		reserve, want string
	}{{"", "reserve=off"}, {"auto", "reserve=auto"}} {
		e := maps.Clone(base)
		if c.reserve != "" {
			e["RATELIMITD_RESERVE"] = c.reserve
		}
		var stderr bytes.Buffer
		values, code := configuredFlags(nil, e.lookup, &stderr)
		if code != exitOK || !slices.Contains(values, c.want) || !slices.Contains(values, "over-limit-hits=count") {
			t.Errorf("RATELIMITD_RESERVE=%q: exit %d, want %s beside the reference's over-limit-hits=count; %s", c.reserve, code, c.want, stderr.String())
		}
	}
}
