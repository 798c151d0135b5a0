package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
)

// fillRedis sets maxmemory with the noeviction policy a little above what
// the server uses, and writes values until Redis answers OOM.
func fillRedis(t *testing.T, admin *goredis.Client) {
	t.Helper()
	ctx := context.Background()
	info, err := admin.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	var used int64
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			used, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if used == 0 {
		t.Fatalf("INFO memory has no used_memory:\n%s", info)
	}
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", strconv.FormatInt(used+1<<20, 10)}} {
		if err := admin.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	value := strings.Repeat("x", 32<<10)
	for i := 0; ; i++ {
		err := admin.Set(ctx, fmt.Sprintf("filler:%d", i), value, 0).Err()
		if err != nil && strings.HasPrefix(err.Error(), "OOM ") {
			return
		}
		if err != nil || i > 1000 {
			t.Fatalf("filling Redis: %v after %d values", err, i)
		}
	}
}

// TestRedisFullAtStart starts ratelimitd on a Redis at maxmemory with the
// noeviction policy, without and with the decision library already
// loaded: it serves (health SERVING, failure mode open answering every
// call), logs what Redis said (OOM), never a timeout, and once Redis takes
// writes again decides by Redis, with the library it loads then or the
// one it found.
func TestRedisFullAtStart(t *testing.T) {
	rules := writeExactRules(t)
	req := descriptorRequest("exact", "algorithm", "fixed_window")
	for _, loaded := range []bool{false, true} {
		t.Run(map[bool]string{false: "library absent", true: "library present"}[loaded], func(t *testing.T) {
			node := redistest.StartNode(t)
			admin := goredis.NewClient(&goredis.Options{Addr: node.Addr})
			defer admin.Close()
			args := append(redisArgs(t, "redis://"+node.Addr, "standalone", "-config", rules),
				"-failure-mode", "open", "-backend-timeout", "500ms", "-circuit-failures", "2", "-circuit-cooldown", "200ms")
			if loaded {
				first := startServer(t, args...)
				if resp := decide(t, rlsv3.NewRateLimitServiceClient(first.dial(t)), req); byFailureMode(resp) {
					t.Fatalf("a Redis with room: %v", resp)
				}
				if code := first.stop(t); code != 0 {
					t.Fatalf("first server exited %d", code)
				}
			}
			fillRedis(t, admin)
			loads := redistest.CommandCalls(t, admin, "function|load")

			srv := startServer(t, args...)
			conn := srv.dial(t)
			c := rlsv3.NewRateLimitServiceClient(conn)
			want := "backend refuses writes at start"
			if loaded {
				want = `"lua":"functions (FCALL)"`
			}
			if !strings.Contains(strings.Join(srv.logLines(), "\n"), want) {
				t.Errorf("the start-up log lacks %q", want)
			}
			for i := range 20 {
				if resp := decide(t, c, req); !byFailureMode(resp) {
					t.Fatalf("call %d to a full Redis: %v; want failure mode open's answer", i, resp)
				}
			}
			if got := httpStatus(t, "http://"+srv.httpAddr+"/healthcheck"); got != 200 {
				t.Errorf("/healthcheck with Redis full: %d, want 200 (the failure mode decides)", got)
			}
			hc, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
			if err != nil || hc.Status != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("gRPC health with Redis full: %v, %v; want SERVING", hc, err)
			}
			var failures []string
			for _, line := range srv.logLines() {
				if strings.Contains(line, "deciding by the failure mode") || strings.Contains(line, "circuit open") {
					failures = append(failures, line)
				}
			}
			joined := strings.Join(failures, "\n")
			if !strings.Contains(joined, "OOM command not allowed") || strings.Contains(joined, "did not answer within") {
				t.Errorf("the failures logged do not say what Redis said (OOM), or call it a timeout:\n%s", joined)
			}

			if err := admin.ConfigSet(context.Background(), "maxmemory", "0").Err(); err != nil {
				t.Fatal(err)
			}
			freed := time.Now()
			for {
				if resp := decide(t, c, req); !byFailureMode(resp) {
					break
				}
				if time.Since(freed) > 5*time.Second {
					t.Fatal("not decided by Redis within 5 s of it taking writes again")
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Logf("decided by Redis %v after it took writes again", time.Since(freed).Round(time.Millisecond))
			libs, err := admin.FunctionList(context.Background(), goredis.FunctionListQuery{LibraryNamePattern: "ratelimitd_*"}).Result()
			if err != nil || len(libs) != 1 {
				t.Errorf("decision libraries: %v, %v; want one", libs, err)
			}
			wantLoads := loads + 1 // loaded now
			if loaded {
				wantLoads = loads // the one found
			}
			if got := redistest.CommandCalls(t, admin, "function|load"); got != wantLoads {
				t.Errorf("FUNCTION LOAD ran %d times since Redis was full, want %d", got-loads, wantLoads-loads)
			}
		})
	}
}
