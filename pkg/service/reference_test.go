package service

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
)

// mixedRules are rules a reference pod and ratelimitd both load, and two
// that only ratelimitd can (token_bucket, unit_multiplier).
const mixedRules = `
domain: rl
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: tenant
    descriptors:
      - key: plan
        rate_limit: {unit: hour, requests_per_unit: 100}
  - key: path
    value: /files/*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: token_bucket}
  - key: ten
    rate_limit: {unit: minute, unit_multiplier: 10, requests_per_unit: 5}
`

// referencePod counts hits as envoyproxy/ratelimit does, from its docs and
// src/limiter/cache_key.go and src/redis/fixed_cache_impl.go: the key is
// CACHE_KEY_PREFIX + domain + "_" + (key + "_" + value + "_") per entry +
// the window start (now / unit * unit, Unix seconds, the pod's clock); a
// hit is INCRBY hits_addend then EXPIRE unit, pipelined. It returns the
// count after the increment.
type referencePod struct {
	t      *testing.T
	rdb    *goredis.Client
	prefix string
	now    func() time.Time
}

func (p referencePod) key(domain string, unit int64, kv ...string) string {
	var b strings.Builder
	b.WriteString(p.prefix + domain + "_")
	for i := 0; i+1 < len(kv); i += 2 {
		b.WriteString(kv[i] + "_" + kv[i+1] + "_")
	}
	b.WriteString(strconv.FormatInt(p.now().Unix()/unit*unit, 10))
	return b.String()
}

func (p referencePod) hit(hits int64, domain string, unit int64, kv ...string) int64 {
	p.t.Helper()
	k := p.key(domain, unit, kv...)
	ctx := context.Background()
	var incr *goredis.IntCmd
	if _, err := p.rdb.Pipelined(ctx, func(pl goredis.Pipeliner) error {
		incr = pl.IncrBy(ctx, k, hits)
		pl.Expire(ctx, k, time.Duration(unit)*time.Second)
		return nil
	}); err != nil {
		p.t.Fatal(err)
	}
	return incr.Val()
}

// mixedFleet is a ratelimitd service on a real Redis that reference pods
// share, both on clk.
func mixedFleet(t *testing.T, reference bool) (*fixture, referencePod) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	// Ten minutes and a half into an hour: every window is mid-way.
	clk := clocktest.New(time.Unix(1_700_000_000/3600*3600+630, 250_000_000))
	prefix := fmt.Sprintf("mixed%d:", time.Now().UnixNano())
	be := redis.New(rdb, redis.Options{Prefix: prefix, Now: clk.Now})
	f := newFixtureOpts(t, mixedRules, be, clk, Options{Now: clk.Now, ReferenceKeys: reference})
	return f, referencePod{t: t, rdb: rdb, prefix: prefix, now: clk.Now}
}

