package rlqs

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/ratelimitd/ratelimitd/pkg/config"
)

func TestPeriodFor(t *testing.T) {
	lim := func(n uint32, w time.Duration) config.Limit {
		return config.Limit{RequestsPerUnit: n, Window: w}
	}
	cases := []struct {
		name   string
		limits []config.Limit
		period int64
		n      uint64
	}{
		{"1,000 or more per window: as written", []config.Limit{lim(5000, time.Second)}, 1, 5000},
		{"100 per second: 1,000 per 10 s", []config.Limit{lim(100, time.Second)}, 10, 1000},
		{"60 per minute: 1,020 per 17 min", []config.Limit{lim(60, time.Minute)}, 17 * 60, 1020},
		{"1 per 5 seconds: 1,000 per 5,000 s", []config.Limit{lim(1, 5*time.Second)}, 5000, 1000},
		{"700 per week", []config.Limit{lim(700, 7*24*time.Hour)}, 2 * 7 * 24 * 3600, 1400},
		{"1 per year: at most 100 years", []config.Limit{lim(1, 365*24*time.Hour)}, 100 * 365 * 24 * 3600, 100},
		{"0: deny", []config.Limit{lim(0, time.Second)}, 1, 0},
		{"most restrictive of several", []config.Limit{lim(10, time.Second), lim(60, time.Minute)}, 17 * 60, 1020},
	}
	for _, c := range cases {
		period, n := periodFor(&config.Rule{Limits: c.limits})
		if period != c.period || n != c.n {
			t.Errorf("%s: %d per %d s, want %d per %d s", c.name, n, period, c.n, c.period)
		}
	}
}

// TestTokenBucketOfShare: a share of a units per period is a token bucket
// of tokens_per_fill a every period seconds (whole, so Envoy's rate is
// exact) and max_tokens the rate times the burst, 1 to a.
func TestTokenBucketOfShare(t *testing.T) {
	cases := []struct {
		a      uint64
		period int64
		burst  time.Duration
		most   uint32
	}{
		{250, 10, time.Second, 25},            // 25 per second, 1 s of it
		{250, 10, 500 * time.Millisecond, 13}, // rounded up
		{33, 100, time.Second, 1},             // a third per second: at least 1
		{5, 1, 10 * time.Second, 5},           // never more than a period's share
	}
	for _, c := range cases {
		tb := tokenBucket(c.a, c.period, c.burst).GetTokenBucket()
		if tb.GetTokensPerFill().GetValue() != uint32(c.a) || tb.GetFillInterval().AsDuration() != time.Duration(c.period)*time.Second || tb.GetMaxTokens() != c.most {
			t.Errorf("share %d per %d s, burst %v: %v, want max_tokens %d", c.a, c.period, c.burst, tb, c.most)
		}
	}
}

// TestStrategyReplacesEnvoysBucket: a member's new assignment always makes
// Envoy replace its token bucket (Envoy keeps one whose max_tokens,
// tokens_per_fill and nanos are equal), and the same assignment is the
// same strategy, whose bucket Envoy keeps.
func TestStrategyReplacesEnvoysBucket(t *testing.T) {
	m := &member{}
	a := m.strategy(250, 10, time.Second)
	if m.strategy(250, 10, time.Second) != a {
		t.Fatal("the same assignment made a new strategy")
	}
	if b := m.strategy(251, 10, time.Second); !replaces(a.GetTokenBucket(), b.GetTokenBucket()) {
		t.Fatalf("%v after %v: Envoy would keep its bucket", b, a)
	}
	// A reload moved the bucket to a rule of another period with the same
	// number of units: the rate differs, tokens_per_fill and max_tokens
	// alone would not.
	m = &member{}
	a = m.strategy(1000, 10, time.Second) // 100/s, max 100
	b := m.strategy(1000, 20, 2*time.Second)
	if !replaces(a.GetTokenBucket(), b.GetTokenBucket()) {
		t.Fatalf("%v after %v: Envoy would keep the old rate", b, a)
	}
	if m.strategy(0, 10, time.Second).GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
		t.Fatal("an assignment of 0 is not DENY_ALL")
	}
}

