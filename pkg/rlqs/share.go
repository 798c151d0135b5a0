package rlqs

import (
	"math"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// envoyUnits are the Envoy time units an assignment is expressed in, longest
// first. Envoy's MONTH and YEAR are left out: their length is not defined
// the way a rule file's month (30 days) and year (365 days) are.
var envoyUnits = [...]struct {
	unit typev3.RateLimitUnit
	d    time.Duration
}{
	{typev3.RateLimitUnit_DAY, 24 * time.Hour},
	{typev3.RateLimitUnit_HOUR, time.Hour},
	{typev3.RateLimitUnit_MINUTE, time.Minute},
	{typev3.RateLimitUnit_SECOND, time.Second},
}

// unitFor expresses a rule's limit as a whole count per Envoy time unit: the
// longest of second, minute, hour and day not longer than the limit's window,
// and the limit's requests per unit scaled to it, rounded down (never more
// than the rule admits). A rule with several limits is assigned its most
// restrictive rate. So 100 per minute is 100 per MINUTE, 10 per 5 seconds
// is 2 per SECOND, and 700 per week 100 per DAY. A rate below one per day
// becomes 0, which assigns DENY_ALL.
func unitFor(r *config.Rule) (typev3.RateLimitUnit, uint64) {
	bestUnit, bestN, bestRate := typev3.RateLimitUnit_SECOND, uint64(0), math.Inf(1)
	for _, l := range r.Limits {
		if l.Window <= 0 {
			continue
		}
		rate := float64(l.RequestsPerUnit) / l.Window.Seconds()
		if rate >= bestRate {
			continue
		}
		u := envoyUnits[len(envoyUnits)-1]
		for _, c := range envoyUnits {
			if c.d <= l.Window {
				u = c
				break
			}
		}
		bestRate, bestUnit = rate, u.unit
		bestN = uint64(l.RequestsPerUnit) * uint64(u.d) / uint64(l.Window)
	}
	return bestUnit, bestN
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
	unit    typev3.RateLimitUnit
	limit   uint64 // L: requests per unit
	members map[uint64]*member
	// Sums over the members whose demand counts (reported within their
	// stale time): how many, their demand (requests per second) and
	// their targets (per unit).
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
	target   uint64        // its share, per unit, at its last report
	assigned uint64        // the assignment last sent, per unit, while in force
	until    time.Time     // when the client stops applying it (at the latest)
	// sent is the strategy last made for the member: reused, unchanged,
	// while the assignment stays the same (only the member's stream sends
	// it, one response at a time).
	sent *typev3.RateLimitStrategy
}

// strategy returns the strategy assigning a per unit.
func (m *member) strategy(a uint64, unit typev3.RateLimitUnit) *typev3.RateLimitStrategy {
	if rp := m.sent.GetRequestsPerTimeUnit(); rp == nil || rp.GetRequestsPerTimeUnit() != a || rp.GetTimeUnit() != unit {
		m.sent = requestsPer(a, unit)
	}
	return m.sent
}

// newPool returns an empty pool of limit limit per unit.
func newPool(unit typev3.RateLimitUnit, limit uint64) *pool {
	return &pool{unit: unit, limit: limit, members: make(map[uint64]*member)}
}

// join adds member id, with no demand yet, or with the demand carried
// from the pool it left (a reload moved its bucket).
func (p *pool) join(id uint64, carried *member) *member {
	m := &member{}
	if carried != nil {
		m.demand, m.observed = carried.demand, carried.observed
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
// Headroom times the member's own demand (but at least its floor).
// Streams and demand are this pool's, or at least gCount streams and
// gDemand requests per second when the streams of all replicas are
// counted (with a Budget: see budget.go).
func (p *pool) targetOf(m *member, pol policy, gCount, gDemand float64) uint64 {
	n := max(uint64(max(p.n, 1)), uint64(gCount))
	total := max(p.demand, gDemand)
	floorEach := uint64(pol.floor*float64(p.limit)) / n
	rest := p.limit - floorEach*n
	share := floorEach
	if total > 0 {
		share += uint64(math.Floor(float64(rest) * min(m.demand/total, 1)))
	} else {
		share += rest / n
	}
	if want := pol.headroom * m.demand * unitSeconds(p.unit); want < float64(share) {
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
func (p *pool) assign(m *member, budget, cap uint64, until time.Time) uint64 {
	others := p.assigned - m.assigned
	var free uint64
	if others < budget {
		free = budget - others
	}
	a := min(m.target, cap, free)
	p.assigned += a - m.assigned
	m.assigned, m.until = a, until
	return a
}

// unitSeconds is the length of an Envoy time unit in seconds.
func unitSeconds(u typev3.RateLimitUnit) float64 {
	for _, c := range envoyUnits {
		if c.unit == u {
			return c.d.Seconds()
		}
	}
	return 1
}