// TestMixedFleet has reference pods and ratelimitd count one fixed-window
// limit together in one Redis, as during a rolling migration: ratelimitd
// counts on from what the reference counted, and what it counts the
// reference reads back, with the reference's TTL.
func TestMixedFleet(t *testing.T) {
	f, ref := mixedFleet(t, true)
	ctx := context.Background()
	alice := desc("user", "alice")

	if n := ref.hit(3, "rl", 60, "user", "alice"); n != 3 {
		t.Fatalf("reference count %d", n)
	}
	s := f.call(t, request("rl", alice)).Statuses[0]
	if s.Code != rlsv3.RateLimitResponse_OK || s.LimitRemaining != 1 {
		t.Fatalf("after 3 of 5 counted by the reference, 1 hit: %v, %d remaining; want OK, 1", s.Code, s.LimitRemaining)
	}
	if s.DurationUntilReset.AsDuration() != 29750*time.Millisecond {
		t.Errorf("reset %v, want 29.75s", s.DurationUntilReset.AsDuration())
	}
	k := ref.key("rl", 60, "user", "alice")
	if v, err := ref.rdb.Get(ctx, k).Int64(); err != nil || v != 4 {
		t.Fatalf("GET %s = %d, %v; want 4", k, v, err)
	}
	if n := ref.hit(1, "rl", 60, "user", "alice"); n != 5 {
		t.Fatalf("the reference counted on to %d, want 5", n)
	}
	// At the limit the reference counted to, ratelimitd refuses.
	resp := f.call(t, request("rl", alice))
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("at 5 of 5: %v, %d remaining; want OVER_LIMIT, 0", resp.OverallCode, resp.Statuses[0].LimitRemaining)
	}
	// A refused request counts nothing (all or nothing, as ratelimitd
	// always does): not alice's hit, nor bob's beside it.
	resp = f.call(t, request("rl", desc("user", "bob"), alice))
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK {
		t.Fatalf("bob and alice: %v", resp)
	}
	if v, _ := ref.rdb.Get(ctx, k).Int64(); v != 5 {
		t.Errorf("alice's count went to %d on a refusal", v)
	}
	if n, _ := ref.rdb.Exists(ctx, ref.key("rl", 60, "user", "bob")).Result(); n != 0 {
		t.Error("bob was counted in a refused request")
	}
	// The reference's keys expire with the unit; ratelimitd's do too.
	if ttl := ref.rdb.TTL(ctx, k).Val(); ttl <= 0 || ttl > time.Minute {
		t.Errorf("TTL of %s: %v, want (0, 1m]", k, ttl)
	}

	// A key ratelimitd creates, with two entries and several descriptors.
	resp = f.call(t, request("rl", desc("tenant", "acme", "plan", "gold"), desc("user", "carol")))
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 99 || resp.Statuses[1].LimitRemaining != 4 {
		t.Fatalf("tenant and carol: %v", resp)
	}
	tk := ref.key("rl", 3600, "tenant", "acme", "plan", "gold")
	if v, err := ref.rdb.Get(ctx, tk).Int64(); err != nil || v != 1 {
		t.Fatalf("GET %s = %d, %v; want 1", tk, v, err)
	}
	if ttl := ref.rdb.TTL(ctx, tk).Val(); ttl <= 59*time.Minute || ttl > time.Hour {
		t.Errorf("TTL of %s: %v, want about 1h (the unit, from the first hit)", tk, ttl)
	}
	if n := ref.hit(1, "rl", 3600, "tenant", "acme", "plan", "gold"); n != 2 {
		t.Errorf("the reference counted on from ratelimitd's 1 to %d, want 2", n)
	}

	// share_threshold: every value under the wildcard shares the key of
	// its pattern, as in the reference.
	ref.hit(2, "rl", 1, "path", "/files/*")
	s = f.call(t, request("rl", desc("path", "/files/b.pdf"))).Statuses[0]
	if s.Code != rlsv3.RateLimitResponse_OK || s.LimitRemaining != 0 {
		t.Fatalf("/files/b.pdf after 2 of 3 counted under /files/*: %v, %d remaining", s.Code, s.LimitRemaining)
	}
	if v, _ := ref.rdb.Get(ctx, ref.key("rl", 1, "path", "/files/*")).Int64(); v != 3 {
		t.Errorf("/files/* counted %d, want 3", v)
	}

	// A limit override counts under the reference key of its unit.
	over := desc("user", "dave")
	over.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: 3} // HOUR
	ref.hit(1, "rl", 3600, "user", "dave")
	s = f.call(t, request("rl", over)).Statuses[0]
	if s.Code != rlsv3.RateLimitResponse_OK || s.LimitRemaining != 0 {
		t.Fatalf("override after 1 of 2 counted by the reference: %v, %d remaining", s.Code, s.LimitRemaining)
	}
	over.Limit.UnitMultiplier = wrapperspb.UInt32(2) // the reference has no such limit: a native key
	f.call(t, request("rl", over))

	// Rules the reference cannot hold keep their native keys.
	f.call(t, request("rl", desc("bucket", "x"), desc("ten", "y")))
	keys, err := ref.rdb.Keys(ctx, ref.prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var native []string
	for _, k := range keys {
		if strings.Contains(k, "|") {
			native = append(native, strings.TrimPrefix(k, ref.prefix))
		}
	}
	want := []string{"2:rl=4:user4:dave|fixed_window/7200s", "2:rl=6:bucket1:x|token_bucket/60s", "2:rl=3:ten1:y|fixed_window/600s"}
	if len(native) != len(want) {
		t.Fatalf("native keys %q, want %q", native, want)
	}
	for _, w := range want {
		found := false
		for _, k := range native {
			found = found || k == w
		}
		if !found {
			t.Errorf("no native key %q among %q", w, native)
		}
	}
}

// TestNativeFormatUnchanged: without ReferenceKeys, nothing is written in
// the reference layout, and what reference pods count is not seen.
func TestNativeFormatUnchanged(t *testing.T) {
	f, ref := mixedFleet(t, false)
	ctx := context.Background()
	ref.hit(5, "rl", 60, "user", "alice")
	s := f.call(t, request("rl", desc("user", "alice"))).Statuses[0]
	if s.Code != rlsv3.RateLimitResponse_OK || s.LimitRemaining != 4 {
		t.Fatalf("native: %v, %d remaining; want OK, 4 (its own count)", s.Code, s.LimitRemaining)
	}
	if v, _ := ref.rdb.Get(ctx, ref.key("rl", 60, "user", "alice")).Int64(); v != 5 {
		t.Errorf("the reference key holds %d, want the reference's 5", v)
	}
	if n, _ := ref.rdb.Exists(ctx, ref.prefix+"2:rl=4:user5:alice|fixed_window/60s").Result(); n != 1 {
		t.Error("no native key")
	}
}
