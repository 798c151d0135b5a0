package service

import (
	"fmt"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// twoLimits holds a rule with two fixed windows on one key, and a plain
// rule to refuse requests with.
const twoLimits = `
domain: d
descriptors:
  - key: user
    rate_limits:
      - {name: per_second, requests_per_unit: 2, unit: second}
      - {name: per_minute, requests_per_unit: 6, unit: minute}
  - key: blocked
    rate_limit: {requests_per_unit: 0, unit: second}
`

// counter peeks at the fixed-window counter of (user, u) with window unit:
// a limit override of the same window counts in the same counter as the
// rule's limit of that window.
func (f *fixture) counter(t *testing.T, u string, unit typev3.RateLimitUnit, n uint32) uint32 {
	t.Helper()
	d := desc("user", u)
	d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: unit}
	d.HitsAddend = wrapperspb.UInt64(0)
	return f.call(t, request("d", d)).Statuses[0].LimitRemaining
}

func (f *fixture) perSecond(t *testing.T, u string) uint32 {
	return f.counter(t, u, typev3.RateLimitUnit_SECOND, 2)
}

func (f *fixture) perMinute(t *testing.T, u string) uint32 {
	return f.counter(t, u, typev3.RateLimitUnit_MINUTE, 6)
}

// step is one call in a sequence: after advancing the clock, the status
// the descriptor must get.
type step struct {
	advance   time.Duration
	code      rlsv3.RateLimitResponse_Code
	remaining uint32
	name      string        // current_limit.name
	reset     time.Duration // duration_until_reset; -1 to skip
}

func (f *fixture) run(t *testing.T, domain string, d *rlv3.RateLimitDescriptor, steps []step) {
	t.Helper()
	for i, s := range steps {
		f.clock.Advance(s.advance)
		resp := f.call(t, request(domain, d))
		st := resp.Statuses[0]
		if st.Code != s.code || resp.OverallCode != s.code || st.LimitRemaining != s.remaining || st.CurrentLimit.GetName() != s.name ||
			s.reset >= 0 && st.DurationUntilReset.AsDuration() != s.reset {
			t.Fatalf("step %d (+%v): %v %d remaining, limit %q, reset %v; want %v %d, %q, %v", i, s.advance,
				st.Code, st.LimitRemaining, st.CurrentLimit.GetName(), st.DurationUntilReset.AsDuration(),
				s.code, s.remaining, s.name, s.reset)
		}
	}
}

func TestSeveralLimits(t *testing.T) {
	// Two hits per second for three seconds exhaust the minute's 6.
	sixHits := []step{
		{0, ok, 1, "per_second", time.Second},
		{0, ok, 0, "per_second", time.Second},
		{time.Second, ok, 1, "per_second", time.Second},      // per_second 1, per_minute 3
		{0, ok, 0, "per_second", time.Second},                // 0 and 2
		{time.Second, ok, 1, "per_minute", 58 * time.Second}, // 1 and 1: the longer reset
		{0, ok, 0, "per_minute", 58 * time.Second},           // 0 and 0
	}
	cases := []struct {
		name  string
		steps []step
		// The counters afterwards, read in the last step's second.
		perSecond, perMinute uint32
	}{
		{"the short limit refuses; the long one is not consumed", []step{
			{0, ok, 1, "per_second", time.Second},
			{0, ok, 0, "per_second", time.Second},
			{0, over, 0, "per_second", time.Second},
			{0, over, 0, "per_second", time.Second},
		}, 0, 4},
		{"the long limit refuses; the short one is not consumed", append(sixHits[:6:6],
			step{time.Second, over, 0, "per_minute", 57 * time.Second},
		), 2, 0},
		{"both refuse: the one that frees up last is reported", append(sixHits[:6:6],
			step{0, over, 0, "per_minute", 58 * time.Second},
		), 0, 0},
		{"the next minute restores both", append(sixHits[:6:6],
			step{58 * time.Second, ok, 1, "per_second", time.Second},
		), 1, 5},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, twoLimits)
			f.run(t, "d", desc("user", "u1"), c.steps)
			if got := f.perSecond(t, "u1"); got != c.perSecond {
				t.Errorf("per_second counter: %d remaining, want %d", got, c.perSecond)
			}
			if got := f.perMinute(t, "u1"); got != c.perMinute {
				t.Errorf("per_minute counter: %d remaining, want %d", got, c.perMinute)
			}
		})
	}
}

