package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimitd/ratelimitd/internal/aigwsim"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/refproc"
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
	root := t.TempDir()
	dir := refproc.ConfigDir(root)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ai-gateway-quota.yaml"), []byte(sc.rules("")), 0o644); err != nil {
		t.Fatal(err)
	}
	var replicas []rlsv3.RateLimitServiceClient
	for range 2 {
		httpPort, grpcPort, debugPort := freePort(t), freePort(t), freePort(t)
		var logs bytes.Buffer
		cmd := exec.Command(bin)
		cmd.Env = refproc.Env(refproc.Settings{
			Root: root, Redis: redis.Addr, HTTPPort: atoi(t, httpPort), GRPCPort: atoi(t, grpcPort), Debug: atoi(t, debugPort),
		})
		cmd.Stdout, cmd.Stderr = &logs, &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		var waitErr error
		go func() { waitErr = cmd.Wait(); close(exited) }()
		t.Cleanup(func() {
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				cmd.Process.Kill()
				<-exited
			}
		})
		waitHealthy(t, "http://127.0.0.1:"+httpPort+"/healthcheck", exited, func() error { return waitErr })
		conn, err := grpc.NewClient("127.0.0.1:"+grpcPort, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		replicas = append(replicas, rlsv3.NewRateLimitServiceClient(conn))
	}
	return sc.run(t, "envoyproxy/ratelimit "+bin, replicas)
}
