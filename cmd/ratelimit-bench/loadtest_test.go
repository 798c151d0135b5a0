package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

func TestScriptCallFollowsTheRules(t *testing.T) {
	// examples/api.yaml limits user_id twice (per second and per hour):
	// one decision is a script call over two keys.
	lt := &loadtest{cfg: &loadtestConfig{Config: "../../examples", Domain: "api", Key: "user_id"}}
	keys, argv, err := lt.scriptCall()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || !strings.Contains(keys[0], "__rand_int__") || keys[0] == keys[1] {
		t.Fatalf("keys %q: want two distinct randomized keys", keys)
	}
	if want := 2 + algo.ScriptArgsPerRequest*len(keys); len(argv) != want {
		t.Fatalf("%d ARGV for %d keys, want %d: %q", len(argv), len(keys), want, argv)
	}
	if argv[0] != "" {
		t.Errorf("ARGV[1] = %q: want the Redis clock (empty)", argv[0])
	}
	lt.cfg.Domain = "nope"
	if _, _, err := lt.scriptCall(); err == nil {
		t.Error("an unknown domain gave a script call")
	}
}

func TestParseBenchmarkCSV(t *testing.T) {
	out := `"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
"EVALSHA x 1 k:__rand_int__  0","90909.09","0.041","0.016","0.039","0.079","0.111","0.287"
`
	r, err := parseBenchmarkCSV([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	if r.rps != 90909.09 || r.p50 != 39 || r.p99 != 111 {
		t.Fatalf("%+v", r)
	}
	// An older redis-benchmark prints only the rate.
	r, err = parseBenchmarkCSV([]byte("\"test\",\"rps\"\n\"EVALSHA\",\"1000.00\"\n"))
	if err != nil || r.rps != 1000 || r.p50 >= 0 || r.p99 >= 0 {
		t.Fatalf("%+v, %v", r, err)
	}
	if _, err := parseBenchmarkCSV([]byte("ERR unknown command\n")); err == nil {
		t.Fatal("an error message parsed")
	}
}

func TestShellJoin(t *testing.T) {
	got := shellJoin([]string{"redis-benchmark", "-p", "6379", "", "it's", "k:__rand_int__"})
	if want := `redis-benchmark -p 6379 '' 'it'\''s' k:__rand_int__`; got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

func TestWriteTable(t *testing.T) {
	var b bytes.Buffer
	writeTable(&b, []scenario{
		{Name: "a", DecisionsPerS: 12345.6, P50: 95, P99: 1500, P999: 2_500_000, ServerCPU: 12.34, RedisCPU: -1, BenchCPU: 3, Notes: []string{"n"}},
	})
	want := "| a | 12,346 | 95.0µs | 1.50ms | 2.50s | 12.3 | – | 3.0 |\n"
	if !strings.Contains(b.String(), want) || !strings.Contains(b.String(), "- a: n\n") {
		t.Fatalf("table:\n%s\nwant the row %q", b.String(), want)
	}
}

// TestRedisStartsAndStops starts redis-server as the load test does,
// checks that the decision script takes the benchmark's arguments, and
// that stopping leaves no process behind.
func TestRedisStartsAndStops(t *testing.T) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is not in PATH")
		}
		t.Skip("redis-server is not in PATH (Debian: apt-get install redis-server)")
	}
	lt := &loadtest{
		cfg: &loadtestConfig{RedisServer: bin, Config: "../../examples", Domain: "api", Key: "user_id"},
		log: &bytes.Buffer{}, dir: t.TempDir(),
	}
	defer lt.stopAll()
	ctx := context.Background()
	ch, addr, err := lt.startRedis(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rdb := goredis.NewClient(&goredis.Options{Addr: addr, Protocol: 2, DisableIdentity: true})
	defer rdb.Close()
	for _, via := range []string{viaScript, viaFunction} {
		call, keys, _, err := lt.prepareCall(ctx, rdb, via)
		if errors.Is(err, errNoFunctions) {
			t.Logf("%s: %v", via, err)
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", via, err)
		}
		if len(call) != 2 || !strings.EqualFold(call[0], via) || len(keys) != 2 {
			t.Fatalf("%s: call %q, keys %q", via, call, keys)
		}
		if n, err := rdb.DBSize(ctx).Result(); err != nil || n != 0 {
			t.Fatalf("%s: the check call left %d keys (%v)", via, n, err)
		}
	}
	lt.stopAll()
	select {
	case <-ch.done: // the process was waited for: it is gone
	case <-time.After(5 * time.Second):
		t.Fatal("redis-server still runs after stopAll")
	}
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		t.Fatal("Redis still listens after stopAll")
	}
}

// TestLoadtestRules loads the load test's own rules and checks the two
// domains limit user_id once and twice.
func TestLoadtestRules(t *testing.T) {
	dir := t.TempDir()
	for name, text := range loadtestRules("user_id") {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for domain, limits := range map[string]int{oneLimit: 1, twoLimits: 2} {
		lt := &loadtest{cfg: &loadtestConfig{Config: dir, Domain: domain, Key: "user_id"}}
		keys, _, err := lt.scriptCall()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) != limits {
			t.Errorf("domain %s: one decision reads %d keys, want %d", domain, len(keys), limits)
		}
	}
}