// TestSeveralLimitsAreAllOrNothing checks that the limits of one rule are
// decided with the rest of the request: refused by another descriptor,
// neither limit is consumed; several hits that one limit refuses consume
// nothing from the other.
func TestSeveralLimitsAreAllOrNothing(t *testing.T) {
	f := newFixture(t, twoLimits)
	user := desc("user", "u1")
	resp := f.call(t, request("d", user, desc("blocked", "x")))
	if resp.OverallCode != over || resp.Statuses[0].Code != ok || resp.Statuses[1].Code != over {
		t.Fatalf("with a refused descriptor: %v", resp)
	}
	if st := resp.Statuses[0]; st.LimitRemaining != 2 || st.CurrentLimit.GetName() != "per_second" {
		t.Errorf("the within-limit descriptor reports %v, want per_second with 2 remaining (nothing taken)", st)
	}
	if s, m := f.perSecond(t, "u1"), f.perMinute(t, "u1"); s != 2 || m != 6 {
		t.Fatalf("a refused request consumed from a rule's limits: per_second %d, per_minute %d remaining", s, m)
	}

	// 3 hits fit the minute (6) but not the second (2): nothing is taken.
	three := desc("user", "u1")
	three.HitsAddend = wrapperspb.UInt64(3)
	if st := f.call(t, request("d", three)).Statuses[0]; st.Code != over || st.CurrentLimit.GetName() != "per_second" || st.LimitRemaining != 2 {
		t.Fatalf("3 hits: %v, want OVER_LIMIT by per_second with its 2 remaining", st)
	}
	if m := f.perMinute(t, "u1"); m != 6 {
		t.Fatalf("hits per_second refused were taken from per_minute: %d remaining", m)
	}
	// The same hits twice in one request: the second sees the first.
	resp = f.call(t, request("d", user, user))
	if resp.OverallCode != ok || resp.Statuses[1].LimitRemaining != 0 {
		t.Fatalf("the same descriptor twice: %v", resp)
	}
	if s, m := f.perSecond(t, "u1"), f.perMinute(t, "u1"); s != 0 || m != 4 {
		t.Fatalf("after two admitted hits: per_second %d, per_minute %d remaining, want 0 and 4", s, m)
	}
}

func TestShadowRuleWithSeveralLimits(t *testing.T) {
	f := newFixture(t, `
domain: d
descriptors:
  - key: user
    shadow_mode: true
    rate_limits:
      - {name: per_second, requests_per_unit: 2, unit: second}
      - {name: per_minute, requests_per_unit: 6, unit: minute}
`)
	for i := range 4 {
		resp := f.call(t, request("d", desc("user", "u1")))
		want := uint32(max(1-i, 0))
		if st := resp.Statuses[0]; resp.OverallCode != ok || st.Code != ok || st.LimitRemaining != want || st.CurrentLimit.GetName() != "per_second" {
			t.Fatalf("call %d: %v, want OK with %d remaining: shadow rules never refuse", i, resp, want)
		}
	}
	// A refused shadow request is not counted in the limit that refused
	// it, but each limit is decided on its own: per_minute counted all 4.
	if s, m := f.perSecond(t, "u1"), f.perMinute(t, "u1"); s != 0 || m != 2 {
		t.Fatalf("per_second %d, per_minute %d remaining, want 0 and 2", s, m)
	}
}

func TestReplacesRuleWithSeveralLimits(t *testing.T) {
	f := newFixture(t, `
domain: d
descriptors:
  - key: user
    rate_limits:
      - {name: per_second, requests_per_unit: 2, unit: second}
      - {name: per_minute, requests_per_unit: 6, unit: minute}
  - key: vip
    rate_limit: {name: vip, requests_per_unit: 10, unit: second, replaces: [{name: per_minute}]}
  - key: user_plan
    rate_limit: {requests_per_unit: 1, unit: second, replaces: [{name: vip}]}
`)
	// Replacing one name of the rule drops the whole rule: per_second too.
	for i := range 4 {
		resp := f.call(t, request("d", desc("user", "u1"), desc("vip", "v")))
		if resp.OverallCode != ok || resp.Statuses[0].CurrentLimit != nil || resp.Statuses[1].CurrentLimit.GetName() != "vip" {
			t.Fatalf("call %d: %v, want the user rule replaced whole", i, resp)
		}
	}
	if s, m := f.perSecond(t, "u1"), f.perMinute(t, "u1"); s != 2 || m != 6 {
		t.Fatalf("a replaced rule was counted: per_second %d, per_minute %d remaining", s, m)
	}
	// Alone, the rule applies with both limits.
	if st := f.call(t, request("d", desc("user", "u1"))).Statuses[0]; st.CurrentLimit.GetName() != "per_second" || st.LimitRemaining != 1 {
		t.Fatalf("alone: %v", st)
	}
}

