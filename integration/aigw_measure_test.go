package integration

import (
	"os"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/aigwsim"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
)

// TestAIGatewayMeasure runs issue 31's scenario at its own scale, windows
// of a minute, three of them, against two replicas of each server on one
// Redis: ratelimitd counting after the fact (over_limit_hits: count),
// ratelimitd reserving (-reserve auto) and, with ANCHOR_BIN naming an
// envoyproxy/ratelimit binary built from source, the reference. It logs
// each measurement: docs/ai-gateway.md's table comes from it. About four
// minutes a server, so it runs only when asked:
//
//	AIGW_MEASURE=1 ANCHOR_BIN=/path/to/ratelimit go test ./integration -run TestAIGatewayMeasure -v -timeout 30m
func TestAIGatewayMeasure(t *testing.T) {
	if os.Getenv("AIGW_MEASURE") == "" {
		t.Skip("SKIPPED: a measurement of about four minutes a server; set AIGW_MEASURE=1 (and ANCHOR_BIN for the reference)")
	}
	sc := aigwScenario{window: time.Minute, full: 3}
	if bin := os.Getenv("ANCHOR_BIN"); bin != "" {
		t.Run("reference", func(t *testing.T) { report(t, sc.runReference(t, bin)) })
	}
	t.Run("count", func(t *testing.T) { report(t, sc.runRatelimitd(t)) })
	t.Run("reserve", func(t *testing.T) { report(t, sc.runRatelimitd(t, "-reserve", "auto")) })
}

// report logs a measurement.
func report(t *testing.T, rep aigwsim.Report) {
	t.Helper()
	t.Logf("measured: charged max %.3f, min utilisation %.3f, mean %.3f; admitted max %.3f, min %.3f",
		rep.MaxRatio, rep.MinUtilisation, rep.MeanUtilisation, rep.MaxAdmittedRatio, rep.MinAdmittedUtilisation)
}

// runReference runs the scenario against two envoyproxy/ratelimit
// processes of binary bin on one Redis, reading the scenario's rule (the
// reference counts every hit it is sent, over_limit_hits: count).
func (sc aigwScenario) runReference(t *testing.T, bin string) aigwsim.Report {
	t.Helper()
	redis := redistest.StartNode(t)
	root := runtimeRoot(t, map[string]string{"ai-gateway-quota.yaml": sc.rules("")})
	var replicas []rlsv3.RateLimitServiceClient
	for range 2 {
		replicas = append(replicas, startReference(t, bin, root, redis.Addr, "LOG_LEVEL=warn"))
	}
	return sc.run(t, "envoyproxy/ratelimit "+bin, replicas)
}
