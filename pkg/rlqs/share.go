package rlqs

import (
	"math"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// minUnits is the fewest units a pooled limit is shared in: a limit of N
// requests per window W is shared as L = N·k units per period k·W, with k
// the smallest whole number making L at least minUnits (1 when N is), so
// that one stream's share of a small limit shared by many streams is still
// a whole number of units above 0: 10 per second shared by 30 Envoys is
// 1,000 units per 100 s, 33 units (a third of a request per second) each.
const minUnits = 1000

// maxPeriod bounds a pool's period, in seconds (100 years), so that it
// stays a time.Duration: a limit so low that 1,000 units would take
// longer is shared in fewer.
const maxPeriod = 100 * 365 * 24 * 3600

// periodFor expresses a rule's limit as the pool's limit L and period S
// (whole seconds): its most restrictive limit (the lowest rate) of N per
// window W as L = N·k units per S = k·W seconds ([minUnits]). Envoy's
// token bucket divides tokens_per_fill by the whole seconds of
// fill_interval (createTokenBucketFromAction in Envoy's
// source/extensions/filters/http/rate_limit_quota/global_client_impl.cc),
// and a window is a whole number of seconds (units are second to year),
// so a share of a units is the rate a/S exactly. A limit of 0 returns
// L = 0, which assigns DENY_ALL.
func periodFor(r *config.Rule) (period int64, limit uint64) {
	bestRate := math.Inf(1)
	for _, l := range r.Limits {
		w := int64(l.Window / time.Second)
		if w <= 0 {
			continue
		}
		rate := float64(l.RequestsPerUnit) / float64(w)
		if rate >= bestRate {
			continue
		}
		bestRate = rate
		n := uint64(l.RequestsPerUnit)
		k := uint64(1)
		if n > 0 && n < minUnits {
			k = min((minUnits+n-1)/n, max(1, uint64(maxPeriod/w)))
		}
		period, limit = w*int64(k), n*k
	}
	return period, limit
}

// poolKey names what the streams of a replica share: one bucket of one rule.
type poolKey struct{ domain, rule, bucket string }

// pool is one limit shared by the streams of this replica reporting its
// bucket. It keeps running sums over its members, so a report costs the
// same however many streams share the bucket, and the ledger: the
// assignments in force, which never sum to more than the budget the
// replica holds for the pool (the limit, without a Budget).
type pool struct {
	bucket  string // the key of its bucket (poolKey.bucket)
	period  int64  // S, in seconds
	limit   uint64 // L: requests per period
	members map[uint64]*member
	// Sums over the members whose demand counts (reported within their
	// stale time): how many, their demand (requests per second) and
	// their targets (per period).
	n      int
	demand float64
	target uint64
	// assigned sums the assignments in force: sent, and neither replaced
	// nor past their until.
	assigned uint64
	sweepAt  time.Time // when members that went quiet are next looked for
	// With a Budget: the pool's store keys (budget, demand, streams),
	// made for a limit of keysLimit, and what this replica holds of the
	// budget (budget.go).
	keys      [3][]byte
	keysLimit uint64
	lease     poolLease
}

// member is one stream's part of a pool.
type member struct {
	demand   float64       // requests per second, allowed + denied, smoothed
	observed bool          // demand holds at least one report
	counted  bool          // demand and target are in the pool's sums
	last     time.Time     // the stream's last report of the bucket
	stale    time.Duration // after last+stale the member's demand no longer counts
	target   uint64        // its share, per period, at its last report
	assigned uint64        // the assignment last sent, per period, while in force
	until    time.Time     // when the client stops applying it (at the latest)
	// sent is the strategy last made for the member: reused, unchanged,
	// while the assignment stays the same (only the member's stream sends
	// it, one response at a time), so that Envoy keeps its token bucket
	// and the tokens in it.
	sent *typev3.RateLimitStrategy
}

// strategy returns the strategy assigning a units per period seconds: a
// token bucket ([tokenBucket]), or DENY_ALL for 0 (Envoy's token bucket
// takes no empty fill). A new assignment differing from the one last sent
// always replaces Envoy's bucket: see [replaces].
func (m *member) strategy(a uint64, period int64, burst time.Duration) *typev3.RateLimitStrategy {
	if a == 0 {
		if m.sent.GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
			m.sent = blanket(typev3.RateLimitStrategy_DENY_ALL)
		}
		return m.sent
	}
	if tb := m.sent.GetTokenBucket(); tb != nil && tb.GetTokensPerFill().GetValue() == uint32(min(a, math.MaxUint32)) && tb.GetFillInterval().GetSeconds() == period {
		return m.sent // the same assignment: Envoy keeps its bucket
	}
	next := tokenBucket(a, period, burst)
	if old := m.sent.GetTokenBucket(); old != nil && !replaces(old, next.GetTokenBucket()) {
		// Another rate Envoy would take for the old one (the period
		// moved with a reload, the fill did not): a burst one token
		// off makes Envoy replace its bucket.
		tb := next.GetTokenBucket()
		if tb.MaxTokens > 1 {
			tb.MaxTokens--
		} else {
			tb.MaxTokens++
		}
	}
	m.sent = next
	return next
}

