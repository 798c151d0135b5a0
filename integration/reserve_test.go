package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/xdstest"
)

// aiGatewayQuota is a rule as Envoy AI Gateway's translator serves it over
// xDS for a QuotaPolicy of limit tokens per hour on a backend and model
// (internal/ratelimit/translator/translator.go, BuildRateLimitConfigs, at
// envoyproxy/ai-gateway c217da8a): domain ai-gateway-quota, backend_name,
// then model_name_override holding the fixed window.
func aiGatewayQuota(limit uint32) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{Name: "ai-gateway-quota", Domain: "ai-gateway-quota", Descriptors: []*rlsconfv3.RateLimitDescriptor{{
		Key: "backend_name", Value: "default/llm",
		Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key: "model_name_override", Value: "gpt",
			RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_HOUR, RequestsPerUnit: limit},
		}},
	}}}
}

// aiGatewayDescriptor is the descriptor of Envoy's calls for that route:
// at request time the generic keys of enableQuotaRateLimitOnRoute's
// requestTimeBaseActions, no hits_addend (cost nil); at stream done the
// same keys from dynamic metadata, with quota_cost as the hits_addend
// (internal/extensionserver/quota_ratelimit.go).
func aiGatewayDescriptor(cost *wrapperspb.UInt64Value) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "ai-gateway-quota", Descriptors: []*rlv3.RateLimitDescriptor{{
		Entries:    []*rlv3.RateLimitDescriptor_Entry{{Key: "backend_name", Value: "default/llm"}, {Key: "model_name_override", Value: "gpt"}},
		HitsAddend: cost,
	}}}
}

// TestAIGatewayReserveCompat: the binary as Envoy Gateway runs the
// reference's container (/bin/ratelimit, rules over xDS, a real Redis)
// with one more variable, RATELIMITD_RESERVE=auto: request-time calls hold
// reservations (cold: a sixteenth of the limit each), so the 16th stream
// in flight is refused, and a stream-done call charges its cost and frees
// the rest of its reservation. Without the variable, answers stay the
// reference's: every call counts one hit and passes.
func TestAIGatewayReserveCompat(t *testing.T) {
	t.Parallel()
	for _, reserve := range []string{"auto", ""} {
		t.Run("RATELIMITD_RESERVE="+reserve, func(t *testing.T) {
			cp := xdstest.Start(t, nil)
			redis := redistest.Start(t)
			cmd := exec.Command(asReference(t))
			dir := t.TempDir()
			if err := os.MkdirAll(filepath.Join(dir, "data", "ratelimit"), 0o755); err != nil {
				t.Fatal(err)
			}
			cmd.Env = []string{
				"PATH=" + os.Getenv("PATH"), "LOG_LEVEL=info",
				"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redis.Addr,
				"RUNTIME_ROOT=" + filepath.Join(dir, "data"), "RUNTIME_SUBDIRECTORY=ratelimit",
				"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + cp.Addr, "CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit",
				"HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0",
			}
			if reserve != "" {
				cmd.Env = append(cmd.Env, "RATELIMITD_RESERVE="+reserve)
			}
			cp.Set(t, "envoy-ratelimit", "v1", aiGatewayQuota(1000))
			s := startProcess(t, cmd)
			rls := rlsv3.NewRateLimitServiceClient(s.dial(t))
			call := func(cost *wrapperspb.UInt64Value) *rlsv3.RateLimitResponse_DescriptorStatus {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				resp, err := rls.ShouldRateLimit(ctx, aiGatewayDescriptor(cost))
				if err != nil {
					t.Fatal(err)
				}
				return resp.Statuses[0]
			}
			eventually(t, "the rule in force", func() bool { return call(wrapperspb.UInt64(0)).GetCurrentLimit() != nil })
			var admitted int
			for range 20 {
				if call(nil).Code == rlsv3.RateLimitResponse_OK {
					admitted++
				}
			}
			if reserve == "" {
				if admitted != 20 {
					t.Fatalf("without RATELIMITD_RESERVE: %d of 20 request-time calls admitted, want 20, as the reference", admitted)
				}
				return
			}
			// 1,000 / 16 = 63 each: 15 fit (945), the 16th does not.
			if admitted != 15 {
				t.Fatalf("%d of 20 streams admitted, want 15 (63 tokens held each)", admitted)
			}
			if st := call(wrapperspb.UInt64(40)); st.Code != rlsv3.RateLimitResponse_OK || st.LimitRemaining != 1000-40-14*63 {
				t.Fatalf("stream done: %v, %d remaining; want OK, %d", st.Code, st.LimitRemaining, 1000-40-14*63)
			}
			if st := call(nil); st.Code != rlsv3.RateLimitResponse_OK {
				t.Fatalf("a stream after one settled: %v, want OK", st.Code)
			}
		})
	}
}
