package rlqs

import (
	"math"
	"math/rand/v2"
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

// TestAssignNeverExceedsLimit: whatever order streams report in, join,
// leave or go quiet, the assignments in force sum to at most the limit,
// and the pool's running sums stay the sums of its members.
func TestAssignNeverExceedsLimit(t *testing.T) {
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 3))
	now := time.Unix(0, 0)
	p := newPool(typev3.RateLimitUnit_SECOND, 100)
	pol := policy{floor: 0.1, headroom: DefaultHeadroom}
	for step := range 2000 {
		now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
		id := uint64(rng.IntN(6))
		m := p.members[id]
		switch {
		case m != nil && rng.IntN(10) == 0:
			p.remove(id)
		default:
			if m == nil {
				m = p.join(id, nil)
				m.stale = 3 * time.Second
			}
			p.sweep(now, time.Second)
			p.observe(m, float64(rng.IntN(400)), 0.5, now)
			p.retarget(m, pol, 0, 0)
			p.assign(m, p.limit, math.MaxUint64, now.Add(3*time.Second))
		}
		var assigned, target uint64
		var demand float64
		n := 0
		for _, m := range p.members {
			assigned += m.assigned
			if m.counted {
				n++
				demand += m.demand
				target += m.target
			}
		}
		if assigned != p.assigned || target != p.target || n != p.n || math.Abs(demand-p.demand) > 1e-6 {
			t.Fatalf("seed %d, step %d: sums %d/%d/%d/%v, members sum to %d/%d/%d/%v (assigned/target/n/demand)",
				seed, step, p.assigned, p.target, p.n, p.demand, assigned, target, n, demand)
		}
		if p.assigned > p.limit {
			t.Fatalf("seed %d, step %d: assignments sum to %d > %d", seed, step, p.assigned, p.limit)
		}
	}
}

// TestHeadroom: a stream is assigned at most Headroom times its demand,
// at least its floor, and its whole share when it needs it.
func TestHeadroom(t *testing.T) {
	now := time.Unix(0, 0)
	for _, c := range []struct {
		demands  []float64 // requests per second of the pool's streams
		headroom float64
		want     uint64 // the first stream's target of 100 per second
	}{
		{[]float64{10}, 2, 20},
		{[]float64{10}, math.Inf(1), 100},
		{[]float64{0}, 2, 10},          // the floor: a tenth of the limit
		{[]float64{80}, 2, 100},        // twice 80 is over the whole share
		{[]float64{30, 300}, 2, 13},    // 10% floor 5 each, then 90·30/330 = 8
		{[]float64{20, 20}, 1.5, 30},   // 1.5 × 20, under the even share 50
		{[]float64{0.2, 0.2}, 2, 5},    // 0.4 is under the floor of 5
		{[]float64{1000, 1000}, 2, 50}, // demand over the limit: the even share
	} {
		p := newPool(typev3.RateLimitUnit_SECOND, 100)
		var first *member
		for i, d := range c.demands {
			m := p.join(uint64(i), nil)
			p.observe(m, d, 0.5, now)
			if i == 0 {
				first = m
			}
		}
		if got := p.retarget(first, policy{floor: 0.1, headroom: c.headroom}, 0, 0); got != c.want {
			t.Errorf("demands %v, headroom %v: target %d, want %d", c.demands, c.headroom, got, c.want)
		}
	}
}