// TestHysteresis: an assignment in force is kept rather than lowered by
// less than an eighth or raised by less than a thirty-second (Envoy keeps
// its bucket and tokens), changed by more, and not kept when it no longer
// fits the budget. Where the budget is claimed whole (another stream's
// target needs what it keeps), it is kept only within a thirty-second.
func TestHysteresis(t *testing.T) {
	now := time.Unix(0, 0)
	until := now.Add(time.Minute)
	p := newPool(10, 1000)
	m := p.join(1, nil)
	for _, c := range []struct {
		target, budget, want uint64
	}{
		{400, 1000, 400},
		{360, 1000, 400}, // −10%: kept
		{410, 1000, 400}, // +2.5%: kept
		{420, 1000, 420}, // +5%: raised
		{350, 1000, 350}, // −14.6%: sent
		{320, 330, 320},  // −8.6%, but the budget leaves 330: lowered to the target
	} {
		m.target, p.target = c.target, c.target
		if got := p.assign(m, c.budget, math.MaxUint64, until); got != c.want || p.assigned != c.want {
			t.Fatalf("target %d, budget %d: assigned %d (pool %d), want %d", c.target, c.budget, got, p.assigned, c.want)
		}
	}

	// Two streams claim the whole limit: a drop of 10% is not kept, since
	// the other stream's target needs it; 2% is.
	p = newPool(10, 1000)
	a, b := p.join(1, nil), p.join(2, nil)
	a.target, b.target, p.target = 500, 500, 1000
	p.assign(a, 1000, math.MaxUint64, until)
	p.assign(b, 1000, math.MaxUint64, until)
	a.target, b.target = 450, 550
	if got := p.assign(a, 1000, math.MaxUint64, until); got != 450 {
		t.Fatalf("the limit claimed whole, a target down 10%%: kept %d, want 450 for the other stream", got)
	}
	if got := p.assign(b, 1000, math.MaxUint64, until); got != 550 {
		t.Fatalf("the other stream then gets %d, want its target 550", got)
	}
	a.target, b.target = 440, 560
	if got := p.assign(a, 1000, math.MaxUint64, until); got != 450 {
		t.Fatalf("a target down 2.2%%: assigned %d, want 450 kept", got)
	}

	// Across replicas: the store showed the budget contended, so another
	// replica may need what this one keeps.
	p = newPool(10, 1000)
	m = p.join(1, nil)
	m.target, p.target = 500, 500
	p.assign(m, 600, math.MaxUint64, until)
	p.lease.viewed, p.lease.free = true, 0
	m.target, p.target = 450, 450
	if got := p.assign(m, 600, math.MaxUint64, until); got != 450 {
		t.Fatalf("nothing free in the store, a target down 10%%: kept %d, want 450", got)
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
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 3))
	now := time.Unix(0, 0)
	p := newPool(1, 100)
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
		p := newPool(1, 100)
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

// TestShortestFirst checks the order in which a pool raises its members
// when it can raise only some: furthest short of its target first, over
// its target last, equal shortfalls by stream id, whatever order the
// members come in (Go's maps give a new one each run).
func TestShortestFirst(t *testing.T) {
	c := func(id, target, assigned uint64) candidate {
		return candidate{id: id, m: &member{assigned: assigned}, target: target}
	}
	want := []candidate{c(7, 50, 10), c(2, 30, 10), c(9, 30, 10), c(4, 20, 15), c(1, 20, 20), c(3, 10, 25)}
	for seed := range uint64(20) {
		got := slices.Clone(want)
		rand.New(rand.NewPCG(seed, 1)).Shuffle(len(got), func(i, j int) { got[i], got[j] = got[j], got[i] })
		slices.SortFunc(got, shortestFirst)
		for i := range want {
			if got[i].id != want[i].id {
				t.Fatalf("seed %d: order %v, want ids 7 2 9 4 1 3", seed, ids(got))
			}
		}
	}
}

func ids(cs []candidate) []uint64 {
	out := make([]uint64, len(cs))
	for i, c := range cs {
		out[i] = c.id
	}
	return out
}