// TestAlgorithmsFromRuleFiles drives each algorithm through a rule file
// and the RLS API.
func TestAlgorithmsFromRuleFiles(t *testing.T) {
	const skip = -1
	cases := []struct {
		algorithm, limit string
		steps            []step
	}{
		{"token_bucket", "{name: n, algorithm: token_bucket, requests_per_unit: 1, unit: second, burst: 3}", []step{
			{0, ok, 2, "n", time.Second}, // a burst of 3 at once
			{0, ok, 1, "n", 2 * time.Second},
			{0, ok, 0, "n", 3 * time.Second},
			{0, over, 0, "n", 3 * time.Second},
			{time.Second, ok, 0, "n", 3 * time.Second}, // one token back per second
			{500 * time.Millisecond, over, 0, "n", 2500 * time.Millisecond},
		}},
		{"leaky_bucket", "{name: n, algorithm: leaky_bucket, requests_per_unit: 1, unit: second, burst: 3}", []step{
			{0, ok, 2, "n", time.Second},
			{0, ok, 1, "n", 2 * time.Second},
			{0, ok, 0, "n", 3 * time.Second},
			{0, over, 0, "n", 3 * time.Second},
			{time.Second, ok, 0, "n", 3 * time.Second},
		}},
		{"gcra", "{name: n, algorithm: gcra, requests_per_unit: 1, unit: second, burst: 3}", []step{
			{0, ok, 2, "n", time.Second},
			{0, ok, 1, "n", 2 * time.Second},
			{0, ok, 0, "n", 3 * time.Second},
			{0, over, 0, "n", 3 * time.Second},
			{time.Second, ok, 0, "n", 3 * time.Second},
		}},
		{"sliding_window_log", "{name: n, algorithm: sliding_window_log, requests_per_unit: 2, unit: minute}", []step{
			{0, ok, 1, "n", skip},
			{30 * time.Second, ok, 0, "n", skip},
			{29 * time.Second, over, 0, "n", skip}, // a fixed window would have reset at 60 s
			{time.Second, ok, 0, "n", skip},        // the first hit is a minute old
			{0, over, 0, "n", skip},
		}},
		{"sliding_window_counter", "{name: n, algorithm: sliding_window_counter, requests_per_unit: 4, unit: minute}", []step{
			{0, ok, 3, "n", skip},
			{0, ok, 2, "n", skip},
			{0, ok, 1, "n", skip},
			{0, ok, 0, "n", skip},
			{0, over, 0, "n", skip},
			// Half into the next minute, the previous one weighs 4 × 1/2.
			{90 * time.Second, ok, 1, "n", skip},
			{0, ok, 0, "n", skip},
			{0, over, 0, "n", skip},
		}},
		{"burst_fill", "{name: n, algorithm: burst_fill, requests_per_unit: 2, unit: minute}", []step{
			{10 * time.Second, ok, 1, "n", time.Minute}, // the window starts at the first hit
			{0, ok, 0, "n", time.Minute},
			{55 * time.Second, over, 0, "n", 5 * time.Second}, // past the aligned minute, still in its own
			{5 * time.Second, ok, 1, "n", time.Minute},
		}},
	}
	for _, c := range cases {
		t.Run(c.algorithm, func(t *testing.T) {
			f := newFixture(t, fmt.Sprintf("domain: d\ndescriptors:\n  - {key: k, rate_limit: %s}\n", c.limit))
			rule := f.svc.Rules().Domain("d").Rules()[0]
			if rule.Algorithm.String() != c.algorithm {
				t.Fatalf("rule algorithm %v", rule.Algorithm)
			}
			f.run(t, "d", desc("k", "v"), c.steps)
			// current_limit is the limit as written, whatever the algorithm.
			cl := f.call(t, request("d", desc("k", "v"))).Statuses[0].CurrentLimit
			if cl.GetRequestsPerUnit() != rule.RequestsPerUnit || cl.GetUnit().String() != map[config.Unit]string{config.Second: "SECOND", config.Minute: "MINUTE"}[rule.Unit] {
				t.Errorf("current_limit %v, want requests_per_unit %d per %v", cl, rule.RequestsPerUnit, rule.Unit)
			}
		})
	}
}

