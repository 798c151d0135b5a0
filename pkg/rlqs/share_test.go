package rlqs

import (
	"testing"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/ratelimitd/ratelimitd/pkg/config"
)

func TestUnitFor(t *testing.T) {
	lim := func(n uint32, w time.Duration) config.Limit {
		return config.Limit{RequestsPerUnit: n, Window: w}
	}
	cases := []struct {
		name   string
		limits []config.Limit
		unit   typev3.RateLimitUnit
		n      uint64
	}{
		{"per second", []config.Limit{lim(100, time.Second)}, typev3.RateLimitUnit_SECOND, 100},
		{"per minute", []config.Limit{lim(60, time.Minute)}, typev3.RateLimitUnit_MINUTE, 60},
		{"10 per 5 seconds", []config.Limit{lim(10, 5*time.Second)}, typev3.RateLimitUnit_SECOND, 2},
		{"700 per week", []config.Limit{lim(700, 7*24*time.Hour)}, typev3.RateLimitUnit_DAY, 100},
		{"rounded down", []config.Limit{lim(7, 2*time.Second)}, typev3.RateLimitUnit_SECOND, 3},
		{"below one a day", []config.Limit{lim(1, 7*24*time.Hour)}, typev3.RateLimitUnit_DAY, 0},
		{"most restrictive of several", []config.Limit{lim(10, time.Second), lim(60, time.Minute)}, typev3.RateLimitUnit_MINUTE, 60},
	}
	for _, c := range cases {
		u, n := unitFor(&config.Rule{Limits: c.limits})
		if u != c.unit || n != c.n {
			t.Errorf("%s: %d/%v, want %d/%v", c.name, n, u, c.n, c.unit)
		}
	}
}

func TestBucketDescriptorKeyIsInjective(t *testing.T) {
	a, _ := newBucketDescriptor(map[string]string{"a": "b:c"})
	b, _ := newBucketDescriptor(map[string]string{"a": "b", "c": ""})
	if a.key() == b.key() {
		t.Fatalf("%v and %v share the key %q", a, b, a.key())
	}
	d, _ := newBucketDescriptor(map[string]string{"z": "1", "a": "2", "m": "3"})
	if got := d.String(); got != "[(a, 2), (m, 3), (z, 1)]" {
		t.Fatalf("sorted descriptor %s", got)
	}
}

// TestAssignNeverExceedsLimit: whatever order streams report in, the
// assignments in force sum to at most the limit.
func TestAssignNeverExceedsLimit(t *testing.T) {
	now := time.Unix(0, 0)
	p := &pool{limit: 100, members: map[uint64]*member{}}
	demands := map[uint64][]float64{1: {500, 0, 10, 300}, 2: {0, 400, 10, 300}, 3: {50, 50, 500, 0}}
	for round := range 4 {
		for id := uint64(1); id <= 3; id++ {
			m := p.members[id]
			if m == nil {
				m = &member{stale: 3 * time.Second}
				p.members[id] = m
			}
			m.observe(demands[id][round], 0.5, now)
			p.assign(id, 0.1, now, now.Add(3*time.Second))
			var sum uint64
			for _, m := range p.members {
				sum += m.assigned
			}
			if sum > p.limit {
				t.Fatalf("round %d, stream %d: assignments sum to %d > %d", round, id, sum, p.limit)
			}
		}
		now = now.Add(time.Second)
	}
}
