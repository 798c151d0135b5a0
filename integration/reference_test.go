package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
)

// TestMixedFleetProcess runs ratelimitd with -redis-key-format reference
// beside a "reference pod" that counts as envoyproxy/ratelimit does
// (INCRBY and EXPIRE on CACHE_KEY_PREFIX + domain_key_value_windowStart,
// the window from its own clock, here the same machine's): the server
// counts on from the reference's count, the reference reads the server's
// count back, and the start-up log says what the layout costs and how to
// leave it.
func TestMixedFleetProcess(t *testing.T) {
	srv := redistest.Start(t)
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()

	dir := t.TempDir()
	rules := "domain: mixed\ndescriptors:\n" +
		"  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n" +
		"  - key: bucket\n    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: token_bucket}\n"
	if err := os.WriteFile(filepath.Join(dir, "mixed.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	// The reference's default CACHE_KEY_PREFIX is empty: so is ours here.
	s := startServer(t, redisArgs(t, srv.URL, "standalone", "-config", dir, "-redis-prefix", "",
		"-redis-key-format", "reference", "-redis-expiration-jitter", "300s")...)
	c := rlsv3.NewRateLimitServiceClient(s.dial(t))

	// Both sides name the window by the machine's clock: stay away from
	// the hour's end, where they might name two.
	if left := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)); left < 10*time.Second {
		time.Sleep(left + time.Second)
	}
	user := fmt.Sprintf("u%d", time.Now().UnixNano())
	refKey := func(u string) string {
		return "mixed_user_" + u + "_" + strconv.FormatInt(time.Now().Unix()/3600*3600, 10)
	}
	referenceHit := func(u string, hits int64) int64 {
		var incr *goredis.IntCmd
		if _, err := rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
			incr = p.IncrBy(ctx, refKey(u), hits)
			p.Expire(ctx, refKey(u), time.Hour)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return incr.Val()
	}

	referenceHit(user, 7)
	resp := decide(t, c, descriptorRequest("mixed", "user", user))
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 2 {
		t.Fatalf("after 7 of 10 counted by the reference: %v, %d remaining; want OK, 2", resp.OverallCode, resp.Statuses[0].LimitRemaining)
	}
	if v, err := rdb.Get(ctx, refKey(user)).Int64(); err != nil || v != 8 {
		t.Fatalf("GET %s = %d, %v; want 8", refKey(user), v, err)
	}
	if n := referenceHit(user, 2); n != 10 {
		t.Fatalf("the reference counted on to %d, want 10", n)
	}
	resp = decide(t, c, descriptorRequest("mixed", "user", user))
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("at 10 of 10: %v, %d remaining; want OVER_LIMIT, 0", resp.OverallCode, resp.Statuses[0].LimitRemaining)
	}

	// A key the server creates: the reference's value and TTL (the unit,
	// plus at most the jitter).
	fresh := user + "_fresh"
	if resp := decide(t, c, descriptorRequest("mixed", "user", fresh)); resp.Statuses[0].LimitRemaining != 9 {
		t.Fatalf("fresh user: %d remaining, want 9", resp.Statuses[0].LimitRemaining)
	}
	if v, err := rdb.Get(ctx, refKey(fresh)).Int64(); err != nil || v != 1 {
		t.Fatalf("GET %s = %d, %v; want 1", refKey(fresh), v, err)
	}
	if ttl := rdb.TTL(ctx, refKey(fresh)).Val(); ttl < time.Hour-10*time.Second || ttl > time.Hour+300*time.Second {
		t.Errorf("TTL %v, want the hour plus at most 300s of jitter", ttl)
	}
	if n := referenceHit(fresh, 1); n != 2 {
		t.Errorf("the reference counted on from the server's 1 to %d", n)
	}

	logs := strings.Join(s.logLines(), "\n")
	for _, want := range []string{"collision-prone", "-redis-key-format native", `"rules":1`} {
		if !strings.Contains(logs, want) {
			t.Errorf("start-up log lacks %q:\n%s", want, logs)
		}
	}
}