// TestRuleLimitsPassAlgoCheck checks that config's bounds are algo's: a
// limit loads from a rule file exactly when algo computes it
// (algo.Limit.Check), over limits around every bound.
func TestRuleLimitsPassAlgoCheck(t *testing.T) {
	if config.MaxBucket != algo.MaxBucket || config.MaxLog != algo.MaxLog || config.MaxRefill != algo.MaxRefill || config.MaxWindow != algo.MaxRefill {
		t.Fatalf("config bounds (bucket %d, log %d, refill %v, window %v) differ from algo's (%d, %d, %v)",
			config.MaxBucket, config.MaxLog, config.MaxRefill, config.MaxWindow, algo.MaxBucket, algo.MaxLog, algo.MaxRefill)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(vs ...uint64) uint64 { return vs[rng.IntN(len(vs))] }
	units := []string{"second", "minute", "hour", "day", "week", "month", "year"}
	loaded := 0
	for i := range 20000 {
		alg := algo.Algorithms()[rng.IntN(len(algo.Algorithms()))]
		unit := units[rng.IntN(len(units))]
		n := pick(0, 1, 7, 1000, algo.MaxLog, algo.MaxLog+1, 100_000, algo.MaxBucket-1, algo.MaxBucket, algo.MaxBucket+1, 1<<32-1,
			rng.Uint64N(algo.MaxBucket)+1, rng.Uint64N(1<<32))
		mult := pick(1, 2, 60, 100, 101, 5200, 36500, 36501, rng.Uint64N(1<<32-1)+1)
		src := fmt.Sprintf("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: %s, requests_per_unit: %d, unit: %s, unit_multiplier: %d", alg, n, unit, mult)
		var burst uint64
		if alg.UsesBurst() && rng.IntN(3) > 0 {
			// Around the largest burst that refills within MaxRefill, too.
			u, _ := config.ParseUnit(unit)
			most := new(big.Int).Mul(big.NewInt(algo.MaxRefill.Microseconds()), new(big.Int).SetUint64(n))
			most.Div(most, new(big.Int).Mul(big.NewInt(u.Duration().Microseconds()), new(big.Int).SetUint64(mult)))
			edge := uint64(1<<32 - 1)
			if most.IsUint64() && most.Uint64() < edge {
				edge = most.Uint64()
			}
			burst = pick(1, 2, 100, 1000, algo.MaxBucket, algo.MaxBucket+1, rng.Uint64N(1<<32-1)+1)
			if rng.IntN(2) == 0 {
				burst = pick(max(edge, 1), edge+1)
			}
			src += fmt.Sprintf(", burst: %d", burst)
		}
		src += "}\n"
		rules, err := config.Parse(config.File{Name: "r.yaml", Data: []byte(src)})
		var checkErr error
		if err == nil {
			rule := rules.Domain("d").Rules()[0]
			loaded++
			for j := range rule.Limits {
				if checkErr = ruleLimit(&rule.Limits[j]).Check(); checkErr != nil {
					break
				}
			}
		} else {
			// The limit the file asks for, built by hand.
			u, _ := config.ParseUnit(unit)
			window := algo.MaxRefill + u.Duration() // too long, for multipliers that would overflow
			if mult <= uint64(algo.MaxRefill/u.Duration())+1 {
				window = time.Duration(mult) * u.Duration()
			}
			checkErr = algo.Limit{Algorithm: alg, Requests: n, Window: window, Burst: burst}.Check()
		}
		if (err == nil) != (checkErr == nil) {
			t.Fatalf("case %d:\n%s\nconfig: %v\nalgo.Limit.Check: %v", i, src, err, checkErr)
		}
	}
	if loaded < 2000 || loaded > 18000 {
		t.Errorf("%d of 20000 limits loaded: the cases do not probe both sides of the bounds", loaded)
	}
}

// TestExamples checks what the comments of examples/algorithms.yaml and
// examples/api.yaml say: how many hits each rule admits at once.
func TestExamples(t *testing.T) {
	rules, err := config.Load("../../examples")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		domain, key string
		admits      int
		refusedBy   string
	}{
		{"api", "user_id", 10, "requests_per_user_per_second"},
		{"algorithms", "search_user", 100, "searches_per_user"},
		{"algorithms", "api_key", 1000, "calls_per_api_key"},
		{"algorithms", "upload_user", 20, "uploads_per_user"},
		{"algorithms", "webhook_endpoint", 10, "webhooks_per_endpoint"},
		{"algorithms", "login_ip", 3, "logins_per_ip"},
		{"algorithms", "reset_account", 3, "password_resets_per_account"},
	}
	for _, c := range cases {
		t.Run(c.domain+"/"+c.key, func(t *testing.T) {
			f := newFixture(t, "domain: unused\n")
			f.svc.SetRules(rules)
			admitted := 0
			for {
				st := f.call(t, request(c.domain, desc(c.key, "x"))).Statuses[0]
				if st.Code == over {
					if st.CurrentLimit.GetName() != c.refusedBy {
						t.Errorf("refused by %q, want %q", st.CurrentLimit.GetName(), c.refusedBy)
					}
					break
				}
				if admitted++; admitted > c.admits {
					break
				}
			}
			if admitted != c.admits {
				t.Errorf("admitted %d at once, want %d", admitted, c.admits)
			}
		})
	}
}