// tokenBucket returns the token_bucket strategy of a share of a units per
// period seconds, a > 0: tokens_per_fill a every fill_interval of period
// seconds (a whole number, so Envoy's rate is a/period exactly), and
// max_tokens the share's rate times burst, at least 1 and at most a: the
// most Envoy admits at once from a full bucket. Envoy starts every new
// bucket full (or, since Envoy c33e7f82, as full as the bucket it
// replaces), so max_tokens is what each new assignment may add to what
// the rates admit: docs/rlqs.md, the bound.
func tokenBucket(a uint64, period int64, burst time.Duration) *typev3.RateLimitStrategy {
	fill := min(a, math.MaxUint32)
	most := uint64(math.Ceil(float64(fill) * burst.Seconds() / float64(period)))
	most = max(1, min(most, fill))
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     uint32(most),
		TokensPerFill: wrapperspb.UInt32(uint32(fill)),
		FillInterval:  &durationpb.Duration{Seconds: period},
	}}}
}

// replaces reports whether Envoy replaces its token bucket made from old
// when assigned next: only when max_tokens, tokens_per_fill or the nanos
// of fill_interval differ (protoTokenBucketsEq and
// shouldReplaceTokenBucket in Envoy's global_client_impl.cc). A change of
// fill_interval's whole seconds alone keeps the old bucket, and its rate.
func replaces(old, next *typev3.TokenBucket) bool {
	return old.GetMaxTokens() != next.GetMaxTokens() ||
		old.GetTokensPerFill().GetValue() != next.GetTokensPerFill().GetValue() ||
		old.GetFillInterval().GetNanos() != next.GetFillInterval().GetNanos()
}

// newPool returns an empty pool of limit limit per period seconds.
func newPool(period int64, limit uint64) *pool {
	return &pool{period: period, limit: limit, members: make(map[uint64]*member)}
}

// rescale sets the pool's limit to limit units per period seconds, after
// a reload. Assignments in force and targets are rates, counted in units
// of the old period: they are counted anew in the new period's units,
// rounded up so that the ledger never counts less than is in force.
func (p *pool) rescale(period int64, limit uint64) {
	if period == p.period || p.period == 0 {
		p.period, p.limit = period, limit
		return
	}
	conv := func(u uint64) uint64 {
		return uint64(math.Ceil(float64(u) * float64(period) / float64(p.period)))
	}
	p.assigned, p.target = 0, 0
	for _, m := range p.members {
		m.assigned, m.target = conv(m.assigned), conv(m.target)
		p.assigned += m.assigned
		if m.counted {
			p.target += m.target
		}
	}
	p.period, p.limit = period, limit
}

// join adds member id, with no demand yet, or with the demand carried
// from the pool it left (a reload moved its bucket), and what it was last
// sent: what Envoy holds.
func (p *pool) join(id uint64, carried *member) *member {
	m := &member{}
	if carried != nil {
		m.demand, m.observed, m.sent = carried.demand, carried.observed, carried.sent
	}
	p.members[id] = m
	return m
}

// remove takes member id out of the pool and its sums.
func (p *pool) remove(id uint64) {
	m := p.members[id]
	if m == nil {
		return
	}
	p.uncount(m)
	p.assigned -= m.assigned
	delete(p.members, id)
}

func (p *pool) uncount(m *member) {
	if m.counted {
		p.n--
		p.demand -= m.demand
		p.target -= m.target
		m.counted, m.target = false, 0
	}
	if p.n == 0 {
		p.demand = 0 // and the rounding the sum gathered
	}
}

// observe folds one report's rate into the member's demand, an
// exponential average giving the latest report weight alpha, and counts
// the member in the pool's sums.
func (p *pool) observe(m *member, rate, alpha float64, now time.Time) {
	if !m.counted {
		m.counted = true
		p.n++
	} else {
		p.demand -= m.demand
	}
	if m.observed {
		m.demand = alpha*rate + (1-alpha)*m.demand
	} else {
		m.demand, m.observed = rate, true
	}
	p.demand += m.demand
	m.last = now
}

// touch counts the member again without a new rate (a push after a
// reload keeps the demand known).
func (p *pool) touch(m *member) {
	if !m.counted {
		m.counted = true
		p.n++
		p.demand += m.demand
	}
}

