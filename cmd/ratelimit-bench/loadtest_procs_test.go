package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

func TestShellJoin(t *testing.T) {
	got := shellJoin([]string{"redis-benchmark", "-p", "6379", "", "it's", "k:__rand_int__"})
	if want := `redis-benchmark -p 6379 '' 'it'\''s' k:__rand_int__`; got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
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
	ch, addr, err := lt.startRedis(ctx, here)
	if err != nil {
		t.Fatal(err)
	}
	rdb := goredis.NewClient(&goredis.Options{Addr: addr, Protocol: 2, DisableIdentity: true})
	defer rdb.Close()
	checked := 0
	for _, via := range []string{viaScript, viaFunction, viaBare} {
		call, keys, _, err := lt.prepareCall(ctx, rdb, via)
		if errors.Is(err, errNoFunctions) {
			t.Logf("%s: %v", via, err)
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", via, err)
		}
		command := via
		if via == viaBare {
			// The floor is a function of its own, called as the decision
			// function is.
			command = viaFunction
		}
		if len(call) != 2 || !strings.EqualFold(call[0], command) || len(keys) != 2 {
			t.Fatalf("%s: call %q, keys %q", via, call, keys)
		}
		if n, err := rdb.DBSize(ctx).Result(); err != nil || n != 0 {
			t.Fatalf("%s: the check call left %d keys (%v)", via, n, err)
		}
		checked++
	}
	// Each prepareCall made one decision call: the count the load test
	// reads to report decisions per Redis call sees exactly those.
	if n, err := decisionCalls(ctx, rdb); err != nil || n != uint64(checked) {
		t.Fatalf("decision calls %d (%v), want %d: one per prepareCall", n, err, checked)
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