// sweep, at most once per interval, takes out of the sums the members
// that stopped reporting (their demand) and whose assignment ended (the
// ledger): a stream that goes quiet without ending holds nothing for long.
func (p *pool) sweep(now time.Time, interval time.Duration) {
	if now.Before(p.sweepAt) {
		return
	}
	p.sweepAt = now.Add(interval)
	for _, m := range p.members {
		if m.counted && now.Sub(m.last) > m.stale {
			p.uncount(m)
		}
		if m.assigned > 0 && !now.Before(m.until) {
			p.assigned -= m.assigned
			m.assigned = 0
		}
	}
}

// policy is how a pool's limit is shared among its streams:
// [Options.FloorFraction] and [Options.Headroom].
type policy struct{ floor, headroom float64 }

// targetOf returns member m's share of the limit: the floor split evenly
// among the streams, the rest in proportion to demand, and no more than
// Headroom times the member's own demand (but at least its floor); an even
// share while its demand is unknown.
// Streams and demand are this pool's, or at least gCount streams and
// gDemand requests per second when the streams of all replicas are
// counted (with a Budget: see budget.go). gDemand, when not 0, is what
// the pool's last call to the store showed (p.lease), this replica's
// announcement included: that one is rounded up to a tenth of a request
// a second (announced) and may be a few reports old, so this replica's
// part of the total is its own demand instead. Counted at its
// announcement, a stream alone in the pool would have less than the
// whole limit: floor(rest · d/⌈d·10 s⌉/10 s) is one unit short of rest.
func (p *pool) targetOf(m *member, pol policy, gCount, gDemand float64) uint64 {
	n := max(uint64(max(p.n, 1)), uint64(gCount))
	total := p.demand
	if gDemand > 0 {
		own := float64(p.lease.leases[1].hits) / announceSpan.Seconds()
		total += max(gDemand-own, 0)
	}
	floorEach := uint64(pol.floor*float64(p.limit)) / n
	rest := p.limit - floorEach*n
	if !m.observed {
		// No rate known yet: a new bucket's first report, sent as Envoy
		// creates the bucket, counts one request. The even share, not the
		// floor: a new user is not held to a tenth of its limit until its
		// next report, 5 s later.
		return floorEach + rest/n
	}
	share := floorEach
	if total > 0 {
		share += uint64(math.Floor(float64(rest) * min(m.demand/total, 1)))
	} else {
		share += rest / n
	}
	if want := pol.headroom * m.demand * float64(p.period); want < float64(share) {
		return max(floorEach, uint64(math.Ceil(want)))
	}
	return share
}

// retarget computes member m's target (targetOf) and records it.
func (p *pool) retarget(m *member, pol policy, gCount, gDemand float64) uint64 {
	t := p.targetOf(m, pol, gCount, gDemand)
	if m.counted {
		p.target += t - m.target
	}
	m.target = t
	return t
}

// assign computes and records member m's assignment: its target, at most
// cap, and at most what budget leaves beyond the other members'
// assignments in force, which stay counted until their until whatever m
// is assigned. So the assignments in force never sum to more than the
// budget.
//
// An assignment in force is kept rather than lowered by less than an
// eighth (a thirty-second where the budget is tight, below), when it fits,
// or raised by less than a thirty-second (hysteresis): Envoy keeps the tokens of a bucket assigned again
// unchanged, but starts a changed one anew, full, so every change may
// admit a bucket's max_tokens on top of the rates (docs/rlqs.md, the
// bound). Shares that wobble with demand thus settle near the top of
// their wobble and cost nothing more, while a share that can grow by more
// than a few percent (a stream left, a replica gave back) grows at once.
func (p *pool) assign(m *member, budget, cap uint64, until time.Time) uint64 {
	others := p.assigned - m.assigned
	var free uint64
	if others < budget {
		free = budget - others
	}
	a := min(m.target, cap, free)
	// Where the budget is claimed whole (the targets sum to all of it, or
	// the store showed it contended), an assignment kept above its target
	// is taken from a stream short of its own, here or on another replica
	// (whose lease cannot grow while this one holds the surplus): it is
	// then kept only within a thirty-second, as a rise is.
	tight := p.target >= budget || p.lease.contended(p.limit)
	if old := m.assigned; keeps(a, old, tight) && old <= min(cap, free) {
		a = old
	}
	p.assigned += a - m.assigned
	m.assigned, m.until = a, until
	return a
}

// keeps reports whether an assignment of old in force is kept rather than
// replaced by one of a: a is lower, above 0, by less than an eighth (a
// thirty-second where the budget is tight), or higher by less than a
// thirty-second.
func keeps(a, old uint64, tight bool) bool {
	switch {
	case a == 0 || old == 0 || a == old:
		return false
	case a < old && !tight:
		return 8*(old-a) < old
	case a < old:
		return 32*(old-a) < old
	}
	return 32*(a-old) < old
}
